#include "transport/ibverbs/ibv_discovery.hpp"

#include <braid/config.hpp>

#include "base/text.hpp"
#if BRAID_HAVE_IBVERBS
#include "transport/ibverbs/ibv_lib.hpp"
#endif

#include <arpa/inet.h>
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace braid::transport::ibverbs {
namespace {

std::string device_dir(const std::string& root, const std::string& device) {
  return root + "/class/infiniband/" + device;
}

// The first line of a sysfs file without surrounding blanks; false when unreadable.
bool read_line(const std::string& path, std::string* out) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  const auto first = line.find_first_not_of(" \t\r\n");
  const auto last = line.find_last_not_of(" \t\r\n");
  *out = first == std::string::npos ? std::string() : line.substr(first, last - first + 1);
  return true;
}

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

#if BRAID_HAVE_IBVERBS
const char* port_state(int s) {
  switch (s) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "unknown";
  }
}

int mtu_bytes(int mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << mtu : 0; }

bool is_zero(const ibv_gid& g) {
  for (unsigned char b : g.raw)
    if (b != 0) return false;
  return true;
}

Port query_port(const Api& a, ibv_context* ctx, const std::string& root, const std::string& dev, int number) {
  Port p;
  p.number = number;
  ibv_port_attr attr{};
  if (const int rc = a.query_port(ctx, static_cast<std::uint8_t>(number), &attr); rc != 0) {
    p.error = "ibv_query_port: " + base::errno_text(rc > 0 ? rc : errno);
    return p;
  }
  p.state = port_state(attr.state);
  // IBV_LINK_LAYER_UNSPECIFIED is what old kernels report for InfiniBand.
  const bool ethernet = attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  p.link_layer = ethernet ? "Ethernet" : "InfiniBand";
  p.active_mtu = mtu_bytes(attr.active_mtu);
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (a.query_gid(ctx, static_cast<std::uint8_t>(number), i, &gid) != 0 || is_zero(gid)) continue;
    char text[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET6, gid.raw, text, sizeof text);
    p.gids.push_back({i, text, read_gid_type(root, dev, number, i, ethernet)});
  }
  return p;
}

void list_devices(const Api& a, const std::string& root, Discovery* d) {
  int n = 0;
  errno = 0;
  ibv_device** list = a.get_device_list(&n);
  if (list == nullptr) {
    const int err = errno;
    d->why = "ibv_get_device_list: " + base::errno_text(err);
    struct stat st {};
    // rdma-core answers ENOSYS when it cannot read the kernel's uverbs ABI version.
    if (err == ENOSYS && ::stat((root + "/class/infiniband_verbs").c_str(), &st) != 0)
      d->why = "this kernel offers no RDMA (no " + root + "/class/infiniband_verbs; " + d->why + ")";
    return;
  }
  for (int i = 0; i < n && list[i] != nullptr; ++i) {
    Device dev;
    const char* name = a.get_device_name(list[i]);
    dev.name = name ? name : "?";
    dev.numa_node = read_numa_node(root, dev.name);
    dev.pci_path = read_pci_path(root, dev.name);
    errno = 0;
    ibv_context* ctx = a.open_device(list[i]);
    if (ctx == nullptr) {
      dev.error = "ibv_open_device: " + base::errno_text(errno) + " (permissions on /dev/infiniband?)";
      d->devices.push_back(std::move(dev));
      continue;
    }
    ibv_device_attr attr{};
    if (const int rc = a.query_device(ctx, &attr); rc != 0) {
      dev.error = "ibv_query_device: " + base::errno_text(rc > 0 ? rc : errno);
    } else {
      dev.firmware = attr.fw_ver;
      for (int p = 1; p <= attr.phys_port_cnt; ++p) dev.ports.push_back(query_port(a, ctx, root, dev.name, p));
    }
    a.close_device(ctx);
    d->devices.push_back(std::move(dev));
  }
  a.free_device_list(list);
}
#endif

}  // namespace

const char* to_string(GidType type) {
  switch (type) {
    case GidType::ib: return "IB";
    case GidType::roce_v1: return "RoCE v1";
    case GidType::roce_v2: return "RoCE v2";
    case GidType::unknown: break;
  }
  return "unknown";
}

