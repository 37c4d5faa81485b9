// fakeverbs (tests/support/fakeverbs), the test provider the verbs transport is proven
// against: these tests prove the provider itself behaves like an RC HCA where the transport
// depends on it (queries through braid's own loader, the QP state machine a driver enforces,
// one-sided writes and sends between processes, the error completions of RC, completion
// channels). If the fake is wrong, the transport's tests prove nothing.
#include <gtest/gtest.h>

#if defined(BRAID_FAKEVERBS_LIBRARY)

#include "transport/ibverbs/ibv_lib.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace iv = braid::transport::ibverbs;

// The entry points beyond braid's loader table, resolved from the same library.
struct Fv {
  const iv::Api* api = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ack_cq_events)(ibv_cq*, unsigned);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*destroy_qp)(ibv_qp*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*query_qp)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*);
};

template <typename F>
void sym(void* h, const char* name, F* f) {
  *f = reinterpret_cast<F>(::dlvsym(h, name, "IBVERBS_1.1"));
  if (*f == nullptr) ADD_FAILURE() << BRAID_FAKEVERBS_LIBRARY << " has no " << name << "@IBVERBS_1.1";
}

const Fv& fv() {
  static Fv f = [] {
    // A fabric directory of this test process alone: no stale sockets of other runs.
    char dir[] = "/tmp/fvtest-XXXXXX";
    if (::mkdtemp(dir) != nullptr) ::setenv("FAKEVERBS_FABRIC", dir, 1);
    Fv r;
    std::string why;
    r.api = iv::load(BRAID_FAKEVERBS_LIBRARY, &why);
    if (r.api == nullptr) {
      ADD_FAILURE() << why;
      return r;
    }
    void* h = ::dlopen(BRAID_FAKEVERBS_LIBRARY, RTLD_NOW);
    sym(h, "ibv_alloc_pd", &r.alloc_pd);
    sym(h, "ibv_dealloc_pd", &r.dealloc_pd);
    sym(h, "ibv_reg_mr", &r.reg_mr);
    sym(h, "ibv_dereg_mr", &r.dereg_mr);
    sym(h, "ibv_create_comp_channel", &r.create_comp_channel);
    sym(h, "ibv_destroy_comp_channel", &r.destroy_comp_channel);
    sym(h, "ibv_create_cq", &r.create_cq);
    sym(h, "ibv_destroy_cq", &r.destroy_cq);
    sym(h, "ibv_get_cq_event", &r.get_cq_event);
    sym(h, "ibv_ack_cq_events", &r.ack_cq_events);
    sym(h, "ibv_create_qp", &r.create_qp);
    sym(h, "ibv_destroy_qp", &r.destroy_qp);
    sym(h, "ibv_modify_qp", &r.modify_qp);
    sym(h, "ibv_query_qp", &r.query_qp);
    return r;
  }();
  return f;
}

ibv_context* open_ctx() {
  const iv::Api* a = fv().api;
  int n = 0;
  ibv_device** list = a->get_device_list(&n);
  if (list == nullptr || n < 1) return nullptr;
  ibv_context* c = a->open_device(list[0]);
  a->free_device_list(list);
  return c;
}

// What a peer tells the other out of band (braid's bootstrap does this over its store).
struct Info {
  std::uint32_t qpn;
  ibv_gid gid;
  std::uint32_t rkey;
  std::uint64_t addr;
};

