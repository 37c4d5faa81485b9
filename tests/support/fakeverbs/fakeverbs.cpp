// fakeverbs: a test-only libibverbs provider. It exports the libibverbs entry points braid
// calls (src/transport/ibverbs/ibv_lib.hpp) and emulates one RC-capable HCA per opened
// context, so that the verbs transport can be proven on hosts without RDMA hardware (the
// kernel here cannot load soft-RoCE). braid loads it through BRAID_IBVERBS_LIBRARY. Never
// installed, never linked into braid.
//
// The "wire" is Unix-domain datagram sockets (reliable and ordered on Linux, path-based so
// they work across network namespaces that share a filesystem): every QP binds
// <fabric>/<port-address>/<qpn>, and a QP in RTR sends to the path named by its AV
// (dgid or dlid) and dest_qp_num. A progress thread per context (the "HCA", started with
// the first QP) moves the bytes, so a process that is not calling verbs still receives
// writes and acks, as with a real NIC. Writes land in the target's memory while it runs:
// that is what a NIC does. The fake's own structures are guarded by one mutex per context.
//
// RC emulation, per QP: one message on the wire at a time (stop-and-wait: all fragments of
// the head send WR, ≤ 64 KiB each, then wait for the target's ACK or NAK). Messages apply in
// posting order. The target checks state (RTR/RTS, else it drops: the sender times out with
// IBV_WC_RETRY_EXC_ERR), rkey/PD/access/bounds (NAK → IBV_WC_REM_ACCESS_ERR, both QPs to
// ERR), receive availability for SEND and WRITE_WITH_IMM (RNR NAK, retried after ~min_rnr
// up to rnr_retry times, 7 = forever), receive length (IBV_WC_LOC_LEN_ERR at the target,
// IBV_WC_REM_INV_REQ_ERR at the sender). RDMA_READ and atomics are not supported
// (post_send returns EINVAL). No SRQ, UD or UC. RLIMIT_MEMLOCK is not emulated.
//
// Memory regions: keyed by lkey == rkey, per context. Every address the HCA turns into memory
// (the SGEs it gathers for a send or write, the SGEs a SEND scatters into, the target of a
// write) is looked up in its MR when the bytes move, per fragment, under the context's lock:
// a key that no longer names an MR of that PD covering the range is LOC_PROT_ERR (local) or
// REM_ACCESS_ERR (remote), as on hardware that processes a WR after its MR was deregistered.
// IBV_SEND_INLINE copies from the SGE addresses with the CPU at post time, lkey unused.
//
// dma-buf MRs (ibv_reg_dmabuf_mr, rdma-core 34+): the fd is mmapped (MAP_SHARED, read/write)
// from the page holding `offset`, and work requests address the region as iova..iova+length;
// the HCA turns an address into host memory as mapping + (addr - iova). The fd is not kept (the
// caller may close it at once); ibv_dereg_mr unmaps. As libibverbs does, the MR's addr is
// `offset` (not the iova) and its length `length`. Refused as the kernel refuses: offset and
// iova in different places of their pages, or access bits beyond local/remote write, remote
// read/atomic and relaxed ordering (EINVAL); remote write without local write (EINVAL, as
// ibv_reg_mr); offset + length past the end of a regular file (EINVAL, the dma-buf's size);
// otherwise what fstat or mmap say (EBADF, ENODEV, EACCES...). What this proves: the verbs
// calls, the iova addressing of both sides (sge.addr and remote_addr), keys, bounds and access
// checks, registering only part of an allocation, closing the fd after registration, and that
// the bytes land in the memory behind the fd (any other mapping of it sees them). What it does
// not: the memory is host memory (a memfd), so there is no GPU BAR, no PCIe peer-to-peer path
// or ordering (a real NIC's writes to GPU memory are not ordered with the GPU's own accesses
// without a flush or fence; here they are plain stores), no dma-buf move_notify/invalidation,
// no pinning limits, and the CPU can read memory that on hardware it cannot (an inline send
// from a GPU address works here; on hardware the provider's memcpy would fault).
//
// fork: the progress thread is not inherited; a child must open its own device after fork
// (braid's tests fork before creating communicators). Contexts opened before fork must not
// be used in the child.
//
// Environment (read by ibv_open_device, and by ibv_get_device_list for the GUID):
//   FAKEVERBS_FABRIC=dir          fabric directory (default /tmp/fakeverbs-<uid>); every
//                                 process that should reach another must use the same one.
//   FAKEVERBS_LINK=eth|ib         port link layer (default eth = RoCE).
//   FAKEVERBS_LID=n               the port's LID when FAKEVERBS_LINK=ib (default 1; 0 on eth).
//   FAKEVERBS_GID_IPV4=a.b.c.d    address of GID index 1 (::ffff:a.b.c.d, RoCE only) and the
//                                 interface id of GID index 0 (fe80::2fa:ceff:<a.b.c.d>; IB: cfff);
//                                 default 127.0.0.1. Emulated hosts give each its own.
//   FAKEVERBS_PORT_STATE=down     the port reports IBV_PORT_DOWN (default ACTIVE).
//   FAKEVERBS_RETRY_MS=n          cap on the ACK timeout derived from timeout/retry_cnt
//                                 (default 2000); after it the WR gets IBV_WC_RETRY_EXC_ERR.
//   FAKEVERBS_FAIL_SEND_AFTER=n   the (n+1)-th send WR posted on one opened device (context) completes with
//                                 IBV_WC_RETRY_EXC_ERR and its QP goes to ERR.
//   FAKEVERBS_DROP_AFTER=n        after n data packets received, this process's HCAs stop
//                                 answering (a peer that vanishes without closing).
//   FAKEVERBS_RNR_ALWAYS=1        QPs of this process answer every SEND/WRITE_WITH_IMM
//                                 with an RNR NAK.
//   FAKEVERBS_ASYNC_PORT_ERR_AFTER_MS=n
//                                 n ms after the context's first QP is created, the port
//                                 goes DOWN and IBV_EVENT_PORT_ERR is posted on async_fd.
//   FAKEVERBS_NO_DMABUF=1         ibv_reg_dmabuf_mr on this context fails with EOPNOTSUPP (a
//                                 kernel or HCA without dma-buf support), for fallback paths.

#include <infiniband/verbs.h>

// verbs.h turns these into inline wrappers; the library defines the real functions.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#define FV_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxPacketPayload = 64 * 1024;
constexpr std::uint32_t kMagic = 0xFA4EB0B5;
constexpr int kGidCount = 2;  // RoCE: fe80::…, ::ffff:a.b.c.d; IB uses index 0 only
constexpr std::uint32_t kMaxQpWr = 16384;
constexpr std::uint32_t kMaxSge = 16;
constexpr std::uint32_t kMaxCqe = 65536;
constexpr std::uint32_t kMaxInline = 256;

long env_long(const char* name, long dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  long r = std::strtol(v, &end, 10);
  if (end == v || *end != '\0') {
    std::fprintf(stderr, "fakeverbs: %s=%s is not an integer; using %ld\n", name, v, dflt);
    return dflt;
  }
  return r;
}

struct Config {
  std::string fabric;
  bool ib = false;
  std::uint16_t lid = 0;
  in_addr ipv4{};
  bool port_down = false;
  long retry_ms = 2000;
  long fail_send_after = -1;
  long drop_after = -1;
  bool rnr_always = false;
  long port_err_after_ms = -1;
  bool no_dmabuf = false;
  ibv_gid gid[kGidCount]{};
};

