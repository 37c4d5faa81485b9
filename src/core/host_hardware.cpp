// A host's NICs and PCI distances from sysfs (see host_hardware.hpp).
#include "core/host_hardware.hpp"

#include "gpu/runtime.hpp"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

namespace braid::core {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(path.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

// "0000:1b:00.0": domain, bus, device, function in hex.
bool is_pci_address(const std::string& s) {
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (std::size_t i : {0u, 1u, 2u, 3u, 5u, 6u, 8u, 9u, 11u})
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> out;
  std::stringstream ss(p);
  std::string part;
  while (std::getline(ss, part, '/'))
    if (!part.empty()) out.push_back(part);
  return out;
}

// The chain from the host bridge down to the device: {"pci0000:00", "0000:00:01.0",
// "0000:01:00.0"}; empty when sysfs does not know the device.
std::vector<std::string> pci_chain(const std::string& address, const std::string& sysfs) {
  const std::string dev = real_path(sysfs + "/bus/pci/devices/" + address);
  const std::string root = real_path(sysfs + "/devices");
  if (dev.empty() || root.empty() || dev.compare(0, root.size() + 1, root + "/") != 0) return {};
  auto parts = split_path(dev.substr(root.size() + 1));
  if (parts.empty() || parts.front().rfind("pci", 0) != 0) return {};
  return parts;
}

}  // namespace

const char* to_string(PciDistance d) noexcept {
  switch (d) {
    case PciDistance::same: return "same device";
    case PciDistance::pix: return "PIX (one PCIe switch)";
    case PciDistance::pxb: return "PXB (several PCIe bridges)";
    case PciDistance::phb: return "PHB (through the CPU's host bridge)";
    case PciDistance::sys: return "SYS (across NUMA nodes)";
    case PciDistance::unknown: return "unknown";
  }
  return "unknown";
}

std::string normalize_pci_address(const std::string& address) { return gpu::sysfs_pci_address(address); }

int pci_numa_node(const std::string& address, const std::string& sysfs) {
  const std::string v = read_line(sysfs + "/bus/pci/devices/" + address + "/numa_node");
  try {
    return v.empty() ? -1 : std::max(-1, std::stoi(v));
  } catch (const std::exception&) {
    return -1;
  }
}

PciDistance pci_distance(const std::string& a0, const std::string& b0, const std::string& sysfs) {
  const std::string a = normalize_pci_address(a0), b = normalize_pci_address(b0);
  if (a == b) return PciDistance::same;
  const auto ca = pci_chain(a, sysfs), cb = pci_chain(b, sysfs);
  if (ca.empty() || cb.empty()) return PciDistance::unknown;
  if (ca.front() != cb.front()) {
    // Different host bridges: across the CPUs when their NUMA nodes differ.
    const int na = pci_numa_node(a, sysfs), nb = pci_numa_node(b, sysfs);
    return na >= 0 && nb >= 0 && na != nb ? PciDistance::sys : PciDistance::phb;
  }
  std::size_t k = 1;  // common prefix, the host bridge included
  while (k < ca.size() && k < cb.size() && ca[k] == cb[k]) ++k;
  if (k == 1) return PciDistance::phb;  // they meet at the host bridge
  // Below their nearest common bridge, each is one level down (a bridge's children) or
  // two (a switch: upstream port, downstream port, device): one switch.
  const std::size_t da = ca.size() - k, db = cb.size() - k;
  return da <= 2 && db <= 2 ? PciDistance::pix : PciDistance::pxb;
}

std::vector<Nic> host_nics(const std::string& sysfs) {
  std::vector<Nic> out;
  const std::string net = sysfs + "/class/net/";
  for (const std::string& name : list_dir(net)) {
    if (name == "lo") continue;
    Nic n;
    n.name = name;
    n.state = read_line(net + name + "/operstate");
    const std::string speed = read_line(net + name + "/speed");
    try {
      if (!speed.empty()) n.speed_mbps = std::max(-1L, std::stol(speed));
    } catch (const std::exception&) {
    }
    // The PCI function behind it: the nearest PCI address on the device's path (a virtio
    // NIC's device is "virtio0" below its PCI function).
    const std::string dev = real_path(net + name + "/device");
    if (!dev.empty()) {
      auto parts = split_path(dev);
      for (auto it = parts.rbegin(); it != parts.rend(); ++it)
        if (is_pci_address(*it)) {
          n.pci = *it;
          break;
        }
      n.rdma = list_dir(net + name + "/device/infiniband");
    }
    if (!n.pci.empty()) n.numa_node = pci_numa_node(n.pci, sysfs);
    out.push_back(std::move(n));
  }
  return out;
}

std::string describe_host_hardware(const std::string& gpu_pci, const std::string& indent, const std::string& sysfs) {
  std::ostringstream os;
  const auto nics = host_nics(sysfs);
  if (nics.empty()) os << indent << "NICs: none besides loopback\n";
  for (const Nic& n : nics) {
    os << indent << "NIC " << n.name << ": ";
    if (n.pci.empty()) {
      os << "virtual";
    } else {
      os << "PCI " << n.pci;
      if (n.numa_node >= 0) os << ", NUMA node " << n.numa_node;
    }
    if (n.speed_mbps > 0) os << ", " << n.speed_mbps << " Mb/s";
    os << ", " << (n.state.empty() ? "state unknown" : n.state);
    if (!n.rdma.empty()) {
      os << ", RDMA";
      for (const auto& r : n.rdma) os << " " << r;
    }
    if (!gpu_pci.empty() && !n.pci.empty()) os << "; from GPU " << gpu_pci << ": " << to_string(pci_distance(gpu_pci, n.pci, sysfs));
    os << "\n";
  }
  return os.str();
}

}  // namespace braid::core
