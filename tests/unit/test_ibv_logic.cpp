// The verbs transport's hardware-free parts (src/transport/ibverbs): BRAID_IB_HCA parsing and
// port choice, GID choice over synthetic GID tables, the QP attributes and masks of each
// RC transition, the MTU helpers, the connection record's codec and authentication, and the
// registration cache's policy over fake register/deregister callbacks. No RDMA device is
// needed. The parts that use verbs.h's types (ibv_config) skip, saying so, in a build
// without the verbs headers; the record and the cache are verbs-free and always run.
#include "transport/ibverbs/ibv_record.hpp"
#include "transport/ibverbs/ibv_reg_cache.hpp"

#include <braid/config.hpp>
#include <braid/error.hpp>
#include <gtest/gtest.h>

#if BRAID_HAVE_IBVERBS
#include "transport/ibverbs/ibv_config.hpp"

#include <arpa/inet.h>
#include <sys/socket.h>
#endif

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace ib = braid::transport::ibverbs;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

#if BRAID_HAVE_IBVERBS

namespace {

std::array<std::uint8_t, 16> gid_of(const char* text) {
  std::array<std::uint8_t, 16> raw{};
  EXPECT_EQ(::inet_pton(AF_INET6, text, raw.data()), 1) << text;
  return raw;
}

ib::GidEntry gid(int index, const char* text, ib::GidType type) { return ib::GidEntry{index, gid_of(text), type}; }

ib::PortInfo port(const char* dev, int number, bool active, const char* pci = "") {
  ib::PortInfo p;
  p.device = dev;
  p.port = number;
  p.active = active;
  p.pci_path = pci;
  return p;
}

}  // namespace

// --- BRAID_IB_HCA ---

TEST(IbvHca, ParsesNcclSyntax) {
  auto s = ib::parse_hca("");
  EXPECT_TRUE(s.entries.empty());
  EXPECT_FALSE(s.exclude);
  s = ib::parse_hca("mlx5_0:1, mlx5_1");
  ASSERT_EQ(s.entries.size(), 2u);
  EXPECT_EQ(s.entries[0].device, "mlx5_0");
  EXPECT_EQ(s.entries[0].port, 1);
  EXPECT_EQ(s.entries[1].device, "mlx5_1");
  EXPECT_EQ(s.entries[1].port, 0);
  EXPECT_FALSE(s.exclude);
  EXPECT_FALSE(s.exact);
  s = ib::parse_hca("^=mlx5_2:2");
  EXPECT_TRUE(s.exclude);
  EXPECT_TRUE(s.exact);
  ASSERT_EQ(s.entries.size(), 1u);
  EXPECT_EQ(s.entries[0].device, "mlx5_2");
  EXPECT_EQ(s.entries[0].port, 2);
  s = ib::parse_hca("=mlx5_0");
  EXPECT_TRUE(s.exact);
  EXPECT_FALSE(s.exclude);
}

TEST(IbvHca, RefusesBadEntriesNamingThem) {
  for (const char* bad : {"mlx5_0,,mlx5_1", "mlx5_0,", ":1", "mlx5_0:", "mlx5_0:x", "mlx5_0:0", "mlx5_0:256", "^",
                          "=", "^=", "mlx5_0:-1"}) {
    try {
      ib::parse_hca(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const braid::Error& e) {
      EXPECT_EQ(e.code(), braid::ErrorCode::InvalidUsage) << bad;
      EXPECT_TRUE(has(e.what(), bad)) << e.what();
      EXPECT_TRUE(has(e.what(), "device[:port]")) << e.what();
    }
  }
}

TEST(IbvHca, MatchesByPrefixExactPortAndExclusion) {
  EXPECT_TRUE(ib::hca_matches(ib::parse_hca(""), "mlx5_3", 2));
  const auto prefix = ib::parse_hca("mlx5");
  EXPECT_TRUE(ib::hca_matches(prefix, "mlx5_0", 1));
  EXPECT_TRUE(ib::hca_matches(prefix, "mlx5_11", 2));
  EXPECT_FALSE(ib::hca_matches(prefix, "bnxt_re0", 1));
  const auto exact = ib::parse_hca("=mlx5_1");
  EXPECT_TRUE(ib::hca_matches(exact, "mlx5_1", 1));
  EXPECT_FALSE(ib::hca_matches(exact, "mlx5_10", 1));
  const auto ported = ib::parse_hca("mlx5_0:2");
  EXPECT_FALSE(ib::hca_matches(ported, "mlx5_0", 1));
  EXPECT_TRUE(ib::hca_matches(ported, "mlx5_0", 2));
  const auto excl = ib::parse_hca("^mlx5_1");
  EXPECT_TRUE(ib::hca_matches(excl, "mlx5_0", 1));
  EXPECT_FALSE(ib::hca_matches(excl, "mlx5_1", 1));
  EXPECT_FALSE(ib::hca_matches(excl, "mlx5_10", 1));  // prefix, as NCCL
  const auto excl_exact = ib::parse_hca("^=mlx5_1:1");
  EXPECT_TRUE(ib::hca_matches(excl_exact, "mlx5_10", 1));
  EXPECT_TRUE(ib::hca_matches(excl_exact, "mlx5_1", 2));
  EXPECT_FALSE(ib::hca_matches(excl_exact, "mlx5_1", 1));
}

// --- port choice ---

TEST(IbvPort, SkipsDownPortsAndExclusions) {
  const std::vector<ib::PortInfo> ports = {port("mlx5_0", 1, false), port("mlx5_1", 1, true), port("mlx5_2", 1, true)};
  auto c = ib::choose_port(ports, ib::parse_hca(""));
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.reason, "mlx5_1:1 (first ACTIVE port)");
  c = ib::choose_port(ports, ib::parse_hca("^mlx5_1"));
  EXPECT_EQ(c.index, 2);
  EXPECT_TRUE(has(c.reason, "mlx5_2:1 (first ACTIVE port BRAID_IB_HCA=^mlx5_1 allows)")) << c.reason;
  c = ib::choose_port(ports, ib::parse_hca("mlx5_0,mlx5_1"));
  EXPECT_EQ(c.index, 1);
}