Config read_config() {
  Config c;
  const char* fab = std::getenv("FAKEVERBS_FABRIC");
  c.fabric = (fab && *fab) ? fab : "/tmp/fakeverbs-" + std::to_string(::getuid());
  const char* link = std::getenv("FAKEVERBS_LINK");
  c.ib = link && std::strcmp(link, "ib") == 0;
  if (link && !c.ib && std::strcmp(link, "eth") != 0)
    std::fprintf(stderr, "fakeverbs: FAKEVERBS_LINK=%s is neither eth nor ib; using eth\n", link);
  c.lid = c.ib ? static_cast<std::uint16_t>(env_long("FAKEVERBS_LID", 1)) : 0;
  const char* ip = std::getenv("FAKEVERBS_GID_IPV4");
  if (!ip || ::inet_pton(AF_INET, ip, &c.ipv4) != 1) {
    if (ip) std::fprintf(stderr, "fakeverbs: FAKEVERBS_GID_IPV4=%s is not an IPv4 address; using 127.0.0.1\n", ip);
    ::inet_pton(AF_INET, "127.0.0.1", &c.ipv4);
  }
  const char* st = std::getenv("FAKEVERBS_PORT_STATE");
  c.port_down = st && std::strcmp(st, "down") == 0;
  c.retry_ms = env_long("FAKEVERBS_RETRY_MS", 2000);
  c.fail_send_after = env_long("FAKEVERBS_FAIL_SEND_AFTER", -1);
  c.drop_after = env_long("FAKEVERBS_DROP_AFTER", -1);
  c.rnr_always = env_long("FAKEVERBS_RNR_ALWAYS", 0) != 0;
  c.port_err_after_ms = env_long("FAKEVERBS_ASYNC_PORT_ERR_AFTER_MS", -1);
  c.no_dmabuf = env_long("FAKEVERBS_NO_DMABUF", 0) != 0;
  // GID 0: link-local with the IPv4 address as the low 32 bits, so hosts differ.
  std::uint8_t* g0 = c.gid[0].raw;
  g0[0] = 0xfe;
  g0[1] = 0x80;
  g0[8] = 0x02;
  g0[9] = 0xfa;
  g0[10] = c.ib ? 0xcf : 0xce;  // IB and RoCE ports never share a GID
  g0[11] = 0xff;
  std::memcpy(g0 + 12, &c.ipv4, 4);
  std::uint8_t* g1 = c.gid[1].raw;
  g1[10] = 0xff;
  g1[11] = 0xff;
  std::memcpy(g1 + 12, &c.ipv4, 4);
  return c;
}

std::string hex(const std::uint8_t* p, std::size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

std::string gid_dir(const Config& c, const ibv_gid& g) { return c.fabric + "/" + hex(g.raw, 16); }
std::string lid_dir(const Config& c, std::uint16_t lid) { return c.fabric + "/lid-" + std::to_string(lid); }

// Process-wide counter of the fault injection FAKEVERBS_DROP_AFTER.
std::atomic<long> g_packets_received{0};

enum PacketType : std::uint8_t { kData = 1, kAck = 2, kNak = 3 };
enum NakCode : std::uint32_t { kNakRnr = 1, kNakAccess = 2, kNakInvReq = 3, kNakOp = 4 };

struct Packet {
  std::uint32_t magic;
  std::uint8_t type;
  std::uint8_t opcode;  // ibv_wr_opcode of the message
  std::uint16_t pad;
  std::uint32_t src_qpn;
  std::uint32_t dst_qpn;
  std::uint32_t rkey;
  std::uint32_t imm;  // as passed (network order)
  std::uint32_t nak;
  std::uint32_t frag_len;
  std::uint64_t seq;
  std::uint64_t remote_addr;
  std::uint64_t total_len;
  std::uint64_t offset;
};

struct Ctx;
struct Cq;
struct CompChannel;

struct Pd {
  ibv_pd ib{};
};

struct Mr {
  ibv_mr ib{};
  int access = 0;
  std::uint64_t iova = 0;         // work requests address the region as iova..iova+length
  std::uint8_t* host = nullptr;   // where iova is in this process (== iova but for dma-buf MRs)
  void* map = nullptr;            // dma-buf MR: the mapping of its fd, unmapped by dereg
  std::size_t map_len = 0;
};

struct CompChannel {
  ibv_comp_channel ib{};
  int wfd = -1;
};

struct Cq {
  ibv_cq ib{};
  Ctx* ctx = nullptr;
  CompChannel* channel = nullptr;
  std::deque<ibv_wc> wcs;  // guarded by ctx->mu
  int capacity = 0;
  bool armed = false;
  bool overflowed = false;
  std::atomic<unsigned> events_delivered{0};
  std::atomic<unsigned> events_acked{0};
};

struct Wr {
  std::uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  bool signaled = true;
  std::vector<ibv_sge> sge;
  std::vector<std::uint8_t> inline_data;
  bool is_inline = false;
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0;
  std::uint32_t imm = 0;
  std::uint64_t len = 0;
  bool prot_err = false;   // an SGE no local MR covers: LOC_PROT_ERR when it reaches the head
  bool inject_fail = false;  // FAKEVERBS_FAIL_SEND_AFTER
};

struct Qp {
  ibv_qp ib{};
  Ctx* ctx = nullptr;
  ibv_qp_cap cap{};
  bool sig_all = false;
  int fd = -1;
  std::string path;
  // attributes set by modify_qp
  ibv_qp_attr attr{};
  std::string dest_path;
  // send side (stop-and-wait on the head WR)
  std::deque<Wr> sq;
  std::uint64_t next_seq = 0;
  std::uint64_t sent_off = 0;
  bool head_started = false;
  bool all_sent = false;
  Clock::time_point ack_deadline{};
  Clock::time_point resume_at{};
  int rnr_tries = 0;
  // receive side
  std::deque<Wr> rq;
  std::uint64_t expected_seq = 0;
  bool rejecting = false;  // the current message was NAKed: drop its remaining fragments
};

struct AsyncRecord {
  ibv_event_type type;
  void* element;
  int port;
};

struct Ctx {
  ibv_context* ib = nullptr;
  Config cfg;
  std::mutex mu;
  std::map<std::uint32_t, Qp*> qps;
  std::map<std::uint32_t, Mr*> mrs;  // by lkey == rkey
  std::uint32_t next_key = 0x100;
  std::thread hca;
  bool stop = false;
  int wake_r = -1, wake_w = -1;
  int async_w = -1;
  ibv_port_state port_state = IBV_PORT_ACTIVE;
  Clock::time_point port_err_at{};
  bool port_err_pending = false;
  std::deque<std::pair<std::string, Packet>> ctrl_out;  // ACK/NAKs the socket refused for now
  long sends_posted = 0;  // FAKEVERBS_FAIL_SEND_AFTER counts per opened device
  std::mt19937 rng{std::random_device{}()};
};

// ibv_context has no user pointer: the verbs_context and a back pointer share one block.
struct CtxBlock {
  verbs_context v;
  Ctx* self;
};

Ctx* ctx_of(ibv_context* c) {
  return reinterpret_cast<CtxBlock*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context))->self;
}

Qp* qp_of(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
Cq* cq_of(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }

void wake(Ctx* c) {
  char b = 1;
  (void)!::write(c->wake_w, &b, 1);
}

void post_async(Ctx* c, ibv_event_type t, void* element, int port) {
  AsyncRecord r{t, element, port};
  (void)!::write(c->async_w, &r, sizeof r);
}

// Adds a completion (ctx->mu held). A full CQ drops it and reports IBV_EVENT_CQ_ERR once.
void push_wc(Cq* cq, const ibv_wc& wc) {
  if (static_cast<int>(cq->wcs.size()) >= cq->capacity) {
    if (!cq->overflowed) post_async(cq->ctx, IBV_EVENT_CQ_ERR, cq, 0);
    cq->overflowed = true;
    return;
  }
  cq->wcs.push_back(wc);
  if (cq->armed && cq->channel != nullptr) {
    cq->armed = false;
    ibv_cq* p = &cq->ib;
    (void)!::write(cq->channel->wfd, &p, sizeof p);
  }
}

void complete(Qp* qp, bool send, const Wr& w, ibv_wc_status st, std::uint32_t src_qp = 0,
              std::uint64_t byte_len = 0) {
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = st;
  wc.qp_num = qp->ib.qp_num;
  wc.src_qp = src_qp;
  wc.byte_len = static_cast<std::uint32_t>(send ? w.len : byte_len);
  if (send) {
    wc.opcode = (w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) ? IBV_WC_RDMA_WRITE : IBV_WC_SEND;
  } else {
    wc.opcode = IBV_WC_RECV;
  }
  push_wc(cq_of(send ? qp->ib.send_cq : qp->ib.recv_cq), wc);
}

// QP to ERR: every outstanding WR completes with IBV_WC_WR_FLUSH_ERR (ctx->mu held).
void to_error(Qp* qp) {
  qp->ib.state = IBV_QPS_ERR;
  qp->attr.qp_state = IBV_QPS_ERR;
  for (const Wr& w : qp->sq) complete(qp, true, w, IBV_WC_WR_FLUSH_ERR);
  for (const Wr& w : qp->rq) complete(qp, false, w, IBV_WC_WR_FLUSH_ERR);
  qp->sq.clear();
  qp->rq.clear();
  qp->head_started = false;
}

// The head send WR failed: it completes with `st` (signaled or not), the rest flush.
void fail_head(Qp* qp, ibv_wc_status st) {
  Wr w = qp->sq.front();
  qp->sq.pop_front();
  complete(qp, true, w, st);
  to_error(qp);
}

sockaddr_un make_addr(const std::string& path, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), std::min(path.size(), sizeof(a.sun_path) - 1));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

