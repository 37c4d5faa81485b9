// braid UCX transport: UCP's tag API over whatever UCX picks (tcp, shared memory, cma,
// RDMA), host memory only. See ucx_transport.cpp for the protocol.
#pragma once

#include "transport/transport.hpp"

#include <cstddef>
#include <memory>
#include <string>

namespace braid::transport {

/// Settings of one UCX transport instance (one per communicator).
struct UcxOptions : CommonOptions {
  /// What the UCX loader opens ("" = libucp.so.0); only the first load of a process counts.
  std::string library;
  /// Messages up to this size are sent eagerly (UCX's RNDV_THRESH; 0: UCX's choice). Set by
  /// the process's first ucx transport (one UCX context per process).
  std::size_t eager_limit = 65536;
  /// Zero-copy sends (BRAID_UCX_ZCOPY): "auto" turns them off where UCX has no RDMA
  /// transport (UCX 1.13's tcp fails with them on a cut link), "0" turns them off, "1"
  /// leaves them to UCX (UCX_ZCOPY_THRESH). Set by the process's first ucx transport.
  std::string zcopy = "auto";
  /// braid's interface choice (transport/interfaces.hpp), the only interface UCX's tcp
  /// transport is given (NET_DEVICES, with every RDMA device kept): BRAID_SOCKET_IFNAME,
  /// else the route to `master_addr`. Set by the process's first ucx transport.
  std::string ifname;
  std::string master_addr;
  /// UCX_NET_DEVICES is set: UCX's own choice stands, braid's is not applied.
  bool net_devices_given = false;
  /// The process's device memory is host memory (TransportContext::emulated_device_memory):
  /// device buffers are taken, as host memory. Otherwise they are taken only where the
  /// loaded UCX reports CUDA memory support, and sent as UCS_MEMORY_TYPE_CUDA.
  bool emulated_device_memory = false;
};

/// Loads UCX (Error(Unsupported) with the loader's reason when it cannot), creates this
/// communicator's UCP worker, watches its event fd in `poller` and publishes its address
/// under key "ucx" in `directory`. `poller` and `directory` must outlive the transport.
std::unique_ptr<Transport> make_ucx_transport(const UcxOptions& options, Poller& poller, PeerDirectory& directory);

}  // namespace braid::transport
