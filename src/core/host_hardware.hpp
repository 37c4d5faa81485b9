// What a host's hardware looks like from sysfs: its network interfaces with their PCI
// address and NUMA node, and how far apart two PCI devices are (a GPU and a NIC), in
// NCCL's terms (topo.h's PATH_PIX .. PATH_SYS). Read once per call; nothing is cached.
// describe_topology() and braid_info --topology print it; the transports that drive NICs
// from GPUs (ibverbs, later issues) will use the distances to pick a GPU's NIC.
//
// Every function takes the sysfs root, so that tests can build a fake tree.
#pragma once

#include <string>
#include <vector>

namespace braid::core {

/// A network interface of this host.
struct Nic {
  std::string name;          ///< "eth0", "ibp26s0"
  std::string pci;           ///< its PCI address ("0000:1a:00.0"); "" for a virtual one (veth, lo, bridges)
  int numa_node = -1;        ///< -1: unknown (no PCI device, or one NUMA node)
  long speed_mbps = -1;      ///< link speed in Mb/s; -1: unknown (down, or virtual)
  std::string state;         ///< operstate: "up", "down", "unknown"
  std::vector<std::string> rdma;  ///< RDMA devices on the same PCI function ("mlx5_0")
};

/// The host's network interfaces, sorted by name, loopback left out.
std::vector<Nic> host_nics(const std::string& sysfs = "/sys");

/// How two PCI devices are joined, nearest first (NCCL's path types).
enum class PciDistance {
  same,         ///< one device
  pix,          ///< through one PCIe switch (both below the same bridge)
  pxb,          ///< through several PCIe bridges, not the CPU's host bridge
  phb,          ///< through the CPU's PCIe host bridge (one NUMA node)
  sys,          ///< across the link between NUMA nodes (sockets)
  unknown,      ///< a device not in sysfs
};
const char* to_string(PciDistance d) noexcept;

/// The NUMA node of a PCI device (-1: unknown).
int pci_numa_node(const std::string& address, const std::string& sysfs = "/sys");
/// How the PCI devices `a` and `b` ("0000:1b:00.0") are joined.
PciDistance pci_distance(const std::string& a, const std::string& b, const std::string& sysfs = "/sys");

/// A PCI bus id as sysfs writes it: lower case, a 4-digit domain ("00000000:1B:00.0" ->
/// "0000:1b:00.0"; CUDA and nvidia-smi write 8 digits).
std::string normalize_pci_address(const std::string& address);

/// Lines for describe_topology(): the NICs, and for `gpu_pci` (when not empty) each NIC's
/// distance from that GPU. Each line is indented by `indent`.
std::string describe_host_hardware(const std::string& gpu_pci, const std::string& indent,
                                   const std::string& sysfs = "/sys");

}  // namespace braid::core