// Nonblocking datagram send; returns 0, EAGAIN (try again later) or a fatal errno (peer gone).
int send_dgram(int fd, const std::string& to, const Packet& h, const iovec* payload, int n) {
  socklen_t alen;
  sockaddr_un a = make_addr(to, &alen);
  iovec iov[kMaxSge + 2];
  iov[0] = {const_cast<Packet*>(&h), sizeof h};
  for (int i = 0; i < n; ++i) iov[i + 1] = payload[i];
  msghdr m{};
  m.msg_name = &a;
  m.msg_namelen = alen;
  m.msg_iov = iov;
  m.msg_iovlen = static_cast<std::size_t>(n + 1);
  if (::sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return 0;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS || errno == EINTR) return EAGAIN;
  return errno;
}

void send_ctrl(Ctx* c, Qp* qp, const std::string& to, PacketType t, std::uint32_t src_qpn, std::uint64_t seq,
               std::uint32_t nak) {
  Packet h{};
  h.magic = kMagic;
  h.type = t;
  h.src_qpn = qp->ib.qp_num;
  h.dst_qpn = src_qpn;
  h.seq = seq;
  h.nak = nak;
  if (!c->ctrl_out.empty() || send_dgram(qp->fd, to, h, nullptr, 0) == EAGAIN) c->ctrl_out.emplace_back(to, h);
}

Mr* find_mr(Ctx* c, std::uint32_t key, ibv_pd* pd, std::uint64_t addr, std::uint64_t len, int need_access) {
  auto it = c->mrs.find(key);
  if (it == c->mrs.end()) return nullptr;
  Mr* m = it->second;
  if (m->ib.pd != pd) return nullptr;
  if ((m->access & need_access) != need_access) return nullptr;
  const std::uint64_t base = m->iova;
  if (addr < base || len > m->ib.length || addr - base > m->ib.length - len) return nullptr;
  return m;
}

// The memory behind `addr` of an MR find_mr returned for it: the HCA's address translation.
std::uint8_t* host_of(const Mr* m, std::uint64_t addr) { return m->host + (addr - m->iova); }

// What the "HCA" writes into a process's registered memory: its DMA, as a NIC's lands. Each
// naturally aligned 8-byte word lands whole (the CPU never sees half of one), in no order
// among the words and with no synchronisation with the CPU: the words are relaxed atomic
// stores, the unaligned ends plain bytes. A program may poll a word while a write to it
// lands (the verbs transport's credit word, read with an atomic load), as on hardware; under
// ThreadSanitizer that is an atomic against an atomic, so it needs no suppression, while a
// plain read of bytes that a write may still be landing in (no completion in between) is
// reported, as it should be. A function of its own, so that a report names it.
__attribute__((noinline)) void fakeverbs_dma_write(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<std::uint8_t*>(dst);
  const auto* s = static_cast<const std::uint8_t*>(src);
  const std::size_t head = std::min<std::size_t>(n, (8 - reinterpret_cast<std::uintptr_t>(d) % 8) % 8);
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 8; d += 8, s += 8, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, s, 8);
    __atomic_store_n(reinterpret_cast<std::uint64_t*>(d), w, __ATOMIC_RELAXED);
  }
  std::memcpy(d, s, n);
}

// Target side of one data packet (ctx->mu held). `from` is the sender QP's socket path.
void on_data(Ctx* c, Qp* qp, const Packet& h, const std::uint8_t* data, const std::string& from) {
  if (qp->ib.state != IBV_QPS_RTR && qp->ib.state != IBV_QPS_RTS) return;  // dropped: sender times out
  if (h.src_qpn != qp->attr.dest_qp_num) return;                            // not our peer: dropped
  if (h.seq < qp->expected_seq) {
    if (h.offset + h.frag_len >= h.total_len) send_ctrl(c, qp, from, kAck, h.src_qpn, h.seq, 0);  // duplicate
    return;
  }
  if (h.seq > qp->expected_seq) return;
  if (h.offset == 0) qp->rejecting = false;
  if (qp->rejecting) return;
  const bool needs_recv = h.opcode == IBV_WR_SEND || h.opcode == IBV_WR_SEND_WITH_IMM || h.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  const bool is_send = h.opcode == IBV_WR_SEND || h.opcode == IBV_WR_SEND_WITH_IMM;
  auto nak = [&](std::uint32_t code) {
    qp->rejecting = true;
    send_ctrl(c, qp, from, kNak, h.src_qpn, h.seq, code);
  };
  // The head receive fails with `status`, the sender is NAKed with `code`, the QP goes to ERR.
  auto reject_recv = [&](ibv_wc_status status, std::uint32_t code) {
    Wr w = qp->rq.front();
    qp->rq.pop_front();
    complete(qp, false, w, status, h.src_qpn);
    nak(code);
    to_error(qp);
  };
  if (h.offset == 0 && needs_recv) {
    if (qp->rq.empty() || c->cfg.rnr_always) return nak(kNakRnr);
    const Wr& r = qp->rq.front();
    if (is_send && h.total_len > r.len) return reject_recv(IBV_WC_LOC_LEN_ERR, kNakInvReq);
    if (r.prot_err) return reject_recv(IBV_WC_LOC_PROT_ERR, kNakOp);
  }
  if (is_send) {
    // Scatter this fragment into the receive's SGEs, each through its MR as it is now.
    const Wr& r = qp->rq.front();
    std::uint64_t off = h.offset, left = h.frag_len;
    const std::uint8_t* src = data;
    for (const ibv_sge& s : r.sge) {
      if (left == 0) break;
      if (off >= s.length) {
        off -= s.length;
        continue;
      }
      std::uint64_t n = std::min<std::uint64_t>(left, s.length - off);
      const Mr* m = find_mr(c, s.lkey, qp->ib.pd, s.addr + off, n, IBV_ACCESS_LOCAL_WRITE);
      if (m == nullptr) return reject_recv(IBV_WC_LOC_PROT_ERR, kNakOp);  // deregistered since the receive was posted
      fakeverbs_dma_write(host_of(m, s.addr + off), src, n);
      src += n;
      left -= n;
      off = 0;
    }
  } else if (h.total_len > 0) {
    // The whole message is checked on its first fragment (nothing lands of a refused one);
    // each fragment is translated through the MR as it is when it lands.
    std::uint64_t addr = h.remote_addr + h.offset;
    const Mr* m = find_mr(c, h.rkey, qp->ib.pd, h.offset == 0 ? h.remote_addr : addr,
                          h.offset == 0 ? h.total_len : h.frag_len, IBV_ACCESS_REMOTE_WRITE);
    if (m == nullptr) {
      nak(kNakAccess);
      to_error(qp);
      return;
    }
    fakeverbs_dma_write(host_of(m, addr), data, h.frag_len);
  }
  if (h.offset + h.frag_len < h.total_len) return;
  // Last fragment: the message is applied.
  if (needs_recv) {
    Wr r = qp->rq.front();
    qp->rq.pop_front();
    ibv_wc wc{};
    wc.wr_id = r.wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = is_send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM;
    wc.byte_len = static_cast<std::uint32_t>(h.total_len);
    wc.qp_num = qp->ib.qp_num;
    wc.src_qp = h.src_qpn;
    if (h.opcode != IBV_WR_SEND) {
      wc.wc_flags = IBV_WC_WITH_IMM;
      wc.imm_data = h.imm;
    }
    push_wc(cq_of(qp->ib.recv_cq), wc);
  }
  qp->expected_seq = h.seq + 1;
  send_ctrl(c, qp, from, kAck, h.src_qpn, h.seq, 0);
}

