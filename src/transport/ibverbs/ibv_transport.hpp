// braid's native verbs transport: reliable-connected queue pairs over InfiniBand or RoCE,
// libibverbs loaded at run time. See ibv_transport.cpp for the protocol and
// docs/transport-ibverbs.md for what it does, how it is configured and what has run where
// (hardware-untested: proven against the test provider tests/support/fakeverbs).
#pragma once

#include "transport/transport.hpp"

#include <cstddef>
#include <memory>
#include <string>

namespace braid::gpu {
class Runtime;
}

namespace braid::transport {

/// Settings of one verbs transport instance (one per communicator); the BRAID_IB_* rows of
/// the registry entry (ibverbs/entry.cpp) fill them.
struct IbvOptions : CommonOptions {
  std::string library;              ///< BRAID_IBVERBS_LIBRARY ("" = libibverbs.so.1)
  std::string sysfs_root = "/sys";  ///< where GID types and PCI paths are read (tests use a fake tree)
  /// The rank's GPU ("0000:3b:00.0", "" for none): among the allowed ACTIVE ports, the one
  /// on the NIC nearest it (longest shared PCI path) is chosen.
  std::string gpu_pci_bus_id;
  std::string hca;                  ///< BRAID_IB_HCA, NCCL's syntax
  int gid_index = -1;               ///< BRAID_IB_GID_INDEX (-1: chosen)
  std::string addr_family;          ///< BRAID_IB_ADDR_FAMILY: "AF_INET", "AF_INET6" or ""
  std::string addr_range;           ///< BRAID_IB_ADDR_RANGE: "10.0.0.0/8" or ""
  int roce_version = 2;             ///< BRAID_IB_ROCE_VERSION_NUM
  int traffic_class = 0;            ///< BRAID_IB_TC
  int service_level = 0;            ///< BRAID_IB_SL
  int timeout = 18;                 ///< BRAID_IB_TIMEOUT: 4.096 µs * 2^timeout per retry
  int retry_cnt = 7;                ///< BRAID_IB_RETRY_CNT
  std::size_t qps_per_peer = 1;     ///< BRAID_IB_QPS_PER_PEER: RC QPs per peer (1..16), the same on every rank
  std::size_t slots = 16;           ///< BRAID_IB_SLOTS: receive slots per peer (>= 4, power of two)
  std::size_t slot_bytes = 65536;   ///< BRAID_IB_SLOT_BYTES: bytes per slot (power of two)
  /// BRAID_IB_RNDV_THRESHOLD: messages of at least this many bytes are written straight
  /// into the receiver's buffer (rendezvous) instead of through the slots.
  std::size_t rndv_threshold = 262144;
  /// BRAID_IB_REG_CACHE: keep the registrations of user buffers for reuse (faster; wrong if
  /// the program frees memory and gets the same addresses back for other pages).
  bool reg_cache = false;
  /// The communicator's device runtime and GPU (null and -1 without one): device buffers are
  /// registered with the NIC through it (GPUDirect RDMA).
  gpu::Runtime* gpu = nullptr;
  int gpu_device = -1;
  /// BRAID_GDR: -1 auto (GPUDirect RDMA when dma-buf or nvidia-peermem allows it), 0 off
  /// (device buffers staged through host memory by the engine), 1 required (creation fails
  /// naming what is missing).
  int gdr = -1;
};

/// Loads libibverbs (Error(Unsupported) with the loader's reason when it cannot), opens the
/// chosen device and port (Error(Unsupported) naming why none fits), makes this
/// communicator's completion queue and watches its channel and the device's async events in
/// `poller`. Connections are made on first use, through `directory`. Both must outlive the
/// transport.
std::unique_ptr<Transport> make_ibverbs_transport(const IbvOptions& options, Poller& poller,
                                                  PeerDirectory& directory);

}  // namespace braid::transport