// One endpoint: context, PD, CQ (send and receive), an RC QP, a registered buffer.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* ch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<std::uint8_t> buf;
  ibv_mr* mr = nullptr;

  bool open(std::size_t bytes, ibv_context* shared = nullptr, std::uint32_t max_send_wr = 64, bool sig_all = false,
            bool channel = false, int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) {
    const Fv& f = fv();
    ctx = shared ? shared : open_ctx();
    if (!ctx) return false;
    pd = f.alloc_pd(ctx);
    if (channel) ch = f.create_comp_channel(ctx);
    cq = f.create_cq(ctx, 1024, this, ch, 0);
    buf.assign(bytes, 0);
    mr = f.reg_mr(pd, buf.data(), buf.size(), access);
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = sig_all;
    ia.cap.max_send_wr = max_send_wr;
    ia.cap.max_recv_wr = 64;
    ia.cap.max_send_sge = 2;
    ia.cap.max_recv_sge = 2;
    ia.cap.max_inline_data = 64;
    qp = f.create_qp(pd, &ia);
    return pd && cq && mr && qp;
  }
  Info info() const {
    Info i{};
    i.qpn = qp->qp_num;
    fv().api->query_gid(ctx, 1, 1, &i.gid);
    i.rkey = mr->rkey;
    i.addr = reinterpret_cast<std::uint64_t>(buf.data());
    return i;
  }
  int init() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    return fv().modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }
  static ibv_qp_attr rtr_attr(const Info& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = peer.qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    return a;
  }
  static constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  static constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  int connect(const Info& peer, int rnr_retry = 7) {
    if (int rc = init()) return rc;
    ibv_qp_attr a = rtr_attr(peer);
    if (int rc = fv().modify_qp(qp, &a, kRtrMask)) return rc;
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = 14;
    s.retry_cnt = 7;
    s.rnr_retry = rnr_retry;
    s.max_rd_atomic = 1;
    return fv().modify_qp(qp, &s, kRtsMask);
  }
  int write(std::uint64_t id, ibv_wr_opcode op, std::size_t off, std::size_t len, const Info& peer,
            std::uint64_t roff, std::uint32_t imm = 0, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_sge s{reinterpret_cast<std::uint64_t>(buf.data() + off), static_cast<std::uint32_t>(len), mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &s;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = op;
    wr.send_flags = flags;
    wr.imm_data = imm;
    wr.wr.rdma.remote_addr = peer.addr + roff;
    wr.wr.rdma.rkey = peer.rkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }
  int recv(std::uint64_t id, std::size_t off, std::size_t len) {
    ibv_sge s{reinterpret_cast<std::uint64_t>(buf.data() + off), static_cast<std::uint32_t>(len), mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(qp, &wr, &bad);
  }
  // Polls until n completions arrived or the time is up.
  std::vector<ibv_wc> wait(std::size_t n, int ms = 10000) {
    std::vector<ibv_wc> out;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (out.size() < n && std::chrono::steady_clock::now() < end) {
      ibv_wc wc[16];
      int k = ibv_poll_cq(cq, 16, wc);
      for (int i = 0; i < k; ++i) out.push_back(wc[i]);
      if (k == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return out;
  }
  void close() {
    const Fv& f = fv();
    if (qp) f.destroy_qp(qp);
    if (mr) f.dereg_mr(mr);
    if (cq) f.destroy_cq(cq);
    if (ch) f.destroy_comp_channel(ch);
    if (pd) f.dealloc_pd(pd);
    qp = nullptr;
    mr = nullptr;
    cq = nullptr;
    ch = nullptr;
    pd = nullptr;
  }
};

// Two QPs of one context, connected to each other through the fabric.
struct Loop {
  Side a, b;
  ibv_context* ctx = nullptr;
  bool open(std::size_t bytes, std::uint32_t max_send_wr = 64, bool sig_all = false, int rnr_retry = 7,
            bool channel = false) {
    ctx = open_ctx();
    if (!ctx || !a.open(bytes, ctx, max_send_wr, sig_all, channel) || !b.open(bytes, ctx)) return false;
    return a.connect(b.info(), rnr_retry) == 0 && b.connect(a.info(), rnr_retry) == 0;
  }
  ~Loop() {
    a.close();
    b.close();
    if (ctx) fv().api->close_device(ctx);
  }
};

bool io(int fd, void* p, std::size_t n, bool wr) {
  auto* c = static_cast<char*>(p);
  while (n) {
    ssize_t k = wr ? ::write(fd, c, n) : ::read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

TEST(Fakeverbs, DeviceAndPortQueriesThroughBraidsLoader) {
  const iv::Api* a = fv().api;
  ASSERT_NE(a, nullptr);
  int n = 0;
  ibv_device** list = a->get_device_list(&n);
  ASSERT_EQ(n, 1);
  EXPECT_STREQ(a->get_device_name(list[0]), "fakeverbs0");
  ibv_context* c = a->open_device(list[0]);
  a->free_device_list(list);
  ASSERT_NE(c, nullptr);
  ibv_device_attr da{};
  ASSERT_EQ(a->query_device(c, &da), 0);
  EXPECT_EQ(da.max_qp_wr, 16384);
  EXPECT_EQ(da.max_sge, 16);
  EXPECT_EQ(da.phys_port_cnt, 1);
  ibv_port_attr pa;
  std::memset(&pa, 0xab, sizeof pa);
  ASSERT_EQ(a->query_port(c, 1, &pa), 0);
  EXPECT_EQ(pa.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(pa.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(pa.lid, 0);
  EXPECT_EQ(pa.gid_tbl_len, 2);
  EXPECT_EQ(pa.flags, 0);  // past the compat struct: zeroed by the compat path
  ibv_gid g0{}, g1{};
  ASSERT_EQ(a->query_gid(c, 1, 0, &g0), 0);
  ASSERT_EQ(a->query_gid(c, 1, 1, &g1), 0);
  EXPECT_EQ(g0.raw[0], 0xfe);
  EXPECT_EQ(g0.raw[1], 0x80);
  const std::uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  EXPECT_EQ(std::memcmp(g1.raw, mapped, 16), 0);
  ibv_gid g2{};
  EXPECT_NE(a->query_gid(c, 1, 2, &g2), 0);
  EXPECT_EQ(a->close_device(c), 0);
}

TEST(Fakeverbs, EnvironmentSelectsInfinibandDownPortAndAddress) {
  const iv::Api* a = fv().api;
  ASSERT_NE(a, nullptr);
  ::setenv("FAKEVERBS_LINK", "ib", 1);
  ::setenv("FAKEVERBS_LID", "7", 1);
  ::setenv("FAKEVERBS_PORT_STATE", "down", 1);
  ibv_context* ib = open_ctx();
  ::unsetenv("FAKEVERBS_LINK");
  ::unsetenv("FAKEVERBS_LID");
  ::unsetenv("FAKEVERBS_PORT_STATE");
  ::setenv("FAKEVERBS_GID_IPV4", "10.0.0.2", 1);
  ibv_context* eth = open_ctx();
  ::unsetenv("FAKEVERBS_GID_IPV4");
  ASSERT_NE(ib, nullptr);
  ASSERT_NE(eth, nullptr);
  ibv_port_attr pa{};
  ASSERT_EQ(a->query_port(ib, 1, &pa), 0);
  EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_EQ(pa.lid, 7);
  EXPECT_EQ(pa.state, IBV_PORT_DOWN);
  ibv_gid g{};
  EXPECT_NE(a->query_gid(ib, 1, 1, &g), 0);  // IB: GID 0 only
  ASSERT_EQ(a->query_gid(eth, 1, 1, &g), 0);
  EXPECT_EQ(g.raw[12], 10);
  EXPECT_EQ(g.raw[15], 2);
  a->close_device(ib);
  a->close_device(eth);
}

TEST(Fakeverbs, QpStateMachineChecksWhatAnHcaChecks) {
  const Fv& f = fv();
  ASSERT_NE(f.api, nullptr);
  Side s, peer;
  ASSERT_TRUE(s.open(4096));
  ASSERT_TRUE(peer.open(4096, s.ctx));
  EXPECT_EQ(s.write(1, IBV_WR_RDMA_WRITE, 0, 8, peer.info(), 0), EINVAL);  // RESET
  EXPECT_EQ(s.recv(1, 0, 8), EINVAL);                                       // RESET
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  EXPECT_EQ(f.modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);  // no ACCESS_FLAGS
  ASSERT_EQ(s.init(), 0);
  EXPECT_EQ(s.recv(1, 0, 8), 0);  // receives may be posted from INIT
  ibv_qp_attr r = Side::rtr_attr(peer.info());
  EXPECT_EQ(f.modify_qp(s.qp, &r, Side::kRtrMask & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
  r.ah_attr.is_global = 0;  // RoCE without a GRH: the classic RTR failure
  r.ah_attr.dlid = 1;
  EXPECT_EQ(f.modify_qp(s.qp, &r, Side::kRtrMask), EINVAL);
  r = Side::rtr_attr(peer.info());
  std::memset(&r.ah_attr.grh.dgid, 0, sizeof r.ah_attr.grh.dgid);
  EXPECT_EQ(f.modify_qp(s.qp, &r, Side::kRtrMask), EINVAL);
  r = Side::rtr_attr(peer.info());
  r.ah_attr.grh.sgid_index = 5;
  EXPECT_EQ(f.modify_qp(s.qp, &r, Side::kRtrMask), EINVAL);
  r = Side::rtr_attr(peer.info());
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(f.modify_qp(s.qp, &rts, Side::kRtsMask), EINVAL);  // INIT → RTS skips RTR
  ASSERT_EQ(f.modify_qp(s.qp, &r, Side::kRtrMask), 0);
  EXPECT_EQ(s.write(1, IBV_WR_RDMA_WRITE, 0, 8, peer.info(), 0), EINVAL);  // RTR: no sends
  EXPECT_EQ(f.modify_qp(s.qp, &rts, Side::kRtsMask & ~IBV_QP_SQ_PSN), EINVAL);
  ASSERT_EQ(f.modify_qp(s.qp, &rts, Side::kRtsMask), 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(f.query_qp(s.qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(q.dest_qp_num, peer.qp->qp_num);
  EXPECT_EQ(s.write(1, IBV_WR_RDMA_READ, 0, 8, peer.info(), 0), EINVAL);  // not emulated
  ibv_qp_attr e{};
  e.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(f.modify_qp(s.qp, &e, IBV_QP_STATE), 0);
  auto wcs = s.wait(1);  // the receive posted in INIT flushes
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  s.close();
  peer.close();
  f.api->close_device(s.ctx);
}

// The child: one QP of its own process, receives what the parent sends and checks it.
int child_receiver(int sock) {
  constexpr std::size_t kBig = 16u << 20;
  Side s;
  if (!s.open(kBig + 8192)) return 10;
  Info mine = s.info(), peer{};
  if (!io(sock, &mine, sizeof mine, true) || !io(sock, &peer, sizeof peer, false)) return 11;
  if (s.connect(peer)) return 13;
  for (int i = 0; i < 3; ++i)
    if (s.recv(100 + i, 4096 + 1024 * i, 1024)) return 12;
  char go = 1;
  if (!io(sock, &go, 1, true)) return 14;
  // Expected, in order: write-with-imm (0 bytes), send (100 bytes), write-with-imm after the
  // 16 MiB write (the "done" notification).
  auto wcs = s.wait(3, 30000);
  if (wcs.size() != 3) return 20;
  if (wcs[0].status || wcs[0].opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wcs[0].wc_flags & IBV_WC_WITH_IMM) ||
      wcs[0].imm_data != htonl(7) || wcs[0].byte_len != 0 || wcs[0].wr_id != 100 || wcs[0].src_qp != peer.qpn)
    return 21;
  if (wcs[1].status || wcs[1].opcode != IBV_WC_RECV || wcs[1].byte_len != 100 || wcs[1].wr_id != 101) return 22;
  if (wcs[2].status || wcs[2].opcode != IBV_WC_RECV_RDMA_WITH_IMM || wcs[2].imm_data != htonl(9) ||
      wcs[2].byte_len != 16) return 23;
  for (int i = 0; i < 4096; ++i)
    if (s.buf[i] != static_cast<std::uint8_t>(i * 7)) return 30;
  for (int i = 0; i < 100; ++i)
    if (s.buf[5120 + i] != static_cast<std::uint8_t>(i + 1)) return 31;
  for (std::size_t i = 0; i < kBig; ++i)
    if (s.buf[8192 + i] != static_cast<std::uint8_t>(i * 13 + (i >> 20))) return 32;
  if (!io(sock, &go, 1, true)) return 15;
  s.close();
  fv().api->close_device(s.ctx);
  return 0;
}

pid_t fork_child(int* sock, int (*body)(int)) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    ::alarm(60);  // never outlive a hung test
    ::_exit(body(sv[1]));
  }
  ::close(sv[1]);
  *sock = sv[0];
  return pid;
}

int exit_code(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(Fakeverbs, TwoProcessesWriteWriteImmSendAnd16MiBInOrder) {
  ASSERT_NE(fv().api, nullptr);
  constexpr std::size_t kBig = 16u << 20;
  int sock = -1;
  pid_t pid = fork_child(&sock, child_receiver);
  ASSERT_GT(pid, 0);
  Side s;
  ASSERT_TRUE(s.open(kBig + 8192));
  Info mine = s.info(), peer{};
  ASSERT_TRUE(io(sock, &peer, sizeof peer, false));
  ASSERT_TRUE(io(sock, &mine, sizeof mine, true));
  ASSERT_EQ(s.connect(peer), 0);
  char go = 0;
  ASSERT_TRUE(io(sock, &go, 1, false)) << "the receiving process exited with " << exit_code(pid);
  for (int i = 0; i < 4096; ++i) s.buf[i] = static_cast<std::uint8_t>(i * 7);
  for (int i = 0; i < 100; ++i) s.buf[5120 + i] = static_cast<std::uint8_t>(i + 1);
  for (std::size_t i = 0; i < kBig; ++i) s.buf[8192 + i] = static_cast<std::uint8_t>(i * 13 + (i >> 20));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(s.write(1, IBV_WR_RDMA_WRITE, 0, 4096, peer, 0), 0);
  ASSERT_EQ(s.write(2, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 0, peer, 0, htonl(7)), 0);
  ASSERT_EQ(s.write(3, IBV_WR_SEND, 5120, 100, peer, 0), 0);
  ASSERT_EQ(s.write(4, IBV_WR_RDMA_WRITE, 8192, kBig, peer, 8192), 0);
  ASSERT_EQ(s.write(5, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 16, peer, 7168, htonl(9)), 0);  // a spare area
  auto wcs = s.wait(5, 30000);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(wcs.size(), 5u);
  const ibv_wc_opcode ops[5] = {IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << i;
    EXPECT_EQ(wcs[i].wr_id, static_cast<std::uint64_t>(i + 1));
    EXPECT_EQ(wcs[i].opcode, ops[i]);
  }
  ASSERT_TRUE(io(sock, &go, 1, false));
  EXPECT_EQ(exit_code(pid), 0) << "the receiving process found wrong completions or data (its exit code says which)";
  ::close(sock);
  std::printf("[          ] 16 MiB + 3 small messages between processes: %.1f ms\n", ms);
  s.close();
  fv().api->close_device(s.ctx);
}

TEST(Fakeverbs, BadRkeyBoundsOrAccessIsRemoteAccessErrorThenFlush) {
  for (int variant = 0; variant < 3; ++variant) {
    Loop l;
    ASSERT_TRUE(l.open(8192));
    Info peer = l.b.info();
    if (variant == 0) peer.rkey ^= 0x100;  // names no MR
    std::size_t roff = variant == 1 ? 8192 - 16 : 0;  // 32 bytes at the end: past the MR
    ibv_mr* ro = nullptr;  // an MR without REMOTE_WRITE
    if (variant == 2) {
      ro = fv().reg_mr(l.b.pd, l.b.buf.data(), 4096, IBV_ACCESS_LOCAL_WRITE);
      ASSERT_NE(ro, nullptr);
      peer.rkey = ro->rkey;
    }
    ASSERT_EQ(l.a.write(1, IBV_WR_RDMA_WRITE, 0, 32, peer, roff), 0);
    ASSERT_EQ(l.a.write(2, IBV_WR_RDMA_WRITE, 0, 8, l.b.info(), 0), 0);
    auto wcs = l.a.wait(2);
    ASSERT_EQ(wcs.size(), 2u) << variant;
    EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << variant;
    EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR) << variant;
    EXPECT_EQ(l.a.qp->state, IBV_QPS_ERR);
    EXPECT_EQ(l.b.qp->state, IBV_QPS_ERR);
    if (ro) fv().dereg_mr(ro);
  }
}

TEST(Fakeverbs, NoReceivePostedIsRnrRetryExceeded) {
  Loop l;
  ASSERT_TRUE(l.open(4096, 64, false, /*rnr_retry=*/1));
  ASSERT_EQ(l.a.write(1, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 8, l.b.info(), 0, 1), 0);
  auto wcs = l.a.wait(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(l.a.qp->state, IBV_QPS_ERR);
}

TEST(Fakeverbs, RnrRetriesUntilTheReceiveIsPosted) {
  Loop l;
  ASSERT_TRUE(l.open(4096));  // rnr_retry 7: forever
  l.a.buf[0] = 42;
  ASSERT_EQ(l.a.write(1, IBV_WR_SEND, 0, 1, l.b.info(), 0), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(l.a.wait(1, 1).empty());
  ASSERT_EQ(l.b.recv(9, 100, 16), 0);
  auto sent = l.a.wait(1), got = l.b.wait(1);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].byte_len, 1u);
  EXPECT_EQ(l.b.buf[100], 42);
}

TEST(Fakeverbs, SendLongerThanTheReceiveIsLengthError) {
  Loop l;
  ASSERT_TRUE(l.open(4096));
  ASSERT_EQ(l.b.recv(9, 0, 8), 0);
  ASSERT_EQ(l.a.write(1, IBV_WR_SEND, 0, 64, l.b.info(), 0), 0);
  auto sent = l.a.wait(1), got = l.b.wait(1);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(got[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(got[0].wr_id, 9u);
}

int child_killed(int sock) {
  Side s;
  if (!s.open(4096)) return 10;
  Info mine = s.info(), peer{};
  if (!io(sock, &mine, sizeof mine, true) || !io(sock, &peer, sizeof peer, false)) return 11;
  if (s.connect(peer)) return 13;
  char go = 1;
  io(sock, &go, 1, true);
  ::pause();  // killed here
  return 0;
}

TEST(Fakeverbs, KilledPeerIsRetryExceededThenFlush) {
  ASSERT_NE(fv().api, nullptr);
  int sock = -1;
  pid_t pid = fork_child(&sock, child_killed);
  ASSERT_GT(pid, 0);
  ::setenv("FAKEVERBS_RETRY_MS", "300", 1);
  Side s;
  bool ok = s.open(4096);
  ::unsetenv("FAKEVERBS_RETRY_MS");
  ASSERT_TRUE(ok);
  Info mine = s.info(), peer{};
  ASSERT_TRUE(io(sock, &peer, sizeof peer, false));
  ASSERT_TRUE(io(sock, &mine, sizeof mine, true));
  ASSERT_EQ(s.connect(peer), 0);
  char go = 0;
  ASSERT_TRUE(io(sock, &go, 1, false));
  ASSERT_EQ(s.write(1, IBV_WR_RDMA_WRITE, 0, 8, peer, 0), 0);
  auto first = s.wait(1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].status, IBV_WC_SUCCESS);  // the peer was alive
  ::kill(pid, SIGKILL);
  EXPECT_EQ(exit_code(pid), 128 + SIGKILL);
  ::close(sock);
  ASSERT_EQ(s.recv(7, 0, 8), 0);
  ASSERT_EQ(s.write(2, IBV_WR_RDMA_WRITE, 0, 8, peer, 0, 0, 0), 0);  // unsignaled: errors complete anyway
  ASSERT_EQ(s.write(3, IBV_WR_RDMA_WRITE, 0, 8, peer, 0), 0);
  auto wcs = s.wait(3);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  for (int i = 1; i < 3; ++i) EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
  ASSERT_EQ(s.write(4, IBV_WR_RDMA_WRITE, 0, 8, peer, 0), 0);  // later WRs flush too
  auto later = s.wait(1);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].status, IBV_WC_WR_FLUSH_ERR);
  s.close();
  fv().api->close_device(s.ctx);
}

TEST(Fakeverbs, SilentPeerTimesOutAsRetryExceeded) {
  // FAKEVERBS_DROP_AFTER=0 on the target's context: it never answers, the socket stays.
  ::setenv("FAKEVERBS_RETRY_MS", "200", 1);
  Side a;
  bool ok = a.open(4096);
  ::setenv("FAKEVERBS_DROP_AFTER", "0", 1);
  Side b;
  ok = ok && b.open(4096);
  ::unsetenv("FAKEVERBS_DROP_AFTER");
  ::unsetenv("FAKEVERBS_RETRY_MS");
  ASSERT_TRUE(ok);
  ASSERT_EQ(a.connect(b.info()), 0);
  ASSERT_EQ(b.connect(a.info()), 0);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(a.write(1, IBV_WR_RDMA_WRITE, 0, 8, b.info(), 0), 0);
  auto wcs = a.wait(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  a.close();
  b.close();
  fv().api->close_device(a.ctx);
  fv().api->close_device(b.ctx);
}

TEST(Fakeverbs, CompletionChannelWakesAPollSleeperAfterReqNotify) {
  const Fv& f = fv();
  Loop l;
  ASSERT_TRUE(l.open(4096, 64, false, 7, /*channel=*/true));
  int fd = l.a.ch->fd;
  ASSERT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
  ibv_cq* ev = nullptr;
  void* evctx = nullptr;
  EXPECT_EQ(f.get_cq_event(l.a.ch, &ev, &evctx), -1);
  EXPECT_EQ(errno, EAGAIN);
  // Not armed: a completion raises no event.
  ASSERT_EQ(l.a.write(1, IBV_WR_RDMA_WRITE, 0, 8, l.b.info(), 0), 0);
  ASSERT_EQ(l.a.wait(1).size(), 1u);
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 50), 0);
  // Armed, then the classic pattern: poll (empty), sleep on the fd, woken by the completion.
  ASSERT_EQ(ibv_req_notify_cq(l.a.cq, 0), 0);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(l.a.cq, 1, &wc), 0);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    l.a.write(2, IBV_WR_RDMA_WRITE, 0, 8, l.b.info(), 0);
  });
  EXPECT_EQ(::poll(&p, 1, 5000), 1);
  later.join();
  ASSERT_EQ(f.get_cq_event(l.a.ch, &ev, &evctx), 0);
  EXPECT_EQ(ev, l.a.cq);
  EXPECT_EQ(evctx, &l.a);
  EXPECT_EQ(f.destroy_cq(l.a.cq), EBUSY);  // a QP still uses it, and the event is unacked
  f.ack_cq_events(l.a.cq, 1);
  EXPECT_EQ(ibv_poll_cq(l.a.cq, 1, &wc), 1);
  EXPECT_EQ(wc.wr_id, 2u);
}

TEST(Fakeverbs, UnsignaledWritesCompleteSilentlyInOrder) {
  Loop l;
  ASSERT_TRUE(l.open(4096));
  for (int i = 0; i < 3; ++i) {
    l.a.buf[i] = static_cast<std::uint8_t>(i + 1);
    ASSERT_EQ(l.a.write(10 + i, IBV_WR_RDMA_WRITE, i, 1, l.b.info(), 100 + i, 0, i == 2 ? IBV_SEND_SIGNALED : 0), 0);
  }
  auto wcs = l.a.wait(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 12u);
  EXPECT_TRUE(l.a.wait(1, 50).empty());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(l.b.buf[100 + i], i + 1);
}

TEST(Fakeverbs, InlineSendCopiesAtPostTime) {
  Loop l;
  ASSERT_TRUE(l.open(4096));
  ASSERT_EQ(l.b.recv(5, 0, 64), 0);
  std::memcpy(l.a.buf.data(), "inline!", 8);
  ASSERT_EQ(l.a.write(1, IBV_WR_SEND, 0, 8, l.b.info(), 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE), 0);
  std::memset(l.a.buf.data(), 0, 8);  // after the post: must not matter
  EXPECT_EQ(l.a.write(2, IBV_WR_SEND, 0, 65, l.b.info(), 0, 0, IBV_SEND_INLINE), EINVAL);  // > max_inline_data
  ASSERT_EQ(l.a.wait(1).size(), 1u);
  auto got = l.b.wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, 8u);
  EXPECT_STREQ(reinterpret_cast<char*>(l.b.buf.data()), "inline!");
}

TEST(Fakeverbs, SendQueueOverflowIsEnomemWithBadWr) {
  Loop l;
  ASSERT_TRUE(l.open(4096, /*max_send_wr=*/2));
  ibv_sge s{reinterpret_cast<std::uint64_t>(l.a.buf.data()), 8, l.a.mr->lkey};
  ibv_send_wr wr[3]{};
  for (int i = 0; i < 3; ++i) {
    wr[i].wr_id = i;
    wr[i].sg_list = &s;
    wr[i].num_sge = 1;
    wr[i].opcode = IBV_WR_RDMA_WRITE;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    wr[i].wr.rdma.remote_addr = l.b.info().addr;
    wr[i].wr.rdma.rkey = l.b.info().rkey;
    if (i < 2) wr[i].next = &wr[i + 1];
  }
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(l.a.qp, wr, &bad), ENOMEM);
  EXPECT_EQ(bad, &wr[2]);
  EXPECT_EQ(l.a.wait(2).size(), 2u);
}

TEST(Fakeverbs, BadLkeyIsLocalProtectionError) {
  Loop l;
  ASSERT_TRUE(l.open(4096));
  ibv_sge s{reinterpret_cast<std::uint64_t>(l.a.buf.data()), 8, l.a.mr->lkey + 1};
  ibv_send_wr wr{};
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = l.b.info().addr;
  wr.wr.rdma.rkey = l.b.info().rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(l.a.qp, &wr, &bad), 0);
  auto wcs = l.a.wait(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR);
}

// GPUDirect RDMA through dma-buf, as braid's emulated GPU runtime will use it: device memory
// is a memfd mapped MAP_SHARED at the device pointer; the transport registers part of it with
// ibv_reg_dmabuf_mr(offset into the allocation, iova = the device pointer) and addresses it by
// iova on both sides.
struct Memfd {
  int fd = -1;
  std::uint8_t* at = nullptr;
  std::size_t bytes = 0;
  Memfd(const char* name, std::size_t n) : bytes(n) {
    fd = ::memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n)) != 0) return;
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) at = static_cast<std::uint8_t*>(p);
  }
  ~Memfd() {
    if (at) ::munmap(at, bytes);
    if (fd >= 0) ::close(fd);
  }
};