TEST(IbvPort, NoneSaysWhyForEachPort) {
  const std::vector<ib::PortInfo> ports = {port("mlx5_0", 1, false), port("mlx5_1", 1, true)};
  auto c = ib::choose_port(ports, ib::parse_hca("^mlx5_1"));
  EXPECT_EQ(c.index, -1);
  EXPECT_EQ(c.reason, "no ACTIVE port: mlx5_0:1 not ACTIVE, mlx5_1:1 excluded by BRAID_IB_HCA=^mlx5_1");
  c = ib::choose_port(ports, ib::parse_hca("mlx5_7"));
  EXPECT_EQ(c.index, -1);
  EXPECT_TRUE(has(c.reason, "mlx5_1:1 not listed in BRAID_IB_HCA=mlx5_7")) << c.reason;
  c = ib::choose_port({}, ib::parse_hca(""));
  EXPECT_EQ(c.index, -1);
  EXPECT_FALSE(c.reason.empty());
}

TEST(IbvPort, PrefersTheNicNearestTheGpu) {
  const std::string gpu = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0/0000:85:00.0";
  const std::vector<ib::PortInfo> ports = {
      port("mlx5_0", 1, true, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),        // other socket
      port("mlx5_1", 1, true, "/sys/devices/pci0000:80/0000:80:03.0/0000:90:00.0"),        // same root complex
      port("mlx5_2", 1, true, "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:04.0/0000:84:00.0"),  // same switch
      port("mlx5_3", 1, false, "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0/0000:85:00.1"),  // down
  };
  auto c = ib::choose_port(ports, ib::parse_hca(""), gpu);
  EXPECT_EQ(c.index, 2) << c.reason;
  EXPECT_TRUE(has(c.reason, "mlx5_2:1 (ACTIVE port nearest the GPU: 5 PCI path components")) << c.reason;
  c = ib::choose_port(ports, ib::parse_hca("^mlx5_2"), gpu);
  EXPECT_EQ(c.index, 1) << c.reason;
  // No PCI path shared at all (unknown paths): the first ACTIVE one, said so.
  c = ib::choose_port({port("mlx5_0", 1, true), port("mlx5_1", 1, true)}, ib::parse_hca(""), gpu);
  EXPECT_EQ(c.index, 0);
  EXPECT_TRUE(has(c.reason, "none shares a PCI path")) << c.reason;
  EXPECT_EQ(ib::pci_shared_components("/a/b/c", "/a/b/d"), 2);
  EXPECT_EQ(ib::pci_shared_components("", "/a"), 0);
  EXPECT_EQ(ib::pci_shared_components("/a//b", "/a/b"), 2);
}

// --- GID choice ---

TEST(IbvGid, TextOfIpv4MappedAndIpv6) {
  EXPECT_EQ(ib::gid_text(gid_of("::ffff:10.0.0.2")), "::ffff:10.0.0.2");
  EXPECT_EQ(ib::gid_text(gid_of("fe80::1")), "fe80::1");
  EXPECT_EQ(ib::gid_text(gid_of("fd00:1::5")), "fd00:1::5");
}

TEST(IbvGid, LinkLocalOnlyChoosesNoneWithReasons) {
  const std::vector<ib::GidEntry> t = {gid(0, "fe80::268a:7ff:fe55:1", ib::GidType::roce_v1),
                                       gid(1, "fe80::268a:7ff:fe55:1", ib::GidType::roce_v2), gid(2, "::", ib::GidType::unknown)};
  const auto c = ib::choose_gid(t, true, ib::GidPolicy{});
  EXPECT_EQ(c.index, -1);
  EXPECT_EQ(c.reason,
            "no usable GID: 0 fe80::268a:7ff:fe55:1 link-local; 1 fe80::268a:7ff:fe55:1 link-local; 2 zero");
  EXPECT_TRUE(has(ib::choose_gid({}, true, ib::GidPolicy{}).reason, "empty"));
}

TEST(IbvGid, PrefersThePolicysRoceVersion) {
  const std::vector<ib::GidEntry> t = {
      gid(0, "fe80::1", ib::GidType::roce_v1),          gid(1, "fe80::1", ib::GidType::roce_v2),
      gid(2, "::ffff:10.0.0.2", ib::GidType::roce_v1), gid(3, "::ffff:10.0.0.2", ib::GidType::roce_v2)};
  auto c = ib::choose_gid(t, true, ib::parse_gid_policy(-1, "", "", 2));
  EXPECT_EQ(c.index, 3);
  EXPECT_EQ(c.reason, "GID 3 ::ffff:10.0.0.2 RoCE v2 (IPv4, RoCE v2 preferred)");
  c = ib::choose_gid(t, true, ib::parse_gid_policy(-1, "", "", 1));
  EXPECT_EQ(c.index, 2);
  // Only v1 present, v2 asked: the v1 one, as a last resort, said so.
  c = ib::choose_gid({t[2]}, true, ib::parse_gid_policy(-1, "", "", 2));
  EXPECT_EQ(c.index, 2);
  EXPECT_TRUE(has(c.reason, "none usable")) << c.reason;
}

TEST(IbvGid, UnknownTypeIsAcceptedButLosesToAKnownMatch) {
  const std::vector<ib::GidEntry> t = {gid(2, "::ffff:10.0.0.2", ib::GidType::unknown),
                                       gid(3, "::ffff:10.0.0.2", ib::GidType::roce_v1),
                                       gid(5, "::ffff:10.0.0.2", ib::GidType::roce_v2)};
  EXPECT_EQ(ib::choose_gid(t, true, ib::GidPolicy{}).index, 5);
  auto c = ib::choose_gid({t[0], t[1]}, true, ib::GidPolicy{});
  EXPECT_EQ(c.index, 2) << "unknown beats the other version";
  EXPECT_TRUE(has(c.reason, "no GID known to be RoCE v2")) << c.reason;
  // Among equals the lowest index, whatever the table's order.
  c = ib::choose_gid({gid(7, "::ffff:10.0.0.3", ib::GidType::roce_v2), gid(4, "::ffff:10.0.0.2", ib::GidType::roce_v2)},
                     true, ib::GidPolicy{});
  EXPECT_EQ(c.index, 4);
}

