// HCA, port and GID choice and the QP attributes of a reliable connection (ibv_config.hpp).
#include "transport/ibverbs/ibv_config.hpp"

#include "base/text.hpp"

#include <braid/error.hpp>

#include <arpa/inet.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>

namespace braid::transport::ibverbs {

namespace {

const char kHcaSyntax[] =
    "expected BRAID_IB_HCA=[^][=]device[:port][,device[:port]...], e.g. \"mlx5_0:1,mlx5_1\" or \"^mlx5_2\"";

std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

[[noreturn]] void bad_hca(const std::string& text, const std::string& what) {
  throw Error(ErrorCode::InvalidUsage, "BRAID_IB_HCA=\"" + text + "\": " + what + "; " + kHcaSyntax);
}

std::string port_name(const PortInfo& p) { return p.device + ":" + std::to_string(p.port); }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// An address range "a/n" as bytes: IPv4 ranges become IPv4-mapped IPv6 (::ffff:a.b.c.d,
/// prefix + 96), which is how a RoCE GID table holds IPv4 addresses.
struct Range {
  int family = 0;  ///< 0: no range
  std::array<std::uint8_t, 16> addr{};
  int prefix = 0;  ///< over the 128 bits
};

/// Parses `text` into *out; false with *why when it is not an address with a prefix length.
bool parse_range(const std::string& text, Range* out, std::string* why) {
  *out = Range{};
  const std::string t = trim(text);
  if (t.empty()) return true;
  const std::size_t slash = t.find('/');
  if (slash == std::string::npos) {
    *why = "BRAID_IB_ADDR_RANGE=\"" + text + "\": no prefix length (expected e.g. \"10.0.0.0/8\" or \"fd00::/8\")";
    return false;
  }
  const std::string addr = t.substr(0, slash), len = t.substr(slash + 1);
  Range r;
  int max = 0;
  in_addr v4{};
  if (::inet_pton(AF_INET, addr.c_str(), &v4) == 1) {
    r.family = AF_INET;
    r.addr[10] = r.addr[11] = 0xff;
    std::memcpy(r.addr.data() + 12, &v4, 4);
    max = 32;
  } else if (::inet_pton(AF_INET6, addr.c_str(), r.addr.data()) == 1) {
    r.family = AF_INET6;
    max = 128;
  } else {
    *why = "BRAID_IB_ADDR_RANGE=\"" + text + "\": \"" + addr + "\" is neither an IPv4 nor an IPv6 address";
    return false;
  }
  int n = -1;
  if (!len.empty() && len.size() <= 3 && std::all_of(len.begin(), len.end(), [](char c) { return c >= '0' && c <= '9'; }))
    n = std::stoi(len);
  if (n < 0 || n > max) {
    *why = "BRAID_IB_ADDR_RANGE=\"" + text + "\": prefix length \"" + len + "\" is not 0.." + std::to_string(max);
    return false;
  }
  r.prefix = r.family == AF_INET ? n + 96 : n;
  *out = r;
  return true;
}

bool in_range(const Range& r, const std::array<std::uint8_t, 16>& raw) {
  for (int bit = 0; bit < r.prefix; ++bit) {
    const int byte = bit / 8, mask = 0x80 >> (bit % 8);
    if ((raw[byte] & mask) != (r.addr[byte] & mask)) return false;
  }
  return true;
}

bool is_zero(const std::array<std::uint8_t, 16>& raw) {
  return std::all_of(raw.begin(), raw.end(), [](std::uint8_t b) { return b == 0; });
}
bool is_link_local(const std::array<std::uint8_t, 16>& raw) { return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80; }
bool is_v4_mapped(const std::array<std::uint8_t, 16>& raw) {
  for (int i = 0; i < 10; ++i)
    if (raw[i] != 0) return false;
  return raw[10] == 0xff && raw[11] == 0xff;
}

const char* family_name(int family) { return family == AF_INET ? "IPv4" : "IPv6"; }
const char* roce_name(int version) { return version == 1 ? "RoCE v1" : "RoCE v2"; }

std::string gid_line(const GidEntry& g) {
  return "GID " + std::to_string(g.index) + " " + gid_text(g.raw) + " " + to_string(g.type);
}

}  // namespace

HcaSpec parse_hca(const std::string& text) {
  HcaSpec spec;
  spec.text = text;
  std::string t = trim(text);
  if (t.empty()) return spec;
  if (t[0] == '^') {
    spec.exclude = true;
    t = trim(t.substr(1));
  }
  if (!t.empty() && t[0] == '=') {
    spec.exact = true;
    t = trim(t.substr(1));
  }
  if (t.empty()) bad_hca(text, "no device after the '^' or '='");
  std::size_t at = 0;
  while (at <= t.size()) {
    const std::size_t comma = std::min(t.find(',', at), t.size());
    const std::string entry = trim(t.substr(at, comma - at));
    at = comma + 1;
    if (entry.empty()) bad_hca(text, "an empty entry");
    HcaSpec::Entry e;
    const std::size_t colon = entry.find(':');
    e.device = trim(entry.substr(0, colon));
    if (e.device.empty()) bad_hca(text, "entry \"" + entry + "\" has no device name");
    if (colon != std::string::npos) {
      const std::string port = trim(entry.substr(colon + 1));
      const bool digits = !port.empty() && port.size() <= 3 &&
                          std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
      e.port = digits ? std::stoi(port) : 0;
      if (e.port < 1 || e.port > 255)
        bad_hca(text, "entry \"" + entry + "\": port \"" + port + "\" is not a number in 1..255");
    }
    spec.entries.push_back(e);
  }
  return spec;
}

bool hca_matches(const HcaSpec& spec, const std::string& device, int port) {
  if (spec.entries.empty()) return true;
  bool listed = false;
  for (const auto& e : spec.entries) {
    const bool name = spec.exact ? device == e.device : device.compare(0, e.device.size(), e.device) == 0;
    if (name && (e.port == 0 || e.port == port)) {
      listed = true;
      break;
    }
  }
  return spec.exclude ? !listed : listed;
}

int pci_shared_components(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    std::size_t at = 0;
    while (at <= s.size()) {
      const std::size_t slash = std::min(s.find('/', at), s.size());
      if (slash > at) parts.push_back(s.substr(at, slash - at));
      at = slash + 1;
    }
    return parts;
  };
  const auto pa = split(a), pb = split(b);
  int n = 0;
  while (static_cast<std::size_t>(n) < pa.size() && static_cast<std::size_t>(n) < pb.size() &&
         pa[static_cast<std::size_t>(n)] == pb[static_cast<std::size_t>(n)])
    ++n;
  return n;
}