// Initiator side of an ACK or NAK (ctx->mu held).
void on_ctrl(Ctx* c, Qp* qp, const Packet& h) {
  if (qp->ib.state != IBV_QPS_RTS || qp->sq.empty() || !qp->head_started) return;
  if (h.seq != qp->next_seq) return;  // stale
  if (h.type == kAck) {
    Wr w = qp->sq.front();
    qp->sq.pop_front();
    qp->head_started = false;
    ++qp->next_seq;
    if (w.signaled || qp->sig_all) complete(qp, true, w, IBV_WC_SUCCESS);
    return;
  }
  switch (h.nak) {
    case kNakRnr: {
      ++qp->rnr_tries;
      if (qp->attr.rnr_retry != 7 && qp->rnr_tries > qp->attr.rnr_retry) return fail_head(qp, IBV_WC_RNR_RETRY_EXC_ERR);
      // Resend the whole message after a short delay (≈ min_rnr_timer, kept within 100 µs..1 ms).
      qp->sent_off = 0;
      qp->all_sent = false;
      int t = qp->attr.min_rnr_timer;
      auto delay = std::chrono::microseconds(t == 0 || t >= 14 ? 1000 : 100 + 60 * t);
      qp->resume_at = Clock::now() + delay;
      return;
    }
    case kNakAccess: return fail_head(qp, IBV_WC_REM_ACCESS_ERR);
    case kNakInvReq: return fail_head(qp, IBV_WC_REM_INV_REQ_ERR);
    default: return fail_head(qp, IBV_WC_REM_OP_ERR);
  }
  (void)c;
}

long ack_timeout_ms(const Qp* qp, long cap) {
  // IB: 4.096 µs · 2^timeout per try, retry_cnt + 1 tries; timeout 0 = infinite (the cap).
  if (qp->attr.timeout == 0) return cap;
  double ms = 4.096e-3 * static_cast<double>(1ull << std::min<int>(qp->attr.timeout, 40)) * (qp->attr.retry_cnt + 1);
  return ms > static_cast<double>(cap) ? cap : std::max<long>(1, static_cast<long>(ms));
}

// Moves the head WR of one QP along (ctx->mu held). Returns true when it wants to run again
// soon (a socket said EAGAIN).
bool progress_send(Ctx* c, Qp* qp, Clock::time_point now) {
  if (qp->ib.state != IBV_QPS_RTS || qp->sq.empty()) return false;
  Wr& w = qp->sq.front();
  if (!qp->head_started) {
    qp->head_started = true;
    qp->sent_off = 0;
    qp->all_sent = false;
    qp->rnr_tries = 0;
    qp->resume_at = now;
    if (w.prot_err) {
      fail_head(qp, IBV_WC_LOC_PROT_ERR);
      return false;
    }
    if (w.inject_fail) {
      fail_head(qp, IBV_WC_RETRY_EXC_ERR);
      return false;
    }
  }
  if (qp->all_sent) {
    if (now >= qp->ack_deadline) fail_head(qp, IBV_WC_RETRY_EXC_ERR);
    return false;
  }
  if (now < qp->resume_at) return false;
  while (!qp->all_sent) {
    Packet h{};
    h.magic = kMagic;
    h.type = kData;
    h.opcode = static_cast<std::uint8_t>(w.opcode);
    h.src_qpn = qp->ib.qp_num;
    h.dst_qpn = qp->attr.dest_qp_num;
    h.rkey = w.rkey;
    h.imm = w.imm;
    h.seq = qp->next_seq;
    h.remote_addr = w.remote_addr;
    h.total_len = w.len;
    h.offset = qp->sent_off;
    std::uint64_t n = std::min<std::uint64_t>(kMaxPacketPayload, w.len - qp->sent_off);
    h.frag_len = static_cast<std::uint32_t>(n);
    // Gather [sent_off, sent_off + n) from the SGEs (or the inline copy): the "DMA" read.
    iovec iov[kMaxSge];
    int niov = 0;
    if (w.is_inline) {
      if (n) iov[niov++] = {w.inline_data.data() + qp->sent_off, n};
    } else {
      std::uint64_t off = qp->sent_off, left = n;
      for (const ibv_sge& s : w.sge) {
        if (left == 0) break;
        if (off >= s.length) {
          off -= s.length;
          continue;
        }
        std::uint64_t k = std::min<std::uint64_t>(left, s.length - off);
        const Mr* m = find_mr(c, s.lkey, qp->ib.pd, s.addr + off, k, 0);
        if (m == nullptr) {  // deregistered since the post
          fail_head(qp, IBV_WC_LOC_PROT_ERR);
          return false;
        }
        iov[niov++] = {host_of(m, s.addr + off), k};
        left -= k;
        off = 0;
      }
    }
    int rc = send_dgram(qp->fd, qp->dest_path, h, iov, niov);
    if (rc == EAGAIN) return true;
    if (rc != 0) {  // no socket there (peer gone, stale file): like exhausted transport retries
      fail_head(qp, IBV_WC_RETRY_EXC_ERR);
      return false;
    }
    qp->sent_off += n;
    if (qp->sent_off >= w.len) {
      qp->all_sent = true;
      qp->ack_deadline = now + std::chrono::milliseconds(ack_timeout_ms(qp, c->cfg.retry_ms));
    }
  }
  return false;
}

void hca_loop(Ctx* c) {
  std::vector<std::uint8_t> buf(sizeof(Packet) + kMaxPacketPayload);
  std::vector<pollfd> pfds;
  int timeout_ms = 1;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->stop) return;
      pfds.clear();
      pfds.push_back({c->wake_r, POLLIN, 0});
      for (auto& [qpn, qp] : c->qps) pfds.push_back({qp->fd, POLLIN, 0});
    }
    ::poll(pfds.data(), pfds.size(), timeout_ms);
    char drain[64];
    while (::read(c->wake_r, drain, sizeof drain) > 0) {
    }
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->stop) return;
    auto now = Clock::now();
    if (c->port_err_pending && now >= c->port_err_at) {
      c->port_err_pending = false;
      c->port_state = IBV_PORT_DOWN;
      post_async(c, IBV_EVENT_PORT_ERR, nullptr, 1);
    }
    bool busy = false;
    // Control packets a full socket refused earlier go first, in order.
    while (!c->ctrl_out.empty()) {
      auto& [to, h] = c->ctrl_out.front();
      auto it = c->qps.find(h.src_qpn);
      if (it == c->qps.end()) {
        c->ctrl_out.pop_front();
        continue;
      }
      if (send_dgram(it->second->fd, to, h, nullptr, 0) == EAGAIN) {
        busy = true;
        break;
      }
      c->ctrl_out.pop_front();
    }
    // Receive: every QP's socket, drained without blocking (revents are not trusted: the
    // QP set may have changed while polling).
    for (auto it = c->qps.begin(); it != c->qps.end();) {
      Qp* qp = it->second;
      ++it;  // on_data may not destroy QPs, but keep the iterator valid anyway
      for (int k = 0; k < 256; ++k) {
        sockaddr_un from{};
        socklen_t flen = sizeof from;
        ssize_t got = ::recvfrom(qp->fd, buf.data(), buf.size(), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &flen);
        if (got < 0) break;
        if (static_cast<std::size_t>(got) < sizeof(Packet)) continue;
        Packet h;
        std::memcpy(&h, buf.data(), sizeof h);
        if (h.magic != kMagic || h.dst_qpn != qp->ib.qp_num) continue;
        if (h.type == kData) {
          long n = ++g_packets_received;
          if (c->cfg.drop_after >= 0 && n > c->cfg.drop_after) continue;  // gone silent
          if (static_cast<std::size_t>(got) != sizeof(Packet) + h.frag_len) continue;
          std::string fpath = flen > offsetof(sockaddr_un, sun_path) ? std::string(from.sun_path) : std::string();
          if (fpath.empty()) continue;
          on_data(c, qp, h, buf.data() + sizeof(Packet), fpath);
        } else {
          if (c->cfg.drop_after >= 0 && g_packets_received.load() > c->cfg.drop_after) continue;
          on_ctrl(c, qp, h);
        }
      }
    }
    now = Clock::now();
    bool waiting = false;
    for (auto& [qpn, qp] : c->qps) {
      busy |= progress_send(c, qp, now);
      if (qp->ib.state == IBV_QPS_RTS && !qp->sq.empty()) waiting = true;
    }
    // Sleep in poll until a packet or a post wakes us; wake often while sends wait for
    // ACKs or RNR delays (their deadlines), rarely otherwise.
    timeout_ms = busy ? 0 : (waiting || c->port_err_pending) ? 1 : 50;
    if (busy) std::this_thread::yield();
  }
}