TEST(IbvGid, KeepsTheFamilyAndRange) {
  const std::vector<ib::GidEntry> t = {gid(1, "fd00:1::5", ib::GidType::roce_v2),
                                       gid(3, "::ffff:192.168.1.4", ib::GidType::roce_v2),
                                       gid(4, "::ffff:10.1.2.3", ib::GidType::roce_v2)};
  EXPECT_EQ(ib::choose_gid(t, true, ib::GidPolicy{}).index, 1);
  auto c = ib::choose_gid(t, true, ib::parse_gid_policy(-1, "AF_INET", "", 2));
  EXPECT_EQ(c.index, 3);
  EXPECT_TRUE(has(c.reason, "(IPv4,")) << c.reason;
  c = ib::choose_gid(t, true, ib::parse_gid_policy(-1, "af_inet6", "", 2));
  EXPECT_EQ(c.index, 1);
  EXPECT_TRUE(has(c.reason, "(IPv6,")) << c.reason;
  c = ib::choose_gid(t, true, ib::parse_gid_policy(-1, "", "10.0.0.0/8", 2));
  EXPECT_EQ(c.index, 4);
  c = ib::choose_gid(t, true, ib::parse_gid_policy(-1, "", "fd00::/8", 2));
  EXPECT_EQ(c.index, 1);
  c = ib::choose_gid(t, true, ib::parse_gid_policy(-1, "AF_INET", "172.16.0.0/12", 2));
  EXPECT_EQ(c.index, -1);
  EXPECT_TRUE(has(c.reason, "3 ::ffff:192.168.1.4 outside BRAID_IB_ADDR_RANGE=172.16.0.0/12")) << c.reason;
  EXPECT_TRUE(has(c.reason, "1 fd00:1::5 IPv6, not IPv4")) << c.reason;
  // Host bits in the range are ignored; /32 is one address.
  EXPECT_EQ(ib::choose_gid(t, true, ib::parse_gid_policy(-1, "", "10.1.2.3/32", 2)).index, 4);
  EXPECT_EQ(ib::choose_gid(t, true, ib::parse_gid_policy(-1, "", "10.1.2.4/32", 2)).index, -1);
  // A hand-made policy with a range that does not parse chooses nothing.
  ib::GidPolicy bad;
  bad.range = "10.0.0.0";
  c = ib::choose_gid(t, true, bad);
  EXPECT_EQ(c.index, -1);
  EXPECT_TRUE(has(c.reason, "prefix length")) << c.reason;
}

TEST(IbvGid, ForcedIndexWinsWhenPresent) {
  const std::vector<ib::GidEntry> t = {gid(0, "fe80::1", ib::GidType::roce_v1), gid(3, "::ffff:10.0.0.2", ib::GidType::roce_v2)};
  auto c = ib::choose_gid(t, true, ib::parse_gid_policy(0, "AF_INET", "", 2));
  EXPECT_EQ(c.index, 0) << "forced, even link-local and of the other family";
  EXPECT_TRUE(has(c.reason, "forced by BRAID_IB_GID_INDEX")) << c.reason;
  c = ib::choose_gid(t, true, ib::parse_gid_policy(5, "", "", 2));
  EXPECT_EQ(c.index, -1);
  EXPECT_EQ(c.reason, "BRAID_IB_GID_INDEX=5 is not in the port's GID table (indices 0, 3)");
  c = ib::choose_gid(t, false, ib::parse_gid_policy(3, "", "", 2));
  EXPECT_EQ(c.index, 3) << "forced applies on InfiniBand too";
}

TEST(IbvGid, InfinibandIgnoresThePolicy) {
  const std::vector<ib::GidEntry> t = {gid(0, "fe80::248a:703:49:1", ib::GidType::ib), gid(1, "::", ib::GidType::ib)};
  for (const auto& policy : {ib::GidPolicy{}, ib::parse_gid_policy(-1, "AF_INET", "10.0.0.0/8", 1)}) {
    const auto c = ib::choose_gid(t, false, policy);
    EXPECT_EQ(c.index, 0);
    EXPECT_TRUE(has(c.reason, "InfiniBand")) << c.reason;
  }
}

TEST(IbvGid, PolicyParsingRefusesNonsense) {
  const auto p = ib::parse_gid_policy(3, " AF_INET ", "10.0.0.0/8", 1);
  EXPECT_EQ(p.forced_index, 3);
  EXPECT_EQ(p.family, AF_INET);
  EXPECT_EQ(p.range, "10.0.0.0/8");
  EXPECT_EQ(p.roce_version, 1);
  EXPECT_EQ(ib::parse_gid_policy(-1, "", "", 2).family, 0);
  struct Bad {
    int index;
    const char* family;
    const char* range;
    int version;
    const char* says;
  };
  for (const Bad& b : {Bad{-2, "", "", 2, "BRAID_IB_GID_INDEX=-2"}, Bad{-1, "inet4", "", 2, "BRAID_IB_ADDR_FAMILY"},
                       Bad{-1, "", "10.0.0.0", 2, "no prefix length"}, Bad{-1, "", "10.0.0.0/33", 2, "0..32"},
                       Bad{-1, "", "fd00::/129", 2, "0..128"}, Bad{-1, "", "nonsense/8", 2, "neither"},
                       Bad{-1, "AF_INET6", "10.0.0.0/8", 2, "no GID can match both"},
                       Bad{-1, "", "", 3, "BRAID_IB_ROCE_VERSION_NUM=3"}}) {
    try {
      ib::parse_gid_policy(b.index, b.family, b.range, b.version);
      ADD_FAILURE() << "accepted " << b.says;
    } catch (const braid::Error& e) {
      EXPECT_EQ(e.code(), braid::ErrorCode::InvalidUsage);
      EXPECT_TRUE(has(e.what(), b.says)) << e.what();
    }
  }
}