PortChoice choose_port(const std::vector<PortInfo>& ports, const HcaSpec& spec, const std::string& gpu_pci_path) {
  PortChoice c;
  const std::string setting = "BRAID_IB_HCA=" + spec.text;
  if (ports.empty()) {
    c.reason = "no RDMA port on this host";
    return c;
  }
  std::string refused;
  int best_shared = -1;
  bool tie = false;
  for (std::size_t i = 0; i < ports.size(); ++i) {
    const PortInfo& p = ports[i];
    std::string why;
    if (!hca_matches(spec, p.device, p.port))
      why = (spec.exclude ? "excluded by " : "not listed in ") + setting;
    else if (!p.active)
      why = "not ACTIVE";
    if (!why.empty()) {
      if (!refused.empty()) refused += ", ";
      refused += port_name(p) + " " + why;
      continue;
    }
    // Without a GPU path every candidate shares 0 components: the first one stays.
    const int shared = gpu_pci_path.empty() ? 0 : pci_shared_components(p.pci_path, gpu_pci_path);
    if (shared > best_shared) {
      best_shared = shared;
      c.index = static_cast<int>(i);
      tie = false;
    } else if (shared == best_shared) {
      tie = true;
    }
  }
  if (c.index < 0) {
    c.reason = "no ACTIVE port: " + refused;
    return c;
  }
  const PortInfo& p = ports[static_cast<std::size_t>(c.index)];
  const std::string allows = spec.entries.empty() ? "" : " " + setting + " allows";
  if (gpu_pci_path.empty()) {
    c.reason = port_name(p) + " (first ACTIVE port" + allows + ")";
  } else if (best_shared == 0) {
    c.reason = port_name(p) + " (first ACTIVE port" + allows + "; none shares a PCI path with the GPU at " +
               gpu_pci_path + ")";
  } else {
    c.reason = port_name(p) + " (ACTIVE port nearest the GPU: " + std::to_string(best_shared) +
               " PCI path components shared with " + gpu_pci_path + (tie ? ", first of equals" : "") + ")";
  }
  return c;
}

