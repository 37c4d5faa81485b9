// The verbs transport's choices that need no hardware, kept apart so that tests can drive
// them with synthetic tables: which HCA port (BRAID_IB_HCA, NCCL's NCCL_IB_HCA syntax, and
// the NIC nearest the GPU), which GID on a RoCE port (NCCL's ncclIbGetGidIndex rules), and
// the ibv_qp_attr / attr_mask of each step of a reliable connection (RESET -> INIT -> RTR ->
// RTS), with the hint a failed RTR step deserves (a wrong GID or a missing subnet manager
// are what makes RTR fail, and the verbs error says neither).
//
// Pure functions: no verbs call, no environment read (the caller passes the settings);
// thread-safe. Only the types come from verbs.h.
#pragma once

#include "transport/ibverbs/ibv_discovery.hpp"

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace braid::transport::ibverbs {

/// BRAID_IB_HCA in NCCL's syntax (NCCL_IB_HCA): comma-separated "device[:port]" entries,
/// a leading '^' excludes the listed ones instead, a leading '=' asks for exact names
/// (otherwise an entry is a prefix match: "mlx5" matches mlx5_0, mlx5_1...). Empty = all.
struct HcaSpec {
  bool exclude = false;
  bool exact = false;
  struct Entry {
    std::string device;
    int port = 0;  ///< 0 = any port
  };
  std::vector<Entry> entries;
  std::string text;  ///< what was parsed, as given, for the reasons of choose_port
};

/// Parses BRAID_IB_HCA ("mlx5_0:1,mlx5_1", "^mlx5_2", "=mlx5_0", "^=mlx5_0:2"; spaces around
/// entries are ignored). Throws braid::Error (InvalidUsage) naming the bad entry and the
/// expected syntax: an empty entry, an empty device name, a port that is not 1..255, a
/// lone '^' or '='.
HcaSpec parse_hca(const std::string& text);

/// True when `spec` allows port `port` of `device`: an empty spec allows everything; an
/// entry matches when its device is the name (exact) or a prefix of it, and its port is 0
/// or `port`; '^' inverts.
bool hca_matches(const HcaSpec& spec, const std::string& device, int port);

struct PortInfo {
  std::string device;
  int port = 1;
  bool active = false;
  bool ethernet = false;
  std::string pci_path;  ///< as ibv_discovery's read_pci_path gives it; "" when unknown
  int numa_node = -1;
  int active_mtu = 0;  ///< bytes
};

struct PortChoice {
  int index = -1;  ///< into the vector, -1 = none
  std::string reason;
};

/// The port braid uses: among the ports the spec allows, the ACTIVE ones; when gpu_pci_path
/// is given, the one whose pci_path shares the longest prefix of PCI path components with it
/// (the NIC nearest the GPU: same switch beats same root complex beats another socket; ties
/// go to the first), else the first. reason says why in one line for an INFO log
/// ("mlx5_0:1 (first ACTIVE port BRAID_IB_HCA allows)"), or, when none, why
/// ("no ACTIVE port: mlx5_0:1 not ACTIVE, mlx5_1:1 excluded by BRAID_IB_HCA=^mlx5_1").
PortChoice choose_port(const std::vector<PortInfo>& ports, const HcaSpec& spec,
                       const std::string& gpu_pci_path = "");

/// How many leading '/'-separated components two PCI paths share (empty components, from
/// a leading or doubled '/', do not count); 0 when either is empty.
int pci_shared_components(const std::string& a, const std::string& b);

struct GidEntry {
  int index = 0;
  std::array<std::uint8_t, 16> raw{};
  GidType type = GidType::unknown;
};

struct GidPolicy {
  int forced_index = -1;  ///< BRAID_IB_GID_INDEX (-1: choose)
  int family = 0;         ///< BRAID_IB_ADDR_FAMILY: AF_INET, AF_INET6, 0 = any
  std::string range;      ///< BRAID_IB_ADDR_RANGE: "10.0.0.0/8" or "fd00::/8"; "" = any
  int roce_version = 2;   ///< BRAID_IB_ROCE_VERSION_NUM: 1 or 2
};

/// Parses the settings' strings; throws braid::Error (InvalidUsage) with what is wrong.
/// family: "" (any), "AF_INET" or "AF_INET6" (case-insensitive). range: "" or an address
/// with a prefix length ("10.0.0.0/8", "fd00::/8"; host bits are ignored); its family must
/// agree with `family` when both are given. forced_index: -1, or 0..65535. roce_version: 1 or 2.
GidPolicy parse_gid_policy(int forced_index, const std::string& family, const std::string& range, int roce_version);

struct GidChoice {
  int index = -1;
  std::string reason;
};

/// GID selection as NCCL does for RoCE (net_ib ncclIbGetGidIndex): on InfiniBand (ethernet
/// false) index 0 unless forced, whatever the family, range and version say. On Ethernet:
/// skip zero GIDs and link-local fe80::/10; keep the address family and range of the policy
/// (IPv4-mapped ::ffff:a.b.c.d counts as AF_INET); prefer the policy's RoCE version (a type
/// read as unknown is acceptable but loses to a known match; the other version is the last
/// resort); among equals the lowest index. forced_index wins if it exists in the table (else
/// index -1 and a reason). A policy whose range does not parse chooses nothing, with the
/// reason. reason: one line ("GID 3 ::ffff:10.0.0.2 RoCE v2 (IPv4, RoCE v2 preferred)" /
/// "no usable GID: 0 fe80::… link-local; 1 zero ...").
GidChoice choose_gid(const std::vector<GidEntry>& table, bool ethernet, const GidPolicy& policy);

/// IPv6 text; IPv4-mapped as ::ffff:a.b.c.d.
std::string gid_text(const std::array<std::uint8_t, 16>& raw);

/// The two ends of a reliable connection (RC QP) as the attribute builders need them.
struct PathEnds {
  bool ethernet = false;  ///< RoCE: GRH required, dgid/sgid_index used, dlid 0
  std::uint8_t port = 1;
  int sgid_index = 0;  ///< local GID index (RoCE)
  std::uint16_t remote_lid = 0;
  std::array<std::uint8_t, 16> remote_gid{};
  std::uint32_t remote_qpn = 0, remote_psn = 0, local_psn = 0;
  ibv_mtu mtu = IBV_MTU_1024;      ///< already the min of both ends' active MTU
  std::uint8_t traffic_class = 0;  ///< BRAID_IB_TC
  std::uint8_t service_level = 0;  ///< BRAID_IB_SL
  std::uint8_t timeout = 18, retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 12;
  std::uint8_t max_rd_atomic = 1;
};

/// Each fills *attr (zeroed first) and returns the attr_mask a real HCA requires for the
/// transition: RESET->INIT (state, pkey_index 0, port, access flags), INIT->RTR (state, AV
/// with GRH on Ethernet [is_global=1, dgid, sgid_index, hop_limit 255, traffic_class], dlid
/// on InfiniBand, sl and port on both as NCCL sets them, path_mtu, dest_qp_num, rq_psn,
/// max_dest_rd_atomic, min_rnr_timer), RTR->RTS (state, timeout, retry_cnt, rnr_retry,
/// sq_psn, max_rd_atomic). PSNs and the QP number are cut to their 24 bits.
int init_attr(ibv_qp_attr* attr, std::uint8_t port, unsigned access_flags);
int rtr_attr(ibv_qp_attr* attr, const PathEnds& p);
int rts_attr(ibv_qp_attr* attr, const PathEnds& p);

/// ibv_mtu from bytes (256, 512, 1024, 2048, 4096; anything else -> 0, which no port has).
ibv_mtu mtu_from_bytes(int bytes);
/// Bytes of an ibv_mtu (IBV_MTU_256..IBV_MTU_4096; anything else -> 0).
int mtu_bytes(ibv_mtu m);
/// The smaller of two ends' MTUs: what both can carry. 0 when either is not an MTU.
ibv_mtu mtu_min(ibv_mtu a, ibv_mtu b);

/// A failed RTR transition's message with a hint (`err`: the errno ibv_modify_qp returned):
/// on Ethernet it names the GID index and the remote GID's text and suggests
/// BRAID_IB_GID_INDEX / BRAID_IB_ROCE_VERSION_NUM / checking both hosts' `show_gids`; on
/// InfiniBand it names the LIDs and suggests checking the subnet manager.
std::string rtr_failure_hint(const PathEnds& p, int err);

}  // namespace braid::transport::ibverbs