// --- QP attributes ---

TEST(IbvQpAttr, InitMaskAndFields) {
  ibv_qp_attr a;
  std::memset(&a, 0xab, sizeof a);
  const int mask = ib::init_attr(&a, 2, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  EXPECT_EQ(a.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(a.pkey_index, 0);
  EXPECT_EQ(a.port_num, 2);
  EXPECT_EQ(a.qp_access_flags, unsigned{IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE});
  EXPECT_EQ(a.path_mtu, 0) << "zeroed first";
}

TEST(IbvQpAttr, RtrOnRoceHasGrhAndNoLid) {
  ib::PathEnds p;
  p.ethernet = true;
  p.port = 1;
  p.sgid_index = 3;
  p.remote_lid = 77;  // must be ignored
  p.remote_gid = gid_of("::ffff:10.0.0.9");
  p.remote_qpn = 0x1234;
  p.remote_psn = 0xabcdef;
  p.mtu = IBV_MTU_4096;
  p.traffic_class = 106;
  p.service_level = 3;
  p.min_rnr_timer = 12;
  p.max_rd_atomic = 1;
  ibv_qp_attr a;
  std::memset(&a, 0xab, sizeof a);
  const int mask = ib::rtr_attr(&a, p);
  EXPECT_EQ(mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  EXPECT_EQ(a.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(a.path_mtu, IBV_MTU_4096);
  EXPECT_EQ(a.dest_qp_num, 0x1234u);
  EXPECT_EQ(a.rq_psn, 0xabcdefu);
  EXPECT_EQ(a.max_dest_rd_atomic, 1);
  EXPECT_EQ(a.min_rnr_timer, 12);
  EXPECT_EQ(a.ah_attr.is_global, 1);
  EXPECT_EQ(a.ah_attr.dlid, 0);
  EXPECT_EQ(std::memcmp(a.ah_attr.grh.dgid.raw, p.remote_gid.data(), 16), 0);
  EXPECT_EQ(a.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(a.ah_attr.grh.hop_limit, 255);
  EXPECT_EQ(a.ah_attr.grh.traffic_class, 106);
  EXPECT_EQ(a.ah_attr.sl, 3);
  EXPECT_EQ(a.ah_attr.port_num, 1);
  EXPECT_EQ(a.timeout, 0) << "RTS fields stay zero";
}

TEST(IbvQpAttr, RtrOnInfinibandHasLidAndNoGrh) {
  ib::PathEnds p;
  p.ethernet = false;
  p.port = 2;
  p.sgid_index = 3;
  p.remote_lid = 0x1f;
  p.remote_gid = gid_of("fe80::1");
  p.remote_qpn = 0x1ffffff;  // over 24 bits: cut
  p.remote_psn = 5;
  p.mtu = IBV_MTU_2048;
  p.service_level = 4;
  ibv_qp_attr a;
  std::memset(&a, 0xab, sizeof a);
  const int mask = ib::rtr_attr(&a, p);
  EXPECT_EQ(mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  EXPECT_EQ(a.ah_attr.is_global, 0);
  EXPECT_EQ(a.ah_attr.dlid, 0x1f);
  EXPECT_EQ(a.ah_attr.sl, 4);
  EXPECT_EQ(a.ah_attr.port_num, 2);
  EXPECT_EQ(a.ah_attr.grh.sgid_index, 0);
  EXPECT_EQ(a.ah_attr.grh.hop_limit, 0);
  const std::array<std::uint8_t, 16> zero{};
  EXPECT_EQ(std::memcmp(a.ah_attr.grh.dgid.raw, zero.data(), 16), 0);
  EXPECT_EQ(a.dest_qp_num, 0xffffffu);
  EXPECT_EQ(a.path_mtu, IBV_MTU_2048);
}

TEST(IbvQpAttr, RtsMaskAndFields) {
  ib::PathEnds p;
  p.local_psn = 0x1000042;  // over 24 bits: cut
  p.timeout = 20;
  p.retry_cnt = 6;
  p.rnr_retry = 5;
  p.max_rd_atomic = 4;
  ibv_qp_attr a;
  std::memset(&a, 0xab, sizeof a);
  const int mask = ib::rts_attr(&a, p);
  EXPECT_EQ(mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                      IBV_QP_MAX_QP_RD_ATOMIC);
  EXPECT_EQ(a.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(a.sq_psn, 0x42u);
  EXPECT_EQ(a.timeout, 20);
  EXPECT_EQ(a.retry_cnt, 6);
  EXPECT_EQ(a.rnr_retry, 5);
  EXPECT_EQ(a.max_rd_atomic, 4);
  EXPECT_EQ(a.ah_attr.dlid, 0) << "zeroed first";
}

TEST(IbvQpAttr, MtuHelpers) {
  const int sizes[] = {256, 512, 1024, 2048, 4096};
  const ibv_mtu mtus[] = {IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(ib::mtu_from_bytes(sizes[i]), mtus[i]);
    EXPECT_EQ(ib::mtu_bytes(mtus[i]), sizes[i]);
  }
  for (int bad : {0, 128, 1000, 1500, 8192, -256}) EXPECT_EQ(static_cast<int>(ib::mtu_from_bytes(bad)), 0) << bad;
  EXPECT_EQ(ib::mtu_bytes(static_cast<ibv_mtu>(0)), 0);
  EXPECT_EQ(ib::mtu_bytes(static_cast<ibv_mtu>(6)), 0);
  EXPECT_EQ(ib::mtu_min(IBV_MTU_4096, IBV_MTU_1024), IBV_MTU_1024);
  EXPECT_EQ(ib::mtu_min(IBV_MTU_512, IBV_MTU_2048), IBV_MTU_512);
  EXPECT_EQ(static_cast<int>(ib::mtu_min(IBV_MTU_4096, static_cast<ibv_mtu>(0))), 0);
}

TEST(IbvQpAttr, RtrFailureHints) {
  ib::PathEnds p;
  p.ethernet = true;
  p.sgid_index = 3;
  p.remote_gid = gid_of("::ffff:10.0.0.9");
  auto m = ib::rtr_failure_hint(p, EINVAL);
  for (const char* part : {"RTR", "GID index 3", "::ffff:10.0.0.9", "BRAID_IB_GID_INDEX", "BRAID_IB_ROCE_VERSION_NUM",
                           "show_gids"})
    EXPECT_TRUE(has(m, part)) << part << " in " << m;
  EXPECT_FALSE(has(m, "subnet manager")) << m;
  p.ethernet = false;
  p.remote_lid = 0;
  m = ib::rtr_failure_hint(p, EINVAL);
  for (const char* part : {"RTR", "remote LID 0", "subnet manager", "never given a LID"})
    EXPECT_TRUE(has(m, part)) << part << " in " << m;
  EXPECT_FALSE(has(m, "show_gids")) << m;
}

#else

TEST(IbvConfig, NotBuilt) { GTEST_SKIP() << "built without the verbs headers (BRAID_WITH_IBVERBS; install libibverbs-dev)"; }

#endif  // BRAID_HAVE_IBVERBS

// --- the connection record (verbs-free) ---

namespace {

ib::ConnRecord sample_record() {
  ib::ConnRecord r;
  r.comm_id = 0x0123456789abcdefull;
  r.from = 3;
  r.to = 5;
  r.token = "job-token";
  r.lid = 0x1234;
  for (int i = 0; i < 16; ++i) r.gid[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(0xa0 + i);
  r.ethernet = true;
  r.mtu = 5;
  r.qpn = 0xabcdef;
  r.psn = 0x123456;
  r.ring_addr = 0x7f0000001000ull;
  r.ring_rkey = 0xdeadbeef;
  r.slots = 64;
  r.slot_bytes = 1u << 20;
  r.ctrl_addr = 0x7f0000800000ull;
  r.ctrl_rkey = 0xcafef00d;
  r.ctrl_bytes = 4096;
  r.data_qpns = {0x000001, 0xfffffe, 0x123456};
  return r;
}

bool same(const ib::ConnRecord& a, const ib::ConnRecord& b) {
  return a.comm_id == b.comm_id && a.from == b.from && a.to == b.to && a.token == b.token && a.lid == b.lid &&
         a.gid == b.gid && a.ethernet == b.ethernet && a.mtu == b.mtu && a.qpn == b.qpn && a.psn == b.psn &&
         a.ring_addr == b.ring_addr && a.ring_rkey == b.ring_rkey && a.slots == b.slots &&
         a.slot_bytes == b.slot_bytes && a.ctrl_addr == b.ctrl_addr && a.ctrl_rkey == b.ctrl_rkey &&
         a.ctrl_bytes == b.ctrl_bytes && a.data_qpns == b.data_qpns;
}

/// The reason a record with one field changed is refused ("" when accepted).
template <class Change>
std::string refusal(Change change) {
  ib::ConnRecord r = sample_record();
  change(r);
  ib::ConnRecord out;
  std::string why;
  return ib::decode_record(ib::encode_record(r), &out, &why) ? std::string() : why;
}

}  // namespace

TEST(IbvRecord, RoundTrips) {
  for (const std::string& token : {std::string(), std::string("job-token"), std::string(256, '\xff')}) {
    for (bool eth : {false, true}) {
      for (std::size_t data_qps : {std::size_t{0}, std::size_t{3}, ib::kRecordMaxDataQps}) {
      ib::ConnRecord r = sample_record();
      r.token = token;
      r.ethernet = eth;
      r.data_qpns.resize(data_qps, 0xabc);
      const std::string bytes = ib::encode_record(r);
      EXPECT_EQ(bytes.size(), ib::kRecordFixedBytes + 4 * data_qps + token.size());
      EXPECT_EQ(bytes.compare(0, 4, "BIBV"), 0);
      ib::ConnRecord out;
      std::string why;
      ASSERT_TRUE(ib::decode_record(bytes, &out, &why)) << why;
      EXPECT_TRUE(same(r, out));
      }
    }
  }
}

TEST(IbvRecord, EveryTruncationIsRefused) {
  const std::string bytes = ib::encode_record(sample_record());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    // A copy of exactly n bytes, so that ASan sees any read past them.
    const std::vector<char> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    ib::ConnRecord out;
    out.qpn = 77;
    std::string why;
    EXPECT_FALSE(ib::decode_record(std::string_view(cut.data(), n), &out, &why)) << n;
    EXPECT_TRUE(has(why, "truncated: " + std::to_string(n) + " of ")) << n << ": " << why;
    EXPECT_EQ(out.qpn, 77u) << "output untouched on failure";
  }
  ib::ConnRecord out;
  std::string why;
  EXPECT_FALSE(ib::decode_record(bytes + "x", &out, &why));
  EXPECT_TRUE(has(why, "1 trailing bytes")) << why;
}

TEST(IbvRecord, WrongMagicOrVersionIsNamed) {
  std::string bytes = ib::encode_record(sample_record());
  ib::ConnRecord out;
  std::string why;
  std::string b = bytes;
  b[0] = 'X';
  EXPECT_FALSE(ib::decode_record(b, &out, &why));
  EXPECT_TRUE(has(why, "not a braid verbs connection record")) << why;
  b = bytes;
  b[4] = 1;  // a braid from before BRAID_IB_QPS_PER_PEER
  EXPECT_FALSE(ib::decode_record(b, &out, &why));
  EXPECT_TRUE(has(why, "record version 1; this build reads version 2")) << why;
  // Judged before the length: a 6-byte stranger is named as one.
  EXPECT_FALSE(ib::decode_record(std::string_view("ABCDEF", 6), &out, &why));
  EXPECT_TRUE(has(why, "magic")) << why;
}

TEST(IbvRecord, OutOfRangeFieldsAreRefused) {
  EXPECT_EQ(refusal([](ib::ConnRecord&) {}), "");
  EXPECT_EQ(refusal([](ib::ConnRecord& r) { r.qpn = 0x1000000; }), "qpn 0x1000000 is not 24-bit");
  EXPECT_EQ(refusal([](ib::ConnRecord& r) { r.psn = 0xffffffff; }), "psn 0xffffffff is not 24-bit");
  EXPECT_EQ(refusal([](ib::ConnRecord& r) { r.data_qpns[1] = 0x1000000; }), "data qpn 0x1000000 is not 24-bit");
  {
    // More data QPs than any rank makes: the encoder refuses to write it, the decoder to read it.
    ib::ConnRecord r = sample_record();
    r.data_qpns.resize(ib::kRecordMaxDataQps + 1);
    EXPECT_THROW(ib::encode_record(r), braid::Error);
    r.data_qpns.resize(ib::kRecordMaxDataQps);
    std::string bytes = ib::encode_record(r);
    bytes[72] = static_cast<char>(ib::kRecordMaxDataQps + 1);  // data_qps, after ctrl_bytes
    bytes.append(4, '\0');
    ib::ConnRecord out;
    std::string why;
    EXPECT_FALSE(ib::decode_record(bytes, &out, &why));
    EXPECT_EQ(why, "16 data queue pairs, more than 15");
    bytes = ib::encode_record(sample_record());
    bytes[74] = 1;  // the reserved half-word
    EXPECT_FALSE(ib::decode_record(bytes, &out, &why));
    EXPECT_EQ(why, "reserved field 0x1 is not 0");
  }
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.mtu = 0; }), "mtu 0"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.mtu = 6; }), "mtu 6"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.from = -1; }), "negative rank"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.to = -7; }), "negative rank"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.slots = 0; }), "slots 0"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.slots = 4097; }), "slots 4097"));
  EXPECT_EQ(refusal([](ib::ConnRecord& r) { r.slots = 4096; }), "");
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.slot_bytes = 128; }), "slot_bytes 128"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.slot_bytes = 3000; }), "slot_bytes 3000"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.slot_bytes = 32u << 20; }), "slot_bytes"));
  EXPECT_EQ(refusal([](ib::ConnRecord& r) { r.slot_bytes = 256; }), "");
  EXPECT_EQ(refusal([](ib::ConnRecord& r) { r.slot_bytes = 16u << 20; }), "");
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.ctrl_bytes = 4; }), "ctrl_bytes 4"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.ctrl_bytes = (1u << 20) + 1; }), "ctrl_bytes"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.ring_addr = 0; }), "ring_addr"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.ring_addr = ~0ull - 4096; }), "ring_addr"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.ctrl_addr = 0; }), "ctrl_addr"));
  EXPECT_TRUE(has(refusal([](ib::ConnRecord& r) { r.ctrl_addr = ~0ull; }), "ctrl_addr"));
  // Unknown flag bits: a newer format this build must not half-understand.
  std::string b = ib::encode_record(sample_record());
  b[6] = static_cast<char>(0x81);
  ib::ConnRecord out;
  std::string why;
  EXPECT_FALSE(ib::decode_record(b, &out, &why));
  EXPECT_TRUE(has(why, "unknown flags")) << why;
}