// How many mappings of the memfd named `name` this process has.
int mappings_of(const char* name) {
  std::ifstream maps("/proc/self/maps");
  std::string line, needle = std::string("/memfd:") + name;
  int n = 0;
  while (std::getline(maps, line))
    if (line.find(needle) != std::string::npos) ++n;
  return n;
}

int post_write(ibv_qp* qp, std::uint64_t id, const ibv_sge& sge, std::uint64_t remote_addr, std::uint32_t rkey) {
  ibv_sge s = sge;
  ibv_send_wr wr{};
  wr.wr_id = id;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

TEST(Fakeverbs, BraidsLoaderFindsRegDmabufMr) {
  ASSERT_NE(fv().api, nullptr);
  EXPECT_NE(fv().api->reg_dmabuf_mr, nullptr);
}

TEST(Fakeverbs, DmabufMrIsAddressedByIovaAndReachesTheMemoryBehindTheFd) {
  const iv::Api* api = fv().api;
  ASSERT_NE(api, nullptr);
  ASSERT_NE(api->reg_dmabuf_mr, nullptr);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  Memfd gpu("fvtest-dmabuf", 3 * page);  // the "device allocation", mapped at A
  ASSERT_NE(gpu.at, nullptr) << std::strerror(errno);
  std::uint8_t* A = gpu.at;
  for (std::size_t i = 0; i < 3 * page; ++i) A[i] = static_cast<std::uint8_t>(i * 5 + 3);
  const int before = mappings_of("fvtest-dmabuf");
  Loop l;
  ASSERT_TRUE(l.open(4 * page));
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  // The middle two pages, addressed at their own address (the device pointer), on b (the
  // target) and on a (a source); then on b again at a decoy iova: the address of other memory
  // (a's ordinary buffer), so a fake that used the iova as a pointer would write there.
  const std::uint64_t iova = reinterpret_cast<std::uint64_t>(A) + page;
  std::vector<std::uint8_t> decoy_mem(2 * page + page);
  const std::uint64_t decoy = (reinterpret_cast<std::uint64_t>(decoy_mem.data()) + page - 1) & ~(page - 1);
  ibv_mr* dm_b = api->reg_dmabuf_mr(l.b.pd, page, 2 * page, iova, gpu.fd, access);
  const int dup_fd = ::dup(gpu.fd);  // a dup, as the GPU runtime hands out, closed at once
  ibv_mr* dm_a = api->reg_dmabuf_mr(l.a.pd, page, 2 * page, iova, dup_fd, access);
  ::close(dup_fd);
  ibv_mr* dm_d = api->reg_dmabuf_mr(l.b.pd, page, 2 * page, decoy, gpu.fd, access);
  ASSERT_NE(dm_b, nullptr) << std::strerror(errno);
  ASSERT_NE(dm_a, nullptr) << std::strerror(errno);
  ASSERT_NE(dm_d, nullptr) << std::strerror(errno);
  ::close(gpu.fd);  // the registrations outlive the fd
  gpu.fd = -1;
  EXPECT_EQ(dm_b->length, 2 * page);
  EXPECT_EQ(reinterpret_cast<std::uint64_t>(dm_b->addr), page);  // libibverbs sets addr = offset
  EXPECT_EQ(dm_b->pd, l.b.pd);
  EXPECT_EQ(mappings_of("fvtest-dmabuf"), before + 3);
  const Info b = l.b.info();

  // A write from a's ordinary MR to iova + 100 lands at A + page + 100.
  for (int i = 0; i < 64; ++i) l.a.buf[i] = static_cast<std::uint8_t>(0xa0 + i);
  ASSERT_EQ(post_write(l.a.qp, 1, {reinterpret_cast<std::uint64_t>(l.a.buf.data()), 64, l.a.mr->lkey}, iova + 100,
                       dm_b->rkey), 0);
  // Through the decoy iova: lands in A too, and the decoy memory stays untouched.
  ASSERT_EQ(post_write(l.a.qp, 2, {reinterpret_cast<std::uint64_t>(l.a.buf.data()), 64, l.a.mr->lkey},
                       decoy + page + 7, dm_d->rkey), 0);
  auto wcs = l.a.wait(2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(A[page + 100 + i], 0xa0 + i) << i;
    EXPECT_EQ(A[2 * page + 7 + i], 0xa0 + i) << i;
  }
  EXPECT_EQ(A[page + 99], static_cast<std::uint8_t>((page + 99) * 5 + 3));  // only those bytes
  EXPECT_EQ(A[page + 164], static_cast<std::uint8_t>((page + 164) * 5 + 3));
  for (std::size_t i = 0; i < 2 * page; ++i)
    ASSERT_EQ(decoy_mem[decoy - reinterpret_cast<std::uint64_t>(decoy_mem.data()) + i], 0) << i;

  // A write whose source is the dma-buf MR (sge.addr = iova + k) sends A + page + k.
  const std::size_t k = page - 40;  // across the page boundary inside the MR
  ASSERT_EQ(post_write(l.a.qp, 3, {iova + k, 200, dm_a->lkey}, b.addr + 16, b.rkey), 0);
  // A SEND received into the dma-buf MR scatters there too.
  ibv_sge rs{iova + 1000, 32, dm_b->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 77;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(ibv_post_recv(l.b.qp, &rwr, &rbad), 0);
  ASSERT_EQ(l.a.write(4, IBV_WR_SEND, 0, 32, b, 0), 0);
  wcs = l.a.wait(2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  auto got = l.b.wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].wr_id, 77u);
  for (std::size_t i = 0; i < 200; ++i) EXPECT_EQ(l.b.buf[16 + i], A[page + k + i]) << i;
  for (int i = 0; i < 32; ++i) EXPECT_EQ(A[page + 1000 + i], 0xa0 + i) << i;

  // Past iova + length: refused as for any MR, nothing lands.
  const std::uint8_t last = A[3 * page - 1];
  ASSERT_EQ(post_write(l.a.qp, 5, {reinterpret_cast<std::uint64_t>(l.a.buf.data()), 32, l.a.mr->lkey},
                       iova + 2 * page - 16, dm_b->rkey), 0);
  wcs = l.a.wait(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(A[3 * page - 1], last);

  EXPECT_EQ(api->dereg_mr(dm_a), 0);
  EXPECT_EQ(api->dereg_mr(dm_b), 0);
  EXPECT_EQ(api->dereg_mr(dm_d), 0);
  EXPECT_EQ(mappings_of("fvtest-dmabuf"), before);  // dereg unmaps
}

TEST(Fakeverbs, DmabufMrRefusalsAndTheNoDmabufSwitch) {
  const iv::Api* api = fv().api;
  ASSERT_NE(api, nullptr);
  ASSERT_NE(api->reg_dmabuf_mr, nullptr);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  Memfd gpu("fvtest-dmabuf-refusals", 2 * page);
  ASSERT_NE(gpu.at, nullptr);
  const std::uint64_t iova = reinterpret_cast<std::uint64_t>(gpu.at);
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_context* ctx = open_ctx();
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = fv().alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  auto refused = [&](std::uint64_t off, std::size_t len, std::uint64_t va, int fd, int acc) {
    errno = 0;
    ibv_mr* mr = api->reg_dmabuf_mr(pd, off, len, va, fd, acc);
    if (mr != nullptr) {
      api->dereg_mr(mr);
      return -1;
    }
    return errno;
  };
  EXPECT_EQ(refused(0, page, iova, -1, access), EBADF);
  EXPECT_EQ(refused(0, page, iova + 8, gpu.fd, access), EINVAL);  // iova and offset elsewhere in a page
  EXPECT_EQ(refused(page, 2 * page, iova + page, gpu.fd, access), EINVAL);  // past the buffer's end
  EXPECT_EQ(refused(0, page, iova, gpu.fd, IBV_ACCESS_REMOTE_WRITE), EINVAL);  // remote without local write
  EXPECT_EQ(refused(0, page, iova, gpu.fd, access | IBV_ACCESS_ON_DEMAND), EINVAL);
  EXPECT_EQ(refused(0, 0, iova, gpu.fd, access), EINVAL);  // mmap of nothing
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  EXPECT_EQ(refused(0, page, iova, sv[0], access), ENODEV);  // not mappable
  ::close(sv[0]);
  ::close(sv[1]);
  const int ro = ::open(("/proc/self/fd/" + std::to_string(gpu.fd)).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  EXPECT_EQ(refused(0, page, iova, ro, access), EACCES);  // not open for writing
  ::close(ro);
  EXPECT_EQ(refused(8, page, iova + 8, gpu.fd, access), -1);  // unaligned but in the same place: fine
  fv().dealloc_pd(pd);
  api->close_device(ctx);

  // FAKEVERBS_NO_DMABUF=1, read by ibv_open_device as the other switches: that context refuses.
  ::setenv("FAKEVERBS_NO_DMABUF", "1", 1);
  ctx = open_ctx();
  ::unsetenv("FAKEVERBS_NO_DMABUF");
  ASSERT_NE(ctx, nullptr);
  pd = fv().alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  EXPECT_EQ(refused(0, page, iova, gpu.fd, access), EOPNOTSUPP);
  EXPECT_EQ(mappings_of("fvtest-dmabuf-refusals"), 1);  // no mapping left behind by any refusal
  fv().dealloc_pd(pd);
  api->close_device(ctx);
}

}  // namespace

#else

TEST(Fakeverbs, NeedsVerbsHeaders) {
  GTEST_SKIP() << "built without libibverbs headers (BRAID_HAVE_IBVERBS=0): no fakeverbs provider to test";
}

#endif