void start_hca(Ctx* c) {
  if (c->hca.joinable()) return;
  c->hca = std::thread(hca_loop, c);
}

int set_nonblock_cloexec(int fd) {
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void mkdirs(const std::string& path) {
  std::string cur;
  for (std::size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      cur = path.substr(0, i);
      ::mkdir(cur.c_str(), 0700);
    }
  }
}

struct Device {
  ibv_device ib{};
  std::mutex mu;  // ranks that are threads list devices at once (libibverbs is thread-safe)
  __be64 guid = 0;
};

Device* the_device() {
  static Device* d = [] {
    auto* dev = new Device();  // lives as long as the process: contexts point at it
    dev->ib.node_type = IBV_NODE_CA;
    dev->ib.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(dev->ib.name, sizeof dev->ib.name, "fakeverbs0");
    std::snprintf(dev->ib.dev_name, sizeof dev->ib.dev_name, "uverbs0");
    std::snprintf(dev->ib.dev_path, sizeof dev->ib.dev_path, "/sys/class/infiniband_verbs/uverbs0");
    std::snprintf(dev->ib.ibdev_path, sizeof dev->ib.ibdev_path, "/sys/class/infiniband/fakeverbs0");
    return dev;
  }();
  return d;
}

const char* const kWcStatus[] = {
    "success", "local length error", "local QP operation error", "local EE context operation error",
    "local protection error", "Work Request Flushed Error", "memory management operation error",
    "bad response error", "local access error", "remote invalid request error", "remote access error",
    "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
    "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
    "invalid EE context state", "fatal error", "response timeout error", "general error",
    "TM error", "TM rendezvous error"};

int fv_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int fv_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int fv_poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int fv_req_notify_cq(ibv_cq* cq, int solicited_only);

}  // namespace

// ---------------------------------------------------------------------------------------
// Devices and contexts

FV_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  Device* d = the_device();
  Config cfg = read_config();
  std::uint64_t g = 0x02face0000000000ull;
  std::uint32_t ip;
  std::memcpy(&ip, &cfg.ipv4, 4);
  g |= ntohl(ip);
  {
    std::lock_guard<std::mutex> lock(d->mu);
    d->guid = htobe64(g);
  }
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = &d->ib;
  if (num_devices) *num_devices = 1;
  return list;
}

FV_EXPORT void ibv_free_device_list(ibv_device** list) { std::free(list); }

FV_EXPORT const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

FV_EXPORT __be64 ibv_get_device_guid(ibv_device* device) {
  if (device == nullptr) return 0;
  Device* d = reinterpret_cast<Device*>(device);
  std::lock_guard<std::mutex> lock(d->mu);
  return d->guid;
}

FV_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  if (device != &the_device()->ib) {
    errno = ENODEV;
    return nullptr;
  }
  auto c = std::make_unique<Ctx>();
  c->cfg = read_config();
  c->port_state = c->cfg.port_down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  int wp[2], ap[2];
  if (::pipe(wp) != 0) return nullptr;
  if (::pipe(ap) != 0) {
    int e = errno;
    ::close(wp[0]);
    ::close(wp[1]);
    errno = e;
    return nullptr;
  }
  for (int fd : {wp[0], wp[1], ap[1]}) set_nonblock_cloexec(fd);
  ::fcntl(ap[0], F_SETFD, FD_CLOEXEC);
  c->wake_r = wp[0];
  c->wake_w = wp[1];
  c->async_w = ap[1];
  // Fabric directory: the canonical port address directory holds the QP sockets; each GID
  // is a symlink to it, so an AV naming either GID (or the LID) finds the same QPs.
  const Config& cfg = c->cfg;
  mkdirs(cfg.fabric);
  std::string canon = cfg.ib ? lid_dir(cfg, cfg.lid) : gid_dir(cfg, cfg.gid[1]);
  ::mkdir(canon.c_str(), 0700);
  std::string target = canon.substr(canon.rfind('/') + 1);
  ::symlink(target.c_str(), gid_dir(cfg, cfg.gid[0]).c_str());
  auto* blk = static_cast<CtxBlock*>(std::calloc(1, sizeof(CtxBlock)));
  if (blk == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  blk->self = c.get();
  blk->v.sz = sizeof(verbs_context);  // every extended op null: verbs.h takes the compat paths
  ibv_context* ib = &blk->v.context;
  ib->abi_compat = __VERBS_ABI_IS_EXTENDED;
  ib->device = device;
  ib->cmd_fd = -1;
  ib->async_fd = ap[0];
  ib->num_comp_vectors = 1;
  pthread_mutex_init(&ib->mutex, nullptr);
  ib->ops.post_send = fv_post_send;
  ib->ops.post_recv = fv_post_recv;
  ib->ops.poll_cq = fv_poll_cq;
  ib->ops.req_notify_cq = fv_req_notify_cq;
  c->ib = ib;
  return c.release()->ib;
}

FV_EXPORT int ibv_close_device(ibv_context* context) {
  Ctx* c = ctx_of(context);
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->stop = true;
  }
  wake(c);
  if (c->hca.joinable()) c->hca.join();
  ::close(c->wake_r);
  ::close(c->wake_w);
  ::close(c->async_w);
  ::close(context->async_fd);
  pthread_mutex_destroy(&context->mutex);
  std::free(reinterpret_cast<char*>(context) - offsetof(verbs_context, context));
  delete c;
  return 0;
}

FV_EXPORT int ibv_query_device(ibv_context* context, ibv_device_attr* a) {
  if (context == nullptr || a == nullptr) return EINVAL;
  std::memset(a, 0, sizeof *a);
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "fakeverbs 1.0");
  a->node_guid = ibv_get_device_guid(context->device);  // under the device lock
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = ~0ull;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = 0xfa4e;
  a->vendor_part_id = 1;
  a->hw_ver = 1;
  a->max_qp = 1 << 16;
  a->max_qp_wr = kMaxQpWr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a->max_sge = kMaxSge;
  a->max_sge_rd = kMaxSge;
  a->max_cq = 1 << 16;
  a->max_cqe = kMaxCqe;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = 16;
  a->max_qp_init_rd_atom = 16;
  a->max_res_rd_atom = 1 << 20;
  a->atomic_cap = IBV_ATOMIC_NONE;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = 1;
  return 0;
}