TEST(IbvRecord, OversizedTokenIsRefused) {
  ib::ConnRecord r = sample_record();
  r.token.assign(257, 't');
  EXPECT_THROW(ib::encode_record(r), braid::Error);
  // Forged on the wire: a 256-byte token's record with its length field set to 257 and
  // one more byte, and one claiming 65535 bytes with nothing after it.
  r.token.assign(256, 't');
  std::string b = ib::encode_record(r) + "t";
  b[26] = 1;  // token_bytes (offset 26, little-endian): 256 -> 257
  b[27] = 1;
  ib::ConnRecord out;
  std::string why;
  EXPECT_FALSE(ib::decode_record(b, &out, &why));
  EXPECT_TRUE(has(why, "token of 257 bytes")) << why;
  b = ib::encode_record(sample_record());
  b[26] = b[27] = static_cast<char>(0xff);
  EXPECT_FALSE(ib::decode_record(b, &out, &why));
  EXPECT_TRUE(has(why, "token of 65535 bytes")) << why;
}

TEST(IbvRecord, Authenticity) {
  ib::ConnRecord r = sample_record();  // from 3 to 5
  ib::sign_record(&r, "job-token");
  EXPECT_TRUE(ib::record_authentic(r, r.comm_id, 5, 3, "job-token"));
  EXPECT_FALSE(ib::record_authentic(r, r.comm_id + 1, 5, 3, "job-token")) << "other communicator";
  EXPECT_FALSE(ib::record_authentic(r, r.comm_id, 4, 3, "job-token")) << "meant for another rank";
  EXPECT_FALSE(ib::record_authentic(r, r.comm_id, 5, 2, "job-token")) << "from another rank";
  EXPECT_FALSE(ib::record_authentic(r, r.comm_id, 3, 5, "job-token")) << "direction swapped";
  EXPECT_FALSE(ib::record_authentic(r, r.comm_id, 5, 3, "job-tokeN")) << "wrong token";
  EXPECT_FALSE(ib::record_authentic(r, r.comm_id, 5, 3, "job-token2")) << "longer token";
  EXPECT_FALSE(ib::record_authentic(r, r.comm_id, 5, 3, "")) << "empty token";
  ib::ConnRecord forged = r;
  forged.qpn ^= 1;  // a field changed after signing: the proof no longer holds
  EXPECT_FALSE(ib::record_authentic(forged, r.comm_id, 5, 3, "job-token")) << "altered record";
  ib::ConnRecord raw = sample_record();
  raw.token = "job-token";  // the token itself, as version 2 records carried it, is no proof
  EXPECT_FALSE(ib::record_authentic(raw, r.comm_id, 5, 3, "job-token")) << "a raw token";
  EXPECT_EQ(r.token.find("job-token"), std::string::npos) << "the token must not be in the record";
}