GidPolicy parse_gid_policy(int forced_index, const std::string& family, const std::string& range, int roce_version) {
  GidPolicy p;
  if (forced_index < -1 || forced_index > 65535)
    throw Error(ErrorCode::InvalidUsage, "BRAID_IB_GID_INDEX=" + std::to_string(forced_index) +
                                             ": expected -1 (choose) or a GID table index 0..65535");
  p.forced_index = forced_index;
  const std::string f = lower(trim(family));
  if (f.empty() || f == "any")
    p.family = 0;
  else if (f == "af_inet")
    p.family = AF_INET;
  else if (f == "af_inet6")
    p.family = AF_INET6;
  else
    throw Error(ErrorCode::InvalidUsage, "BRAID_IB_ADDR_FAMILY=\"" + family + "\": expected AF_INET or AF_INET6");
  Range r;
  std::string why;
  if (!parse_range(range, &r, &why)) throw Error(ErrorCode::InvalidUsage, why);
  if (r.family != 0 && p.family != 0 && r.family != p.family)
    throw Error(ErrorCode::InvalidUsage, "BRAID_IB_ADDR_RANGE=\"" + range + "\" is " + family_name(r.family) +
                                             " but BRAID_IB_ADDR_FAMILY=" + family + ": no GID can match both");
  p.range = trim(range);
  if (roce_version != 1 && roce_version != 2)
    throw Error(ErrorCode::InvalidUsage,
                "BRAID_IB_ROCE_VERSION_NUM=" + std::to_string(roce_version) + ": expected 1 or 2");
  p.roce_version = roce_version;
  return p;
}

GidChoice choose_gid(const std::vector<GidEntry>& table, bool ethernet, const GidPolicy& policy) {
  GidChoice c;
  if (policy.forced_index >= 0) {
    for (const auto& g : table) {
      if (g.index == policy.forced_index) {
        c.index = g.index;
        c.reason = gid_line(g) + " (forced by BRAID_IB_GID_INDEX)";
        return c;
      }
    }
    c.reason = "BRAID_IB_GID_INDEX=" + std::to_string(policy.forced_index) + " is not in the port's GID table (";
    if (table.empty()) c.reason += "empty";
    for (std::size_t i = 0; i < table.size(); ++i)
      c.reason += (i ? ", " : "indices ") + std::to_string(table[i].index);
    c.reason += ")";
    return c;
  }
  if (!ethernet) {
    // InfiniBand routes by LID within a subnet: GID 0 (subnet prefix + port GUID) is the
    // port's own, and the RoCE settings mean nothing here.
    c.index = 0;
    c.reason = "GID 0 (InfiniBand: the port GID";
    for (const auto& g : table)
      if (g.index == 0) c.reason += " " + gid_text(g.raw);
    c.reason += ")";
    return c;
  }
  Range range;
  std::string why;
  if (!parse_range(policy.range, &range, &why)) {
    c.reason = "no usable GID: " + why;
    return c;
  }
  const int want_type = policy.roce_version == 1 ? static_cast<int>(GidType::roce_v1) : static_cast<int>(GidType::roce_v2);
  int best_rank = std::numeric_limits<int>::max();
  const GidEntry* best = nullptr;
  std::string skipped;
  for (const auto& g : table) {
    std::string skip;
    const int fam = is_v4_mapped(g.raw) ? AF_INET : AF_INET6;
    if (is_zero(g.raw))
      skip = "zero";
    else if (is_link_local(g.raw))
      skip = gid_text(g.raw) + " link-local";
    else if (policy.family != 0 && fam != policy.family)
      skip = gid_text(g.raw) + " " + family_name(fam) + ", not " + family_name(policy.family);
    else if (range.family != 0 && !in_range(range, g.raw))
      skip = gid_text(g.raw) + " outside BRAID_IB_ADDR_RANGE=" + policy.range;
    if (!skip.empty()) {
      if (!skipped.empty()) skipped += "; ";
      skipped += std::to_string(g.index) + " " + skip;
      continue;
    }
    // 0: the version asked for; 1: unknown type (could be it); 2: anything else.
    const int rank = static_cast<int>(g.type) == want_type ? 0 : g.type == GidType::unknown ? 1 : 2;
    if (rank < best_rank || (rank == best_rank && g.index < best->index)) {
      best_rank = rank;
      best = &g;
    }
  }
  if (best == nullptr) {
    c.reason = "no usable GID: " + (table.empty() ? std::string("the GID table is empty") : skipped);
    return c;
  }
  c.index = best->index;
  const int fam = is_v4_mapped(best->raw) ? AF_INET : AF_INET6;
  std::string pref = std::string(roce_name(policy.roce_version)) + " preferred";
  if (best_rank == 1) pref += ", no GID known to be " + std::string(roce_name(policy.roce_version));
  if (best_rank == 2) pref += ", none usable";
  c.reason = gid_line(*best) + " (" + family_name(fam) + ", " + pref + ")";
  return c;
}