FV_EXPORT int ibv_query_port(ibv_context* context, std::uint8_t port_num, _compat_ibv_port_attr* pa) {
  if (port_num != 1) return EINVAL;
  Ctx* c = ctx_of(context);
  // The compat struct is the prefix of ibv_port_attr; the caller zeroed the rest.
  auto* a = reinterpret_cast<ibv_port_attr*>(pa);
  std::lock_guard<std::mutex> lock(c->mu);
  a->state = c->port_state;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = c->cfg.ib ? 1 : kGidCount;
  a->port_cap_flags = 0;
  a->max_msg_sz = 1u << 31;
  a->pkey_tbl_len = 1;
  a->lid = c->cfg.lid;
  a->sm_lid = c->cfg.ib ? 1 : 0;
  a->lmc = 0;
  a->max_vl_num = 1;
  a->active_width = 2;  // 4x
  a->active_speed = 32;  // EDR
  a->phys_state = c->port_state == IBV_PORT_ACTIVE ? 5 : 3;  // LinkUp : Disabled
  a->link_layer = c->cfg.ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
  return 0;
}

FV_EXPORT int ibv_query_gid(ibv_context* context, std::uint8_t port_num, int index, ibv_gid* gid) {
  Ctx* c = ctx_of(context);
  int n = c->cfg.ib ? 1 : kGidCount;
  if (port_num != 1 || index < 0 || index >= n) {
    errno = EINVAL;
    return -1;
  }
  *gid = c->cfg.gid[index];
  return 0;
}

FV_EXPORT int ibv_query_pkey(ibv_context*, std::uint8_t port_num, int index, __be16* pkey) {
  if (port_num != 1 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htons(0xffff);
  return 0;
}

// ---------------------------------------------------------------------------------------
// Protection domains and memory regions

FV_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  auto* p = new (std::nothrow) Pd();
  if (p == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  p->ib.context = context;
  static std::atomic<std::uint32_t> handles{1};
  p->ib.handle = handles++;
  return &p->ib;
}

FV_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  delete reinterpret_cast<Pd*>(pd);
  return 0;
}

namespace {

// Gives a new MR its keys and makes it visible to the HCA.
ibv_mr* add_mr(Ctx* c, Mr* m) {
  std::lock_guard<std::mutex> lock(c->mu);
  // Keys are per context, never reused while the context lives: a stale rkey stays invalid.
  std::uint32_t key = (c->next_key++ << 8) | (c->rng() & 0xff);
  m->ib.lkey = m->ib.rkey = key;
  m->ib.handle = key;
  c->mrs[key] = m;
  return &m->ib;
}

}  // namespace

FV_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova, unsigned int access) {
  if (pd == nullptr || (addr == nullptr && length > 0) || iova != reinterpret_cast<std::uint64_t>(addr)) {
    errno = EINVAL;  // an iova other than the address is not emulated
    return nullptr;
  }
  // Remote write/atomic need local write, as the IB spec (and every driver) requires.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  Ctx* c = ctx_of(pd->context);
  auto* m = new (std::nothrow) Mr();
  if (m == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  m->ib.context = pd->context;
  m->ib.pd = pd;
  m->ib.addr = addr;
  m->ib.length = length;
  m->access = static_cast<int>(access);
  m->iova = iova;
  m->host = static_cast<std::uint8_t*>(addr);
  return add_mr(c, m);
}

FV_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, std::size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<std::uint64_t>(addr), static_cast<unsigned>(access));
}

FV_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

// dma-buf: see the top comment. The memory behind the fd is mapped here and the HCA reaches
// it through that mapping, whatever the caller does with the fd afterwards.
FV_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd,
                                    int access) {
  if (pd == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  Ctx* c = ctx_of(pd->context);
  if (c->cfg.no_dmabuf) {  // FAKEVERBS_NO_DMABUF: as a kernel or driver without the verb
    errno = EOPNOTSUPP;
    return nullptr;
  }
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  // The kernel's checks (uverbs REG_DMABUF_MR): the same place in a page, known access bits.
  constexpr unsigned kAllowed = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING;
  if ((offset & (page - 1)) != (iova & (page - 1)) || (static_cast<unsigned>(access) & ~kAllowed) != 0 ||
      offset + length < offset || iova + length < iova) {
    errno = EINVAL;
    return nullptr;
  }
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;  // as ibv_reg_mr
    return nullptr;
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0) return nullptr;  // EBADF
  if (S_ISREG(st.st_mode) && offset + length > static_cast<std::uint64_t>(st.st_size)) {
    errno = EINVAL;  // past the end of the buffer (a memfd's size stands for the dma-buf's)
    return nullptr;
  }
  const std::uint64_t start = offset & ~(page - 1);
  const std::size_t map_len = static_cast<std::size_t>(offset - start) + length;
  void* map = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (map == MAP_FAILED) return nullptr;  // mmap's errno: EINVAL (length 0), ENODEV, EACCES...
  auto* m = new (std::nothrow) Mr();
  if (m == nullptr) {
    ::munmap(map, map_len);
    errno = ENOMEM;
    return nullptr;
  }
  m->ib.context = pd->context;
  m->ib.pd = pd;
  m->ib.addr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(offset));  // as libibverbs sets it
  m->ib.length = length;
  m->access = access;
  m->iova = iova;
  m->host = static_cast<std::uint8_t*>(map) + (offset - start);
  m->map = map;
  m->map_len = map_len;
  return add_mr(c, m);
}

FV_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  Ctx* c = ctx_of(mr->context);
  {
    // Once out of the table under the lock, the HCA thread no longer reaches the memory
    // (it looks every MR up when the bytes move): a dma-buf mapping can go.
    std::lock_guard<std::mutex> lock(c->mu);
    c->mrs.erase(mr->lkey);
  }
  auto* m = reinterpret_cast<Mr*>(mr);
  if (m->map != nullptr) ::munmap(m->map, m->map_len);
  delete m;
  return 0;
}

// ---------------------------------------------------------------------------------------
// Completion channels and CQs

FV_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  int p[2];
  if (::pipe(p) != 0) return nullptr;
  ::fcntl(p[0], F_SETFD, FD_CLOEXEC);
  set_nonblock_cloexec(p[1]);  // the HCA thread never blocks on a slow reader
  auto* ch = new CompChannel();
  ch->ib.context = context;
  ch->ib.fd = p[0];
  ch->wfd = p[1];
  return &ch->ib;
}

FV_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  auto* ch = reinterpret_cast<CompChannel*>(channel);
  if (ch->ib.refcnt > 0) return EBUSY;
  ::close(ch->ib.fd);
  ::close(ch->wfd);
  delete ch;
  return 0;
}

FV_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                                int comp_vector) {
  if (cqe < 1 || cqe > static_cast<int>(kMaxCqe) || comp_vector < 0 || comp_vector >= context->num_comp_vectors) {
    errno = EINVAL;
    return nullptr;
  }
  auto* cq = new Cq();
  cq->ctx = ctx_of(context);
  cq->channel = reinterpret_cast<CompChannel*>(channel);
  cq->capacity = cqe;
  cq->ib.context = context;
  cq->ib.channel = channel;
  cq->ib.cq_context = cq_context;
  cq->ib.cqe = cqe;
  pthread_mutex_init(&cq->ib.mutex, nullptr);
  pthread_cond_init(&cq->ib.cond, nullptr);
  if (channel) {
    std::lock_guard<std::mutex> lock(cq->ctx->mu);
    ++channel->refcnt;
  }
  return &cq->ib;
}

FV_EXPORT int ibv_destroy_cq(ibv_cq* ibcq) {
  Cq* cq = cq_of(ibcq);
  Ctx* c = cq->ctx;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    // As libibverbs: every event handed out by ibv_get_cq_event must be acked first.
    if (cq->events_delivered.load() != cq->events_acked.load()) return EBUSY;
    for (auto& [n, qp] : c->qps)
      if (qp->ib.send_cq == ibcq || qp->ib.recv_cq == ibcq) return EBUSY;
    if (cq->channel) --cq->channel->ib.refcnt;
  }
  pthread_mutex_destroy(&ibcq->mutex);
  pthread_cond_destroy(&ibcq->cond);
  delete cq;
  return 0;
}