// --- the registration cache (verbs-free) ---

namespace {

/// Fake verbs: records every live registration (by handle: overlapping ones, even at one
/// base, are legal in verbs) and how many were made and dropped; can be told to fail.
struct FakeMr {
  struct Live {
    std::uintptr_t base;
    std::size_t bytes;
  };
  std::map<std::uintptr_t, Live> live;  // handle -> range
  int registered = 0, deregistered = 0;
  bool fail = false;
  std::uint32_t next_key = 100;
  std::uintptr_t next_handle = 1;

  /// How many live registrations start at `base`.
  std::size_t at_base(std::uintptr_t base) const {
    std::size_t n = 0;
    for (const auto& kv : live) n += kv.second.base == base ? 1 : 0;
    return n;
  }
  ib::RegCache::RegisterFn reg() {
    return [this](std::uintptr_t base, std::size_t bytes, ib::Registration* out, std::string* why) {
      if (fail) {
        *why = "ibv_reg_mr: Cannot allocate memory";
        return false;
      }
      const std::uintptr_t h = next_handle++;
      live[h] = Live{base, bytes};
      ++registered;
      out->handle = reinterpret_cast<void*>(h);
      out->lkey = next_key++;
      out->rkey = next_key++;
      return true;
    };
  }
  ib::RegCache::DeregisterFn dereg() {
    return [this](const ib::Registration& r) {
      const auto it = live.find(reinterpret_cast<std::uintptr_t>(r.handle));
      ASSERT_NE(it, live.end()) << "deregistered twice, or never registered";
      EXPECT_EQ(it->second.base, r.base);
      EXPECT_EQ(it->second.bytes, r.bytes);
      live.erase(it);
      ++deregistered;
    };
  }
};

const void* at(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }
constexpr std::uintptr_t kBase = 0x100000;

}  // namespace

