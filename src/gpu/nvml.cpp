// NVLink as NVML reports it (see nvml.hpp).
#include "gpu/nvml.hpp"

#include "gpu/runtime.hpp"

#include "base/dynlib.hpp"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>

namespace braid::gpu {

namespace {

// NVML's ABI, as nvml.h declares it (only what is used here).
using nvmlReturn_t = int;
constexpr nvmlReturn_t kSuccess = 0;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // "00000000:1B:00.0"
};
static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t layout");
using nvmlEnableState_t = int;  // NVML_FEATURE_ENABLED = 1
constexpr int kMaxLinks = 18;   // NVML_NVLINK_MAX_LINKS
constexpr int kCapsNvlink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kP2pOk = 0;       // NVML_P2P_STATUS_OK

struct Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*count)(unsigned int*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*pci_info)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*link_state)(nvmlDevice_t, unsigned int, nvmlEnableState_t*) = nullptr;
  nvmlReturn_t (*p2p_status)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;
  std::string file;
};

std::string text(const Api& a, const char* call, nvmlReturn_t r) {
  const char* s = a.error_string ? a.error_string(r) : nullptr;
  return std::string(call) + ": " + (s ? s : "error") + " (" + std::to_string(r) + ")";
}

}  // namespace

bool NvlinkReport::nvlink_between(const std::string& a, const std::string& b) const {
  const auto index = [&](const std::string& id) {
    for (std::size_t i = 0; i < gpus.size(); ++i)
      if (gpus[i].pci_bus_id == id) return static_cast<int>(i);
    return -1;
  };
  int i = index(a), j = index(b);
  if (i < 0 || j < 0 || i == j) return false;
  if (i > j) std::swap(i, j);
  return std::find(nvlink_pairs.begin(), nvlink_pairs.end(), std::make_pair(i, j)) != nvlink_pairs.end();
}

NvlinkReport query_nvlink(const std::string& library) {
  NvlinkReport r;
  void* h = base::open_library(library, "NVML comes with the NVIDIA driver; BRAID_NVML_LIBRARY names another copy",
                               &r.why);
  if (h == nullptr) return r;
  Api a;
  std::string missing;
  base::resolve(h, "nvmlInit_v2", &a.init, &missing);
  base::resolve(h, "nvmlShutdown", &a.shutdown, &missing);
  base::resolve(h, "nvmlErrorString", &a.error_string, &missing);
  base::resolve(h, "nvmlDeviceGetCount_v2", &a.count, &missing);
  base::resolve(h, "nvmlDeviceGetHandleByIndex_v2", &a.by_index, &missing);
  base::resolve(h, "nvmlDeviceGetNvLinkState", &a.link_state, &missing);
  base::resolve(h, "nvmlDeviceGetP2PStatus", &a.p2p_status, &missing);
  // _v3 since driver 410; the older _v2 fills the same structure.
  std::string no_v3;
  base::resolve(h, "nvmlDeviceGetPciInfo_v3", &a.pci_info, &no_v3);
  if (a.pci_info == nullptr) base::resolve(h, "nvmlDeviceGetPciInfo_v2", &a.pci_info, &missing);
  a.file = base::library_file(h, library);
  r.library = a.file;
  if (!missing.empty()) {
    r.why = a.file + " has no " + missing + " (not NVML, or older than driver 410)";
    return r;
  }
  // NVML keeps a reference count: init and shutdown pair up, so other users in the
  // process (PyTorch, pynvml) are not disturbed.
  nvmlReturn_t st = a.init();
  if (st != kSuccess) {
    r.why = text(a, "nvmlInit_v2", st);
    return r;
  }
  unsigned int n = 0;
  st = a.count(&n);
  if (st != kSuccess) {
    r.why = text(a, "nvmlDeviceGetCount_v2", st);
    a.shutdown();
    return r;
  }
  std::vector<nvmlDevice_t> handles;
  std::ostringstream problems;
  for (unsigned int i = 0; i < n; ++i) {
    nvmlDevice_t d = nullptr;
    nvmlPciInfo_t pci{};
    st = a.by_index(i, &d);
    if (st == kSuccess) st = a.pci_info(d, &pci);
    if (st != kSuccess) {
      // A GPU NVML cannot open (no permission, fallen off the bus): leave it out, say so.
      problems << (problems.tellp() > 0 ? "; " : "") << "GPU index " << i << ": " << text(a, "NVML", st);
      continue;
    }
    pci.busId[sizeof pci.busId - 1] = '\0';
    NvlinkGpu g;
    g.pci_bus_id = sysfs_pci_address(pci.busId);
    for (unsigned int l = 0; l < kMaxLinks; ++l) {
      nvmlEnableState_t on = 0;
      // Links past the GPU's last answer NVML_ERROR_INVALID_ARGUMENT or NOT_SUPPORTED.
      if (a.link_state(d, l, &on) == kSuccess && on == 1) ++g.active_links;
    }
    r.gpus.push_back(g);
    handles.push_back(d);
  }
  for (std::size_t i = 0; i < handles.size(); ++i)
    for (std::size_t j = i + 1; j < handles.size(); ++j) {
      int status = -1;
      if (a.p2p_status(handles[i], handles[j], kCapsNvlink, &status) == kSuccess && status == kP2pOk)
        r.nvlink_pairs.emplace_back(static_cast<int>(i), static_cast<int>(j));
    }
  a.shutdown();
  r.loaded = true;
  r.why = problems.str();
  return r;
}

std::string summarize_nvlink(const NvlinkReport& r) {
  if (!r.loaded) return "unavailable: " + r.why;
  std::ostringstream os;
  const std::size_t all = r.gpus.size() < 2 ? 0 : r.gpus.size() * (r.gpus.size() - 1) / 2;
  os << r.gpus.size() << " GPU(s), NVLink between ";
  if (all == 0 || r.nvlink_pairs.empty())
    os << "no pair";
  else if (r.nvlink_pairs.size() == all)
    os << "every pair";
  else
    os << r.nvlink_pairs.size() << " of " << all << " pairs";
  os << " (" << r.library << ")";
  return os.str();
}

std::string describe_nvlink(const NvlinkReport& r, const std::string& indent) {
  std::ostringstream os;
  if (!r.loaded) {
    os << indent << "NVLink: unknown (NVML: " << r.why << ")\n";
    return os.str();
  }
  os << indent << "NVLink (NVML " << r.library << "): " << r.gpus.size() << " GPU(s)";
  if (!r.why.empty()) os << "; left out: " << r.why;
  os << "\n";
  for (const auto& g : r.gpus)
    os << indent << "  GPU " << g.pci_bus_id << ": " << g.active_links << " NVLink link(s) active\n";
  if (r.gpus.size() > 1) {
    const std::size_t all = r.gpus.size() * (r.gpus.size() - 1) / 2;
    os << indent << "  joined by NVLink: ";
    if (r.nvlink_pairs.empty()) {
      os << "no pair (PCIe only)";
    } else if (r.nvlink_pairs.size() == all) {
      os << "every pair";
    } else {
      for (std::size_t k = 0; k < r.nvlink_pairs.size(); ++k)
        os << (k ? " " : "") << r.gpus[static_cast<std::size_t>(r.nvlink_pairs[k].first)].pci_bus_id << "<->"
           << r.gpus[static_cast<std::size_t>(r.nvlink_pairs[k].second)].pci_bus_id;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace braid::gpu
