// NVLink between the GPUs of a host, as NVML reports it (issue 15, topology).
//
// NVML (libnvidia-ml.so.1, installed with the NVIDIA driver) is loaded at run time, as
// libucp and libibverbs are (base/dynlib): libbraid.so keeps no NEEDED entry on it, and a
// host without the driver gets the loader's reason instead of an error. For every GPU of
// the host (NVML sees them all, whatever CUDA_VISIBLE_DEVICES says) the report holds its
// PCI bus id and active NVLink links, and for every pair whether NVML's NVLink
// peer-to-peer status is OK (nvmlDeviceGetP2PStatus with the NVLink index: true for a
// direct bridge and through NVSwitch alike), which is what PyTorch and vLLM ask too.
//
// Only the handful of NVML types used here are declared (their layout is NVML's stable
// ABI; tests/support/fakenvml implements the same entry points for the tests).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace braid::gpu {

struct NvlinkGpu {
  std::string pci_bus_id;  ///< as sysfs writes it: "0000:1b:00.0"
  int active_links = 0;    ///< NVLink links in state active (0 without NVLink)
};

struct NvlinkReport {
  bool loaded = false;     ///< NVML was loaded and initialised; else `why` says why not
  std::string why;
  std::string library;     ///< the file NVML was loaded from
  std::vector<NvlinkGpu> gpus;
  /// Pairs (i < j, indexes into gpus) whose NVLink peer-to-peer status is OK.
  std::vector<std::pair<int, int>> nvlink_pairs;

  /// Whether the GPUs with these bus ids are joined by NVLink (false when either is unknown).
  bool nvlink_between(const std::string& a, const std::string& b) const;
};

/// Loads NVML from `library` and asks it. Never throws: a missing library, a missing entry
/// point or a failing call leaves loaded = false (or a GPU out) with the reason in `why`.
NvlinkReport query_nvlink(const std::string& library);

/// One line: "4 GPU(s), NVLink between every pair (libnvidia-ml.so.550.54.15)" or
/// "unavailable: <why>" (braid_info's nvml line).
std::string summarize_nvlink(const NvlinkReport& report);

/// Lines for braid_info --topology and describe_topology(), each starting with `indent`.
std::string describe_nvlink(const NvlinkReport& report, const std::string& indent);

}  // namespace braid::gpu