TEST(IbvRegCache, PageAlignsAndReusesACoveringEntry) {
  FakeMr mr;
  ib::RegCache cache(mr.reg(), mr.dereg(), 4, 4096);
  std::string why;
  const ib::Registration* a = cache.acquire(at(kBase + 100), 5000, &why);
  ASSERT_NE(a, nullptr) << why;
  EXPECT_EQ(a->base, kBase);
  EXPECT_EQ(a->bytes, 8192u);
  EXPECT_EQ(a->rkey, 101u);
  const ib::Registration* b = cache.acquire(at(kBase + 4096), 4096, &why);
  EXPECT_EQ(b, a) << "covered: a hit";
  EXPECT_EQ(mr.registered, 1);
  EXPECT_EQ(cache.entries(), 1u);
  EXPECT_EQ(cache.in_use(), 1u);
  cache.release(a);
  EXPECT_EQ(cache.in_use(), 1u) << "two uses, one released";
  cache.release(b);
  EXPECT_EQ(cache.in_use(), 0u);
  EXPECT_EQ(cache.entries(), 1u) << "unused entries stay cached";
  EXPECT_EQ(cache.acquire(at(kBase), 1, &why), a);
  EXPECT_EQ(mr.registered, 1);
  // A zero-byte request still names a page.
  EXPECT_EQ(cache.acquire(at(kBase + 8191), 0, &why), a);
  EXPECT_EQ(mr.deregistered, 0);
}

TEST(IbvRegCache, OverlapWithUnusedEntriesBecomesTheUnion) {
  FakeMr mr;
  ib::RegCache cache(mr.reg(), mr.dereg(), 8, 4096);
  std::string why;
  const auto* a = cache.acquire(at(kBase), 4096, &why);
  const auto* b = cache.acquire(at(kBase + 3 * 4096), 4096, &why);
  const auto* far = cache.acquire(at(kBase + 100 * 4096), 4096, &why);
  cache.release(a);
  cache.release(b);
  cache.release(far);
  ASSERT_EQ(cache.entries(), 3u);
  // [kBase+2048, kBase+3*4096+1) overlaps both: one entry from kBase to kBase+4 pages.
  const auto* u = cache.acquire(at(kBase + 2048), 2 * 4096 + 2048 + 1, &why);
  ASSERT_NE(u, nullptr) << why;
  EXPECT_EQ(u->base, kBase);
  EXPECT_EQ(u->bytes, 4u * 4096);
  EXPECT_EQ(cache.entries(), 2u) << "the two merged away, the far one kept";
  EXPECT_EQ(mr.deregistered, 2);
  EXPECT_EQ(mr.live.size(), 2u);
}

TEST(IbvRegCache, InUseEntriesAreNeverMergedOrEvicted) {
  FakeMr mr;
  ib::RegCache cache(mr.reg(), mr.dereg(), 0, 4096);
  std::string why;
  const auto* a = cache.acquire(at(kBase), 4096, &why);
  // Overlaps `a` (in use) but is not covered by it: a second entry; `a` stays registered.
  const auto* b = cache.acquire(at(kBase + 2048), 8192, &why);
  ASSERT_NE(b, nullptr) << why;
  EXPECT_NE(a, b);
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_EQ(mr.deregistered, 0);
  EXPECT_EQ(a->base, kBase) << "still valid";
  // max_unused 0: released means deregistered at once; the other stays.
  cache.release(b);
  EXPECT_EQ(cache.entries(), 1u);
  EXPECT_EQ(mr.deregistered, 1);
  EXPECT_EQ(cache.in_use(), 1u);
  cache.release(a);
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_THROW(cache.release(a), braid::Error) << "released twice";
}