std::string gid_text(const std::array<std::uint8_t, 16>& raw) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (is_v4_mapped(raw)) {
    ::inet_ntop(AF_INET, raw.data() + 12, buf, sizeof buf);
    return std::string("::ffff:") + buf;
  }
  ::inet_ntop(AF_INET6, raw.data(), buf, sizeof buf);
  return buf;
}

int init_attr(ibv_qp_attr* attr, std::uint8_t port, unsigned access_flags) {
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = IBV_QPS_INIT;
  attr->pkey_index = 0;
  attr->port_num = port;
  attr->qp_access_flags = access_flags;
  return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

int rtr_attr(ibv_qp_attr* attr, const PathEnds& p) {
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = IBV_QPS_RTR;
  attr->path_mtu = p.mtu;
  attr->dest_qp_num = p.remote_qpn & 0xffffffu;
  attr->rq_psn = p.remote_psn & 0xffffffu;
  attr->max_dest_rd_atomic = p.max_rd_atomic;
  attr->min_rnr_timer = p.min_rnr_timer;
  ibv_ah_attr& ah = attr->ah_attr;
  if (p.ethernet) {
    // RoCE has no LIDs: every packet carries a GRH, addressed by GID.
    ah.is_global = 1;
    std::memcpy(ah.grh.dgid.raw, p.remote_gid.data(), 16);
    ah.grh.sgid_index = static_cast<std::uint8_t>(p.sgid_index);
    ah.grh.hop_limit = 255;
    ah.grh.traffic_class = p.traffic_class;
    ah.grh.flow_label = 0;
    ah.dlid = 0;
  } else {
    ah.is_global = 0;
    ah.dlid = p.remote_lid;
  }
  ah.sl = p.service_level;
  ah.src_path_bits = 0;
  ah.port_num = p.port;
  return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER;
}

int rts_attr(ibv_qp_attr* attr, const PathEnds& p) {
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = IBV_QPS_RTS;
  attr->timeout = p.timeout;
  attr->retry_cnt = p.retry_cnt;
  attr->rnr_retry = p.rnr_retry;
  attr->sq_psn = p.local_psn & 0xffffffu;
  attr->max_rd_atomic = p.max_rd_atomic;
  return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
}

ibv_mtu mtu_from_bytes(int bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default: return static_cast<ibv_mtu>(0);
  }
}

int mtu_bytes(ibv_mtu m) {
  const int v = static_cast<int>(m);
  return v >= IBV_MTU_256 && v <= IBV_MTU_4096 ? 128 << v : 0;
}

ibv_mtu mtu_min(ibv_mtu a, ibv_mtu b) {
  if (mtu_bytes(a) == 0 || mtu_bytes(b) == 0) return static_cast<ibv_mtu>(0);
  return std::min(a, b);
}

std::string rtr_failure_hint(const PathEnds& p, int err) {
  std::string m = "ibv_modify_qp to RTR failed: " + base::errno_text(err) + " (port " + std::to_string(p.port) +
                  ", remote QP " + std::to_string(p.remote_qpn) + ", MTU " + std::to_string(mtu_bytes(p.mtu)) + "). ";
  if (p.ethernet) {
    m += "RoCE: local GID index " + std::to_string(p.sgid_index) + ", remote GID " + gid_text(p.remote_gid) +
         ", traffic class " + std::to_string(p.traffic_class) +
         ". The two ends' GIDs must be of the same RoCE version and reachable (same subnet or routed): "
         "compare both hosts' `show_gids`, then set BRAID_IB_GID_INDEX or BRAID_IB_ROCE_VERSION_NUM "
         "(and BRAID_IB_ADDR_FAMILY / BRAID_IB_ADDR_RANGE) to pick matching ones.";
  } else {
    m += "InfiniBand: remote LID " + std::to_string(p.remote_lid) + ", service level " +
         std::to_string(p.service_level) + ". ";
    if (p.remote_lid == 0) m += "LID 0 means the peer's port was never given a LID. ";
    m += "Check that a subnet manager runs on the fabric (`sminfo`; `ibstat` shows each port ACTIVE with a "
         "non-zero Base lid) and that both ports are in the same subnet and partition.";
  }
  return m;
}

}  // namespace braid::transport::ibverbs