int read_numa_node(const std::string& sysfs_root, const std::string& device) {
  std::string text;
  std::int64_t v = -1;
  if (!read_line(device_dir(sysfs_root, device) + "/device/numa_node", &text) || !base::parse_int64(text, &v) ||
      v < 0 || v > INT_MAX)
    return -1;
  return static_cast<int>(v);
}

std::string read_pci_path(const std::string& sysfs_root, const std::string& device) {
  char buf[PATH_MAX];
  if (::realpath((device_dir(sysfs_root, device) + "/device").c_str(), buf) == nullptr) return {};
  return buf;
}

GidType read_gid_type(const std::string& sysfs_root, const std::string& device, int port, int index,
                      bool ethernet) {
  std::string text;
  const std::string path = device_dir(sysfs_root, device) + "/ports/" + std::to_string(port) +
                           "/gid_attrs/types/" + std::to_string(index);
  if (!read_line(path, &text)) return GidType::unknown;
  if (text == "RoCE v2") return GidType::roce_v2;
  if (text == "IB/RoCE v1") return ethernet ? GidType::roce_v1 : GidType::ib;
  return GidType::unknown;
}

Discovery discover(const std::string& library, const std::string& sysfs_root) {
  Discovery d;
#if BRAID_HAVE_IBVERBS
  const Api* a = load(library, &d.why);
  if (a == nullptr) return d;
  d.loaded = true;
  d.library = a->file;
  list_devices(*a, sysfs_root, &d);
#else
  (void)library;
  (void)sysfs_root;
  d.why = "not built with verbs headers (configure with libibverbs-dev installed; BRAID_WITH_IBVERBS)";
#endif
  return d;
}

std::string summary(const Discovery& d) {
  if (!d.loaded) return "unknown: " + d.why;
  const std::string lib = basename_of(d.library) + " loaded";
  if (!d.why.empty()) return "none (" + lib + "; " + d.why + ")";
  if (d.devices.empty()) return "none (" + lib + "; no RDMA devices)";
  std::ostringstream os;
  for (std::size_t i = 0; i < d.devices.size(); ++i) {
    const Device& dev = d.devices[i];
    os << (i ? ", " : "") << dev.name;
    if (!dev.error.empty()) os << " (" << dev.error << ")";
    for (const Port& p : dev.ports) {
      os << " port " << p.number;
      if (!p.error.empty())
        os << " (" << p.error << ")";
      else
        os << " " << p.state << " " << p.link_layer << (p.active_mtu ? " MTU " + std::to_string(p.active_mtu) : "");
    }
    if (dev.numa_node >= 0) os << " (NUMA " << dev.numa_node << ")";
  }
  return os.str();
}

std::vector<std::string> describe(const Discovery& d) {
  std::vector<std::string> out;
  if (!d.loaded) {
    out.push_back("unknown: " + d.why);
    return out;
  }
  out.push_back("libibverbs: " + d.library);
  if (!d.why.empty()) {
    out.push_back("none: " + d.why);
    return out;
  }
  if (d.devices.empty()) out.push_back("none: no RDMA devices");
  for (const Device& dev : d.devices) {
    std::ostringstream os;
    os << dev.name << ":";
    if (!dev.firmware.empty()) os << " firmware " << dev.firmware << ",";
    os << " NUMA node " << (dev.numa_node >= 0 ? std::to_string(dev.numa_node) : "unknown") << ", PCI "
       << (dev.pci_path.empty() ? "unknown" : dev.pci_path);
    if (!dev.error.empty()) os << "; " << dev.error;
    out.push_back(os.str());
    for (const Port& p : dev.ports) {
      std::ostringstream ps;
      ps << "  port " << p.number << ": ";
      if (!p.error.empty()) {
        ps << p.error;
      } else {
        ps << p.state << ", " << p.link_layer << ", active MTU "
           << (p.active_mtu ? std::to_string(p.active_mtu) : "unknown") << ", " << p.gids.size() << " GID"
           << (p.gids.size() == 1 ? "" : "s");
      }
      out.push_back(ps.str());
      for (const Gid& g : p.gids)
        out.push_back("    GID " + std::to_string(g.index) + ": " + g.text + " (" + to_string(g.type) + ")");
    }
  }
  return out;
}

}  // namespace braid::transport::ibverbs
