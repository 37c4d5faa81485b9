// What the UCX installed here offers (braid_info, and the router once the ucx transport
// exists), without UCX's headers: core includes this, only ucx_lib.cpp includes UCX.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace braid::transport::ucx {

/// What the loaded UCX offers this process, for braid_info and the router.
struct Status {
  bool available = false;
  std::string why;      ///< when not available
  std::string path;     ///< the library opened
  std::string version;  ///< "1.13.1"
  /// Transport resources as UCX names them ("tcp/lo", "posix/memory", "rc_mlx5/mlx5_0:1").
  std::vector<std::string> resources;
  std::uint64_t memory_types = 0;  ///< bit (1 << ucs_memory_type_t); bit 0: host
  bool rdma = false;               ///< an rc, dc or ud resource (InfiniBand or RoCE)
  bool cuda = false;               ///< CUDA memory among memory_types
};

/// Loads UCX and opens a throw-away context to list its resources (honours UCX_TLS and
/// UCX_NET_DEVICES, as the transport will). Never throws.
Status probe(const std::string& library);

/// One line: "1.13.1 (libucp.so.0): self, tcp (lo, eth0), sysv, posix, cma; memory host;
/// RDMA none", or "unavailable: <why>".
std::string describe(const Status& status);

/// UCX's NET_DEVICES value that leaves UCX's tcp transport only the interface `chosen` and
/// keeps every RDMA device, from the resources a context took ("tcp/eth0",
/// "rc_mlx5/mlx5_0:1"): "lo,mlx5_0:1". "" when nothing is to change: no tcp resource,
/// `chosen` not among them, or the only one.
std::string net_devices_for(const std::vector<std::string>& resources, const std::string& chosen);

/// True for UCX transport names that move data by RDMA (rc_verbs, rc_mlx5, dc_mlx5,
/// ud_verbs, ud_mlx5, ...).
bool is_rdma_transport(const std::string& tl);

}  // namespace braid::transport::ucx