TEST(IbvRegCache, EvictsUnusedLeastRecentlyUsedFirst) {
  FakeMr mr;
  ib::RegCache cache(mr.reg(), mr.dereg(), 2, 4096);
  std::string why;
  std::vector<const ib::Registration*> r;
  for (int i = 0; i < 4; ++i) r.push_back(cache.acquire(at(kBase + static_cast<std::uintptr_t>(i) * 0x10000), 4096, &why));
  const auto* held = r[3];
  cache.release(r[0]);
  cache.release(r[1]);
  // Touch r[0] again so that r[1] is now the least recently used.
  EXPECT_EQ(cache.acquire(at(kBase), 10, &why), r[0]);
  cache.release(r[0]);
  EXPECT_EQ(cache.entries(), 4u) << "2 unused: within the bound";
  cache.release(r[2]);  // 3 unused > 2: r[1] goes
  EXPECT_EQ(cache.entries(), 3u);
  EXPECT_EQ(mr.at_base(kBase + 0x10000), 0u) << "the LRU one was deregistered";
  EXPECT_EQ(mr.at_base(kBase), 1u);
  EXPECT_EQ(mr.at_base(kBase + 0x20000), 1u);
  EXPECT_EQ(mr.at_base(kBase + 0x30000), 1u) << "the in-use one, oldest of all, stays";
  EXPECT_EQ(cache.in_use(), 1u);
  cache.release(held);
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_EQ(mr.at_base(kBase), 0u) << "then r[0], the least recently used";
}

TEST(IbvRegCache, InvalidateDropsUnusedAndStalesInUse) {
  FakeMr mr;
  ib::RegCache cache(mr.reg(), mr.dereg(), 8, 4096);
  std::string why;
  const auto* unused = cache.acquire(at(kBase), 4096, &why);
  const auto* busy = cache.acquire(at(kBase + 0x10000), 4096, &why);
  const auto* other = cache.acquire(at(kBase + 0x20000), 4096, &why);
  cache.release(unused);
  cache.release(other);
  // Freeing a range that covers the first two (a byte of `busy`'s page is enough).
  EXPECT_EQ(cache.invalidate(at(kBase + 10), 0x10000), 1u);
  EXPECT_EQ(mr.at_base(kBase), 0u);
  EXPECT_EQ(cache.entries(), 2u) << "busy (stale) and other";
  EXPECT_EQ(mr.at_base(kBase + 0x10000), 1u) << "in use: still registered";
  cache.release(busy);
  EXPECT_EQ(mr.at_base(kBase + 0x10000), 0u) << "deregistered at its last release";
  const auto* again = cache.acquire(at(kBase + 0x10000), 4096, &why);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(mr.registered, 4) << "a new registration after the stale one went";
  EXPECT_EQ(cache.invalidate(at(kBase + 0x50000), 4096), 0u) << "nothing there";
  EXPECT_EQ(cache.invalidate(at(kBase + 0x20000), 0), 0u) << "zero bytes";
  EXPECT_EQ(cache.entries(), 2u);
}

TEST(IbvRegCache, StaleInUseEntryIsNotReused) {
  FakeMr mr;
  ib::RegCache cache(mr.reg(), mr.dereg(), 8, 4096);
  std::string why;
  const auto* busy = cache.acquire(at(kBase), 2 * 4096, &why);
  cache.invalidate(at(kBase), 4096);
  // Covered by `busy`, which is stale: a registration of its own.
  const auto* fresh = cache.acquire(at(kBase + 4096), 4096, &why);
  ASSERT_NE(fresh, nullptr) << why;
  EXPECT_NE(fresh, busy);
  EXPECT_EQ(fresh->base, kBase + 4096);
  EXPECT_EQ(mr.registered, 2);
  EXPECT_EQ(cache.entries(), 2u);
  cache.release(busy);
  EXPECT_EQ(cache.entries(), 1u);
  cache.release(fresh);
  EXPECT_EQ(cache.entries(), 1u);
}

TEST(IbvRegCache, FailedRegistrationLeavesTheCacheAsItWas) {
  FakeMr mr;
  ib::RegCache cache(mr.reg(), mr.dereg(), 8, 4096);
  std::string why;
  const auto* a = cache.acquire(at(kBase), 4096, &why);
  cache.release(a);
  mr.fail = true;
  EXPECT_EQ(cache.acquire(at(kBase + 2048), 8192, &why), nullptr);
  EXPECT_TRUE(has(why, "Cannot allocate memory")) << why;
  EXPECT_TRUE(has(why, "0x100000")) << why;
  EXPECT_EQ(cache.entries(), 1u) << "the entry it would have merged is kept";
  EXPECT_EQ(mr.deregistered, 0);
  EXPECT_EQ(cache.in_use(), 0u);
  // A covered request still hits without registering.
  EXPECT_EQ(cache.acquire(at(kBase + 1), 1, &why), a);
  // A range that wraps the address space is refused without a call.
  EXPECT_EQ(cache.acquire(at(~std::uintptr_t{0} - 10), 100, &why), nullptr);
  EXPECT_TRUE(has(why, "wraps")) << why;
}

TEST(IbvRegCache, DestructorDeregistersEverything) {
  FakeMr mr;
  {
    ib::RegCache cache(mr.reg(), mr.dereg(), 8, 4096);
    std::string why;
    cache.acquire(at(kBase), 4096, &why);  // in use at destruction
    cache.release(cache.acquire(at(kBase + 0x10000), 4096, &why));
    EXPECT_EQ(mr.live.size(), 2u);
  }
  EXPECT_TRUE(mr.live.empty());
  EXPECT_EQ(mr.deregistered, 2);
}

TEST(IbvRegCache, RefusesABadPageSizeOrEmptyCallbacks) {
  FakeMr mr;
  EXPECT_THROW(ib::RegCache(mr.reg(), mr.dereg(), 8, 3000), braid::Error);
  EXPECT_THROW(ib::RegCache(mr.reg(), mr.dereg(), 8, 0), braid::Error);
  EXPECT_THROW(ib::RegCache(nullptr, mr.dereg()), braid::Error);
  ib::RegCache big(mr.reg(), mr.dereg(), 8, 1 << 16);
  std::string why;
  const auto* r = big.acquire(at(kBase + 0x10010), 10, &why);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->base, kBase + 0x10000);
  EXPECT_EQ(r->bytes, 1u << 16);
}