FV_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  ibv_cq* p = nullptr;
  ssize_t n = ::read(channel->fd, &p, sizeof p);
  if (n != static_cast<ssize_t>(sizeof p)) {
    if (n >= 0) errno = EIO;
    return -1;
  }
  *cq = p;
  *cq_context = p->cq_context;
  ++cq_of(p)->events_delivered;
  return 0;
}

FV_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  cq_of(cq)->events_acked += nevents;
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_mutex_unlock(&cq->mutex);
}

// ---------------------------------------------------------------------------------------
// Queue pairs

FV_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* ia) {
  if (pd == nullptr || ia == nullptr || ia->send_cq == nullptr || ia->recv_cq == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (ia->qp_type != IBV_QPT_RC || ia->srq != nullptr) {
    errno = EOPNOTSUPP;  // only RC without SRQ is emulated
    return nullptr;
  }
  ibv_qp_cap& cap = ia->cap;
  if (cap.max_send_wr > kMaxQpWr || cap.max_recv_wr > kMaxQpWr || cap.max_send_sge > kMaxSge ||
      cap.max_recv_sge > kMaxSge || cap.max_inline_data > kMaxInline) {
    errno = EINVAL;
    return nullptr;
  }
  Ctx* c = ctx_of(pd->context);
  auto qp = std::make_unique<Qp>();
  qp->ctx = c;
  qp->cap = cap;
  qp->sig_all = ia->sq_sig_all != 0;
  qp->ib.context = pd->context;
  qp->ib.qp_context = ia->qp_context;
  qp->ib.pd = pd;
  qp->ib.send_cq = ia->send_cq;
  qp->ib.recv_cq = ia->recv_cq;
  qp->ib.qp_type = IBV_QPT_RC;
  qp->ib.state = IBV_QPS_RESET;
  qp->attr.qp_state = IBV_QPS_RESET;
  pthread_mutex_init(&qp->ib.mutex, nullptr);
  pthread_cond_init(&qp->ib.cond, nullptr);
  qp->fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (qp->fd < 0) return nullptr;
  int sz = 8 << 20;
  ::setsockopt(qp->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  ::setsockopt(qp->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  const Config& cfg = c->cfg;
  std::string dir = cfg.ib ? lid_dir(cfg, cfg.lid) : gid_dir(cfg, cfg.gid[1]);
  std::lock_guard<std::mutex> lock(c->mu);
  // A random 24-bit QPN, unique among the live QPs bound at this port address (bind fails
  // with EADDRINUSE on a taken one, including a stale file of a dead process: try another).
  for (int tries = 0;; ++tries) {
    std::uint32_t qpn = c->rng() & 0xffffff;
    if (qpn < 2 || c->qps.count(qpn)) continue;
    std::string path = dir + "/" + std::to_string(qpn);
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      std::fprintf(stderr, "fakeverbs: socket path %s is too long; use a shorter FAKEVERBS_FABRIC\n", path.c_str());
      ::close(qp->fd);
      errno = ENAMETOOLONG;
      return nullptr;
    }
    socklen_t alen;
    sockaddr_un a = make_addr(path, &alen);
    if (::bind(qp->fd, reinterpret_cast<sockaddr*>(&a), alen) == 0) {
      qp->ib.qp_num = qpn;
      qp->path = path;
      break;
    }
    if (errno != EADDRINUSE || tries > 1000) {
      int e = errno;
      std::fprintf(stderr, "fakeverbs: cannot bind %s: %s\n", path.c_str(), std::strerror(e));
      ::close(qp->fd);
      errno = e;
      return nullptr;
    }
  }
  // What the "hardware" grants, reported back as libibverbs does (inline: exactly what was
  // asked, so that post_send's check against it is the one the caller expects).
  if (cap.max_send_sge == 0) cap.max_send_sge = 1;
  if (cap.max_recv_sge == 0) cap.max_recv_sge = 1;
  qp->cap = cap;
  Qp* raw = qp.release();
  c->qps[raw->ib.qp_num] = raw;
  if (c->cfg.port_err_after_ms >= 0 && !c->hca.joinable()) {
    c->port_err_pending = true;
    c->port_err_at = Clock::now() + std::chrono::milliseconds(c->cfg.port_err_after_ms);
  }
  start_hca(c);
  wake(c);
  return &raw->ib;
}

FV_EXPORT int ibv_destroy_qp(ibv_qp* ibqp) {
  Qp* qp = qp_of(ibqp);
  Ctx* c = qp->ctx;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->qps.erase(ibqp->qp_num);
  }
  ::unlink(qp->path.c_str());
  ::close(qp->fd);
  pthread_mutex_destroy(&ibqp->mutex);
  pthread_cond_destroy(&ibqp->cond);
  delete qp;
  return 0;
}

namespace {

bool has(int mask, int need) { return (mask & need) == need; }

int modify_locked(Qp* qp, ibv_qp_attr* a, int mask) {
  Ctx* c = qp->ctx;
  ibv_qp_state cur = qp->ib.state;
  ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
  if (next == IBV_QPS_RESET) {
    // Reset discards the queues without completions.
    qp->sq.clear();
    qp->rq.clear();
    qp->head_started = false;
    qp->attr = ibv_qp_attr{};
    qp->ib.state = qp->attr.qp_state = IBV_QPS_RESET;
    qp->dest_path.clear();
    return 0;
  }
  if (next == IBV_QPS_ERR) {
    to_error(qp);
    return 0;
  }
  if (next == IBV_QPS_INIT && (cur == IBV_QPS_RESET || cur == IBV_QPS_INIT)) {
    if (cur == IBV_QPS_RESET && !has(mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return EINVAL;
    if ((mask & IBV_QP_PORT) && a->port_num != 1) return EINVAL;
    if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0) return EINVAL;
    if (mask & IBV_QP_PORT) qp->attr.port_num = a->port_num;
    if (mask & IBV_QP_ACCESS_FLAGS) qp->attr.qp_access_flags = a->qp_access_flags;
  } else if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
    if (!has(mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return EINVAL;
    if (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096) return EINVAL;  // ≤ active MTU (4096)
    if (a->dest_qp_num == 0 || a->dest_qp_num > 0xffffff) return EINVAL;
    const ibv_ah_attr& av = a->ah_attr;
    if (av.port_num != 0 && av.port_num != 1) return EINVAL;
    std::string path;
    const int ngid = c->cfg.ib ? 1 : kGidCount;
    if (av.is_global) {
      static const ibv_gid zero{};
      if (std::memcmp(av.grh.dgid.raw, zero.raw, 16) == 0 || av.grh.sgid_index >= ngid) return EINVAL;
      path = gid_dir(c->cfg, av.grh.dgid) + "/" + std::to_string(a->dest_qp_num);
    } else {
      if (!c->cfg.ib) return EINVAL;  // RoCE has no LIDs: the AV must carry a GRH
      if (av.dlid == 0) return EINVAL;
      path = lid_dir(c->cfg, av.dlid) + "/" + std::to_string(a->dest_qp_num);
    }
    qp->attr.ah_attr = av;
    qp->attr.path_mtu = a->path_mtu;
    qp->attr.dest_qp_num = a->dest_qp_num;
    qp->attr.rq_psn = a->rq_psn;
    qp->attr.max_dest_rd_atomic = a->max_dest_rd_atomic;
    qp->attr.min_rnr_timer = a->min_rnr_timer;
    qp->dest_path = path;
    qp->expected_seq = 0;
    qp->rejecting = false;
  } else if (next == IBV_QPS_RTS && (cur == IBV_QPS_RTR || cur == IBV_QPS_RTS)) {
    if (cur == IBV_QPS_RTR && !has(mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
      return EINVAL;
    if (mask & IBV_QP_TIMEOUT) qp->attr.timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT) qp->attr.retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) qp->attr.rnr_retry = a->rnr_retry;
    if (mask & IBV_QP_SQ_PSN) qp->attr.sq_psn = a->sq_psn;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) qp->attr.max_rd_atomic = a->max_rd_atomic;
    if (cur == IBV_QPS_RTR) qp->next_seq = 0;
  } else {
    return EINVAL;  // not a transition an RC QP makes
  }
  qp->ib.state = qp->attr.qp_state = next;
  return 0;
}

}  // namespace

FV_EXPORT int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int attr_mask) {
  Qp* qp = qp_of(ibqp);
  int rc;
  {
    std::lock_guard<std::mutex> lock(qp->ctx->mu);
    rc = modify_locked(qp, attr, attr_mask);
  }
  if (rc == 0) wake(qp->ctx);
  return rc;
}

FV_EXPORT int ibv_query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
  Qp* qp = qp_of(ibqp);
  std::lock_guard<std::mutex> lock(qp->ctx->mu);
  *attr = qp->attr;
  attr->qp_state = attr->cur_qp_state = qp->ib.state;
  attr->cap = qp->cap;
  if (init) {
    std::memset(init, 0, sizeof *init);
    init->qp_context = ibqp->qp_context;
    init->send_cq = ibqp->send_cq;
    init->recv_cq = ibqp->recv_cq;
    init->cap = qp->cap;
    init->qp_type = IBV_QPT_RC;
    init->sq_sig_all = qp->sig_all;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// Async events, fork, strings

FV_EXPORT int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  AsyncRecord r;
  ssize_t n = ::read(context->async_fd, &r, sizeof r);
  if (n != static_cast<ssize_t>(sizeof r)) {
    if (n >= 0) errno = EIO;
    return -1;
  }
  std::memset(event, 0, sizeof *event);
  event->event_type = r.type;
  if (r.type == IBV_EVENT_CQ_ERR)
    event->element.cq = static_cast<ibv_cq*>(r.element);
  else if (r.type == IBV_EVENT_PORT_ERR || r.type == IBV_EVENT_PORT_ACTIVE)
    event->element.port_num = r.port;
  else
    event->element.qp = static_cast<ibv_qp*>(r.element);
  return 0;
}

FV_EXPORT void ibv_ack_async_event(ibv_async_event*) {}

FV_EXPORT int ibv_fork_init(void) { return 0; }

FV_EXPORT ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

FV_EXPORT const char* ibv_wc_status_str(ibv_wc_status status) {
  auto i = static_cast<std::size_t>(status);
  return i < sizeof kWcStatus / sizeof kWcStatus[0] ? kWcStatus[i] : "unknown";
}

FV_EXPORT const char* ibv_event_type_str(ibv_event_type event) {
  switch (event) {
    case IBV_EVENT_CQ_ERR: return "CQ error";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
    case IBV_EVENT_COMM_EST: return "communication established";
    case IBV_EVENT_SQ_DRAINED: return "send queue drained";
    case IBV_EVENT_PATH_MIG: return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_LID_CHANGE: return "LID change";
    case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
    case IBV_EVENT_SM_CHANGE: return "SM change";
    case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
    case IBV_EVENT_GID_CHANGE: return "GID table change";
    default: return "unknown";
  }
}

FV_EXPORT const char* ibv_port_state_str(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "PORT_NOP";
    case IBV_PORT_DOWN: return "PORT_DOWN";
    case IBV_PORT_INIT: return "PORT_INIT";
    case IBV_PORT_ARMED: return "PORT_ARMED";
    case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
    default: return "invalid state";
  }
}

