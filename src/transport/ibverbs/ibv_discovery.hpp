// The host's RDMA devices, as libibverbs (loaded at run time) and sysfs describe them: for
// braid_info, the topology report, and later the verbs transport's choice of device, port
// and GID (issue 17). No verbs header here: core includes this; only ibv_lib.* include
// verbs.h, and a build without them still compiles this and says so.
//
// What comes from where (as NCCL's net_ib does it):
// - libibverbs: the device list, each port's state, link layer, active MTU and GID table;
// - sysfs, under a root that tests can replace with a fake tree:
//   <root>/class/infiniband/<dev>/device/numa_node            NUMA node (-1: none)
//   <root>/class/infiniband/<dev>/device -> ../../../devices/pci…  the PCI path (realpath)
//   <root>/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>     "RoCE v2" or "IB/RoCE v1"
//   (reading a GID type fails with EINVAL for unused entries, and in some containers: then
//   the type is unknown, never guessed).
#pragma once

#include <string>
#include <vector>

namespace braid::transport::ibverbs {

/// A GID's type, from sysfs. "IB/RoCE v1" in sysfs is ib on an InfiniBand port and roce_v1
/// on an Ethernet one.
enum class GidType { unknown, ib, roce_v1, roce_v2 };
/// "unknown", "IB", "RoCE v1", "RoCE v2".
const char* to_string(GidType type);

struct Gid {
  int index = 0;
  std::string text;  ///< IPv6 text form: "fe80::…", "::ffff:10.0.0.1" (IPv4-mapped, RoCE)
  GidType type = GidType::unknown;
};

struct Port {
  int number = 0;          ///< 1-based, as verbs numbers ports
  std::string state;       ///< "ACTIVE", "DOWN", "INIT", "ARMED", "ACTIVE_DEFER", "NOP"
  std::string link_layer;  ///< "InfiniBand" or "Ethernet" (RoCE)
  int active_mtu = 0;      ///< bytes (256 … 4096); 0 when unknown
  std::vector<Gid> gids;   ///< the non-zero entries of the GID table
  std::string error;       ///< set when the port could not be queried
};

struct Device {
  std::string name;      ///< "mlx5_0"
  std::string firmware;  ///< ibv_device_attr::fw_ver
  int numa_node = -1;    ///< -1: unknown or no affinity
  std::string pci_path;  ///< realpath of <root>/class/infiniband/<dev>/device; "" when unknown
  std::vector<Port> ports;
  std::string error;  ///< set when the device could not be opened or queried (ports then empty)
};

struct Discovery {
  bool loaded = false;  ///< libibverbs was loaded (or: why says why not)
  std::string library;  ///< the file loaded
  /// Why there is nothing to list: libibverbs not loaded (not built with verbs headers, or
  /// the loader's reason), or the device list failed (no RDMA in this kernel). Empty when the
  /// list was read, even if it is empty.
  std::string why;
  std::vector<Device> devices;
};

/// Loads `library` ("" = "libibverbs.so.1"; the caller passes BRAID_IBVERBS_LIBRARY) and
/// lists the devices, opening each to query its ports and GIDs; sysfs is read under
/// `sysfs_root`. Never throws; every failure is text in the result. Thread-safe.
Discovery discover(const std::string& library, const std::string& sysfs_root = "/sys");

/// One line: "none (libibverbs.so.1.14.44.0 loaded; no RDMA devices)",
/// "mlx5_0 port 1 ACTIVE Ethernet MTU 4096 (NUMA 0), mlx5_1 port 1 DOWN InfiniBand", or
/// "unknown: <why>".
std::string summary(const Discovery& d);

/// The detail, one line per device, port and GID (braid_info --topology); the first line
/// says which library was loaded, or why none.
std::vector<std::string> describe(const Discovery& d);

// --- sysfs readers (public for the tests) ---

/// <root>/class/infiniband/<device>/device/numa_node; -1 when unreadable or -1.
int read_numa_node(const std::string& sysfs_root, const std::string& device);
/// realpath of <root>/class/infiniband/<device>/device ("/sys/devices/pci0000:00/…/0000:3b:00.0");
/// "" when it does not resolve.
std::string read_pci_path(const std::string& sysfs_root, const std::string& device);
/// <root>/class/infiniband/<device>/ports/<port>/gid_attrs/types/<index>, read as a type
/// (`ethernet`: the port's link layer decides what "IB/RoCE v1" means); unknown when
/// unreadable or unrecognised.
GidType read_gid_type(const std::string& sysfs_root, const std::string& device, int port, int index, bool ethernet);

}  // namespace braid::transport::ibverbs