// ---------------------------------------------------------------------------------------
// Data path: the context ops behind verbs.h's inline ibv_post_send & co.

namespace {

// An SGE's lkey must name a local MR of the QP's PD covering it (else LOC_PROT_ERR).
bool sges_ok(Ctx* c, ibv_pd* pd, const ibv_sge* s, int n, int need) {
  for (int i = 0; i < n; ++i)
    if (s[i].length > 0 && find_mr(c, s[i].lkey, pd, s[i].addr, s[i].length, need) == nullptr) return false;
  return true;
}

int fv_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Qp* qp = qp_of(ibqp);
  Ctx* c = qp->ctx;
  int rc = 0;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    for (; wr != nullptr; wr = wr->next) {
      if (qp->ib.state == IBV_QPS_ERR) {  // accepted and flushed at once, as hardware does
        Wr w;
        w.wr_id = wr->wr_id;
        w.opcode = wr->opcode;
        complete(qp, true, w, IBV_WC_WR_FLUSH_ERR);
        continue;
      }
      if (qp->ib.state != IBV_QPS_RTS) { rc = EINVAL; break; }
      if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM && wr->opcode != IBV_WR_SEND &&
          wr->opcode != IBV_WR_SEND_WITH_IMM) { rc = EINVAL; break; }  // RDMA_READ, atomics: not emulated
      if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > qp->cap.max_send_sge) { rc = EINVAL; break; }
      if (qp->sq.size() >= qp->cap.max_send_wr) { rc = ENOMEM; break; }
      Wr w;
      w.wr_id = wr->wr_id;
      w.opcode = wr->opcode;
      w.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
      w.imm = wr->imm_data;
      w.remote_addr = wr->wr.rdma.remote_addr;
      w.rkey = wr->wr.rdma.rkey;
      for (int i = 0; i < wr->num_sge; ++i) w.len += wr->sg_list[i].length;
      if (w.len > (1ull << 31)) { rc = EINVAL; break; }
      if (wr->send_flags & IBV_SEND_INLINE) {
        if (w.len > qp->cap.max_inline_data) { rc = EINVAL; break; }
        w.is_inline = true;
        for (int i = 0; i < wr->num_sge; ++i) {
          auto* p = reinterpret_cast<const std::uint8_t*>(wr->sg_list[i].addr);
          w.inline_data.insert(w.inline_data.end(), p, p + wr->sg_list[i].length);
        }
      } else {
        w.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
        w.prot_err = !sges_ok(c, ibqp->pd, wr->sg_list, wr->num_sge, 0);
      }
      long n = c->sends_posted++;
      w.inject_fail = c->cfg.fail_send_after >= 0 && n == c->cfg.fail_send_after;
      qp->sq.push_back(std::move(w));
    }
  }
  if (rc != 0 && bad) *bad = wr;
  wake(c);
  return rc;
}

int fv_post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Qp* qp = qp_of(ibqp);
  Ctx* c = qp->ctx;
  int rc = 0;
  std::lock_guard<std::mutex> lock(c->mu);
  for (; wr != nullptr; wr = wr->next) {
    Wr w;
    w.wr_id = wr->wr_id;
    if (qp->ib.state == IBV_QPS_ERR) {
      complete(qp, false, w, IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    if (qp->ib.state == IBV_QPS_RESET) { rc = EINVAL; break; }
    if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > qp->cap.max_recv_sge) { rc = EINVAL; break; }
    if (qp->rq.size() >= qp->cap.max_recv_wr) { rc = ENOMEM; break; }
    w.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    for (int i = 0; i < wr->num_sge; ++i) w.len += wr->sg_list[i].length;
    w.prot_err = !sges_ok(c, ibqp->pd, wr->sg_list, wr->num_sge, IBV_ACCESS_LOCAL_WRITE);
    qp->rq.push_back(std::move(w));
  }
  if (rc != 0 && bad) *bad = wr;
  return rc;
}

int fv_poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  Cq* cq = cq_of(ibcq);
  std::lock_guard<std::mutex> lock(cq->ctx->mu);
  int k = 0;
  for (; k < n && !cq->wcs.empty(); ++k) {
    wc[k] = cq->wcs.front();
    cq->wcs.pop_front();
  }
  return k;
}

int fv_req_notify_cq(ibv_cq* ibcq, int) {
  Cq* cq = cq_of(ibcq);
  std::lock_guard<std::mutex> lock(cq->ctx->mu);
  // Armed for the next completion added from now on (solicited_only is treated as all).
  cq->armed = true;
  return 0;
}

}  // namespace
