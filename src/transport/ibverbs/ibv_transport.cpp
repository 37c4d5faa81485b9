// The verbs transport: braid's message contract (transport.hpp) over reliable-connected
// queue pairs, one per peer, host memory. Hardware-untested: every line here has run against
// the test provider tests/support/fakeverbs only (docs/transport-ibverbs.md).
//
// Resources. Per communicator: the chosen device and port (BRAID_IB_HCA, else the first
// ACTIVE port), a protection domain, one completion queue shared by every QP, its completion
// channel and the device's async-event fd in the engine's poller, a timerfd for set-up
// retries. Per peer: BRAID_IB_QPS_PER_PEER RC QPs ("lanes": the first carries everything,
// the others only stripes of rendezvous messages) and four registered buffers: the receive ring (slots the peer
// writes into), the send staging (what we copy outgoing chunks into), the control area (the
// credit word and CTS ring the peer writes into) and an outbox (what we write into the
// peer's control area from).
//
// Set-up, lazily and symmetrically: the first use of a connection makes the QP (INIT, its
// receives posted) and publishes a record (ibv_record.hpp: QPN, PSN, LID/GID, MTU, ring and
// control addresses and rkeys, the communicator and the per-job token) under
// "ibv/<peer>". Each side looks the other's record up without blocking, authenticates it,
// moves its QP to RTR and RTS and publishes "ibv-ready/<peer>"; data is written only once
// the peer has said it is ready, so no write reaches a QP that is not yet receiving. Both
// lookups end at the connect timeout, naming the peer.
//
// Data. Every write that the receiver must notice is an RDMA_WRITE_WITH_IMM, consuming one of
// the zero-length receives each QP keeps posted (replenished as they complete); the
// immediate says what was written (ibv_wire.hpp):
// - eager messages, chunked through the slots: the sender copies a chunk and its header
//   into the staging slot of the same index and writes both into the peer's slot. The
//   receiver processes slots in order, matching them to its posted receives in FIFO order
//   (tag and size checked on the first chunk), copies out and frees the slot.
// - credits: the receiver writes the count of slots it has freed into the sender's credit
//   word (cumulative, so a late or repeated write is harmless); the sender writes at most
//   `slots` ahead of it, never more.
// - rendezvous, for messages of at least BRAID_IB_RNDV_THRESHOLD: the sender writes a
//   request-to-send slot; the receiver, at its matching receive, registers the receive
//   buffer and writes a CTS (address, rkey, size) into the sender's CTS ring; the sender
//   registers its buffer and writes it straight into the receiver's. A message of at least
//   two stripes (wire::stripes, 64 KiB each at least) is split over the lanes, stripe s on
//   lane s, so that several QPs (and on hardware, several NIC engines and paths) carry it;
//   each stripe's last write carries an immediate, and the receive completes when every
//   stripe's has arrived (RC places a QP's data before its immediate's completion). The receiver processes no later slot until
//   then, so requests complete in the order posted.
// Registrations of user buffers last one message unless BRAID_IB_REG_CACHE=1 (a freed and
// reused address would otherwise keep stale pages registered: docs/transport-ibverbs.md).
//
// Selective signalling: a data write is signalled every slots/4 data writes and at the end
// of each burst; RC completes a QP's work requests in order, so one completion frees every
// staging slot and send-queue entry posted before it. The send queue is never posted beyond
// its depth, the receiver never beyond its credits.
//
// Failures. An error completion fails the connection naming the peer: retry count exceeded
// (the peer's HCA stopped answering: it died, or the link is cut) is "unreachable", others
// carry the status's name; work requests flushed after the first are not reported again.
// An async event that takes the port down or makes the device fatal fails every
// connection. A peer that closes sends a bye slot with the number of messages it sent; it
// is "closed by peer" once those are received. Nothing here blocks the progress thread
// except close_all(), which waits at most a second for its byes to be acknowledged.
#include "transport/ibverbs/ibv_transport.hpp"

#include "base/fd.hpp"
#include "base/logging.hpp"
#include "base/text.hpp"
#include "gpu/runtime.hpp"
#include "transport/common.hpp"
#include "transport/ibverbs/ibv_config.hpp"
#include "transport/ibverbs/ibv_discovery.hpp"
#include "transport/ibverbs/ibv_lib.hpp"
#include "transport/ibverbs/ibv_record.hpp"
#include "transport/ibverbs/ibv_reg_cache.hpp"
#include "transport/ibverbs/ibv_wire.hpp"
#include "transport/skeleton.hpp"

#include <braid/error.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <unordered_map>

namespace braid::transport {
namespace {

using ibverbs::Api;
namespace wire = ibverbs::wire;

constexpr int kPollBatch = 32;
constexpr auto kProbeEvery = std::chrono::milliseconds(250);
constexpr std::size_t kMaxWrite = std::size_t{1} << 30;  // bytes per RDMA write work request
// A data lane (a QP beyond the first) carries only rendezvous stripes, one message at a time
// per connection: a few writes and one immediate each.
constexpr int kDataSqDepth = 64;  // a stripe of up to 63 GiB (writes of at most 1 GiB)
constexpr int kDataRqDepth = 16;

/// "RLIMIT_MEMLOCK is 8 MiB: raise it ..." when registration failed for lack of locked memory.
std::string memlock_hint(int err) {
  if (err != ENOMEM && err != EPERM && err != EAGAIN) return "";
  rlimit r{};
  if (::getrlimit(RLIMIT_MEMLOCK, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return "";
  return "; RLIMIT_MEMLOCK is " + std::to_string(r.rlim_cur >> 10) + " KiB" +
         ": raise it (ulimit -l unlimited; LimitMEMLOCK=infinity under systemd; --ulimit memlock=-1 in docker)";
}

/// *out describes `mr`, the registration of [base, base+bytes); true.
bool registered(ibv_mr* mr, std::uintptr_t base, std::size_t bytes, ibverbs::Registration* out) {
  out->handle = mr;
  out->lkey = mr->lkey;
  out->rkey = mr->rkey;
  out->base = base;
  out->bytes = bytes;
  return true;
}

/// A page-aligned buffer registered with the protection domain.
class Registered {
 public:
  Registered() = default;
  Registered(const Registered&) = delete;
  Registered& operator=(const Registered&) = delete;
  ~Registered() { reset(); }
  /// false with *why on failure.
  bool make(const Api& api, ibv_pd* pd, std::size_t bytes, int access, std::string* why) {
    api_ = &api;
    void* p = nullptr;
    // Whole pages: registered memory must not share a page with other heap data, which a
    // fork would make copy-on-write under the HCA (kernels before 5.13, ibv_fork_init).
    const std::size_t whole = (std::max<std::size_t>(bytes, 1) + 4095) & ~std::size_t{4095};
    if (::posix_memalign(&p, 4096, whole) != 0) {
      *why = "cannot allocate " + std::to_string(bytes) + " bytes";
      return false;
    }
    std::memset(p, 0, bytes);
    mem_ = static_cast<unsigned char*>(p);
    bytes_ = bytes;
    mr_ = api.reg_mr(pd, mem_, bytes, access);
    if (mr_ == nullptr) {
      const int err = errno;
      *why = "ibv_reg_mr of " + std::to_string(bytes) + " bytes: " + errno_text(err) + memlock_hint(err);
      return false;
    }
    return true;
  }
  void reset() noexcept {
    if (mr_ != nullptr) api_->dereg_mr(mr_);
    mr_ = nullptr;
    std::free(mem_);
    mem_ = nullptr;
  }
  unsigned char* data() const noexcept { return mem_; }
  std::uint64_t addr() const noexcept { return reinterpret_cast<std::uintptr_t>(mem_); }
  std::uint32_t lkey() const noexcept { return mr_->lkey; }
  std::uint32_t rkey() const noexcept { return mr_->rkey; }

 private:
  const Api* api_ = nullptr;
  unsigned char* mem_ = nullptr;
  std::size_t bytes_ = 0;
  ibv_mr* mr_ = nullptr;
};

/// One queue pair of a connection, with its own send-queue accounting: wr_id is the work
/// request's number in this QP's sequence (RC completes a QP's requests in order).
struct Lane {
  ibv_qp* qp = nullptr;
  std::uint64_t wr_posted = 0, wr_completed = 0;
  int recvs_posted = 0;
};

constexpr std::size_t kMaxLanes = 16;  ///< BRAID_IB_QPS_PER_PEER's bound (the record carries 15 data QPs)

struct SendOp {
  Request* req = nullptr;
  const unsigned char* buf = nullptr;
  std::size_t bytes = 0;
  std::uint64_t tag = 0;
  enum class State : std::uint8_t { queued, copied, wait_cts, writing } state = State::queued;
  bool rndv = false;
  bool device = false;            ///< buf is GPU memory (send_device): always by rendezvous
  std::size_t sent = 0;           ///< eager: bytes written into slots
  /// Rendezvous: per lane, the work request whose completion ends this message's stripe (0: none).
  std::array<std::uint64_t, kMaxLanes> done_wr{};
  const ibverbs::Registration* reg = nullptr;
};

struct RecvOp {
  Request* req = nullptr;
  unsigned char* buf = nullptr;
  std::size_t bytes = 0;
  std::uint64_t tag = 0;
  std::size_t got = 0;
  const ibverbs::Registration* reg = nullptr;
  bool device = false;  ///< buf is GPU memory (recv_device)
};

class IbvTransport;

class IbvConnection final : public Connection {
 public:
  enum class State { setup, looking_up, awaiting_ready, established, failed };
  IbvConnection(IbvTransport& t, int peer) : t_(t), peer_(peer) {}
  int peer() const noexcept override { return peer_; }
  void send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  bool broken(std::string* why) const override { return failure_.report(why); }
  bool takes_device_memory() const noexcept override;
  void send_device(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void recv_device(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void post_send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req, bool device);
  void post_recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req, bool device);
  std::string who() const { return "ibverbs connection to rank " + std::to_string(peer_); }

  IbvTransport& t_;
  const int peer_;
  State state_ = State::setup;
  Failure failure_;
  PeerLookup lookup_;
  std::string refused_;  ///< the last record refused as a stranger's (reported once)
  Clock::time_point gone_check_at_{};  ///< next look at whether the peer is known to be gone

  /// The queue pairs to the peer: [0] carries the slots, credits, CTS entries, probes and
  /// byes; each carries a stripe of every large rendezvous message (BRAID_IB_QPS_PER_PEER).
  std::vector<Lane> lanes_;
  std::uint32_t psn_ = 0;  ///< every lane's initial PSN
  ibverbs::ConnRecord remote_;
  Registered ring_, staging_, control_, outbox_;

  // Sending.
  std::deque<SendOp> sends_;
  std::size_t cursor_ = 0;            ///< first op of sends_ not yet wholly written
  std::uint64_t slots_written_ = 0;   ///< slots written into the peer's ring
  std::vector<std::uint64_t> staging_wr_;  ///< per staging slot: the work request that last used it
  std::uint64_t cts_used_ = 0;        ///< CTS entries acted on
  std::uint64_t cts_arrived_ = 0;     ///< CTS immediates received
  std::uint32_t messages_sent_ = 0;
  // Receiving.
  std::deque<RecvOp> recvs_;
  std::uint64_t slots_arrived_ = 0;   ///< data immediates received
  std::uint64_t slots_done_ = 0;      ///< slots processed and freed
  std::uint64_t credits_returned_ = 0;
  std::uint64_t cts_sent_ = 0;
  bool rndv_wait_ = false;            ///< the front receive waits for its rendezvous write
  std::uint64_t rndv_done_ = 0, rndv_used_ = 0;
  std::uint64_t messages_received_ = 0;
  bool bye_ = false;
  std::uint64_t bye_count_ = 0;
  std::uint64_t data_writes_ = 0, control_writes_ = 0;
  std::uint64_t bye_wr_ = 0;
  /// Liveness: while this side waits for the peer, a zero-byte write every kProbeEvery (250 ms); the
  /// peer's HCA acknowledges it, or the write fails (retries exceeded) naming the peer.
  Clock::time_point probe_at_ = Clock::time_point::max();
  std::uint64_t probe_wr_ = 0;
  std::uint32_t max_inline_ = 0;  ///< what the QP sends inline (its source is copied at post time)
  /// After a local failure: the abort slot's work request, and when the QP goes to ERR.
  std::uint64_t abort_wr_ = 0;
  Clock::time_point error_at_ = Clock::time_point::max();
  bool in_error_ = false;
};

class IbvTransport final : public Transport {
 public:
  IbvTransport(const IbvOptions& o, const Api& api, Poller& poller, PeerDirectory& dir)
      : o_(o), api_(api), poller_(poller), directory_(dir), conns_(o.size) {
    std::random_device rd;
    rng_.seed((std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid()));
    slots_ = o.slots;
    sq_depth_ = static_cast<int>(slots_ + 2 * wire::kCtsEntries + 32);
    // Every slot write and every credit write (at most one per freed slot) consumes a
    // receive of ours; they are topped up on every progress step.
    rq_depth_ = static_cast<int>(2 * slots_ + 2 * wire::kCtsEntries + 32);
    try {
      open();
    } catch (...) {
      teardown();
      throw;
    }
  }
  ~IbvTransport() override {
    close_all("ibverbs transport closed");
    teardown();
  }

  const char* name() const noexcept override { return "ibverbs"; }
  Connection* connection(int peer) override {
    if (peer < 0 || peer >= o_.size || peer == o_.rank) {
      throw Error(ErrorCode::InvalidUsage, "ibverbs transport: no connection from rank " + std::to_string(o_.rank) +
                                               " to rank " + std::to_string(peer));
    }
    return &get(peer);
  }
  bool progress() override;
  void close_all(const std::string& reason) override;
  bool prepare_sleep() override;
  bool needs_rearm() const override { return cq_ != nullptr && !armed_; }

  // --- for the connections ---
  /// How device buffers reach the NIC (BRAID_GDR): not at all (the engine stages them through
  /// pinned host memory), or registered through a dma-buf of the GPU allocation, or through
  /// nvidia-peermem (ibv_reg_mr on the device pointer).
  enum class Gdr { off, dmabuf, peermem };
  Gdr gdr() const noexcept { return gdr_; }
  void posted(IbvConnection& c) {
    changed_ = true;
    if (c.state_ == IbvConnection::State::established) step(c);
  }
  void fail(IbvConnection& c, const std::string& msg, bool closed, int blame);
  std::string self() const { return "ibverbs transport (rank " + std::to_string(o_.rank) + ")"; }

 private:
  void open();
  void teardown() noexcept;
  void to_error(IbvConnection& c);
  /// Writes a control slot (bye, abort) when credits, staging and the send queue allow.
  bool post_control_slot(IbvConnection& c, std::uint32_t kind, std::uint64_t total);
  void unwatch() noexcept;
  IbvConnection& get(int peer);
  bool make_qp(IbvConnection& c, std::string* why);
  void connect_steps(IbvConnection& c, Clock::time_point now);
  bool to_rts(IbvConnection& c, std::string* why);
  bool publish_ready(IbvConnection& c, std::string* why) {
    try {
      directory_.publish("ibv-ready-" + std::to_string(c.peer_), "1");
      return true;
    } catch (const std::exception& e) {
      *why = std::string("cannot publish that its queue pair is ready: ") + e.what();
      return false;
    }
  }
  bool poll_cq();
  void on_completion(const ibv_wc& wc);
  void on_async();
  bool step(IbvConnection& c);
  bool receive_side(IbvConnection& c);
  bool send_side(IbvConnection& c);
  bool post_recvs(IbvConnection& c);
  void probe(IbvConnection& c, bool moved);
  /// Posts an RDMA write of `bytes` from (addr, lkey) to (raddr, rkey) on lane `lane`, with
  /// immediate `imm` unless it is 0; false with the connection failed when the post is refused.
  bool write(IbvConnection& c, std::uint64_t addr, std::uint32_t lkey, std::size_t bytes, std::uint64_t raddr,
             std::uint32_t rkey, std::uint32_t imm, bool signaled, std::size_t lane = 0);
  /// The post itself: 0, or the errno of a refused post (nothing posted, nothing failed).
  int post_write(IbvConnection& c, std::uint64_t addr, std::uint32_t lkey, std::size_t bytes, std::uint64_t raddr,
                 std::uint32_t rkey, std::uint32_t imm, bool signaled, std::size_t lane = 0);
  /// Free send-queue entries of lane `l` of `c`.
  int sq_room(const IbvConnection& c, std::size_t l = 0) const {
    const Lane& lane = c.lanes_[l];
    return (l == 0 ? sq_depth_ : kDataSqDepth) - static_cast<int>(lane.wr_posted - lane.wr_completed);
  }
  /// Chooses gdr_ (open(), once the protection domain exists); throws for BRAID_GDR=1 when
  /// neither way is available.
  void choose_gdr();
  /// Registers [base, base+bytes) of GPU memory as gdr_ says (the device cache's callback).
  bool register_device(std::uintptr_t base, std::size_t bytes, ibverbs::Registration* out, std::string* why);
  const ibverbs::Registration* register_user(const void* buf, std::size_t bytes, IbvConnection& c, bool device);
  void release_user(const ibverbs::Registration*& r, bool device) {
    if (r == nullptr) return;
    ibverbs::RegCache& cache = device ? *dev_cache_ : *cache_;
    // Read before the release: the entry may go with it (another user marked it stale).
    const std::uintptr_t base = r->base;
    const std::size_t bytes = r->bytes;
    cache.release(r);
    r = nullptr;
    if (!o_.reg_cache) cache.invalidate(reinterpret_cast<const void*>(base), bytes);
  }
  void arm_timer();

  const IbvOptions o_;
  const Api& api_;
  Poller& poller_;
  PeerDirectory& directory_;
  ConnectionTable<IbvConnection> conns_;
  std::mt19937_64 rng_;
  std::size_t slots_ = 16;
  int sq_depth_ = 0, rq_depth_ = 0;

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  unsigned unacked_events_ = 0;
  std::uint8_t port_ = 1;
  bool ethernet_ = false;
  std::uint16_t lid_ = 0;
  int gid_index_ = 0;
  std::array<std::uint8_t, 16> gid_{};
  ibv_mtu mtu_ = IBV_MTU_1024;
  std::string where_;  ///< "fakeverbs0:1 GID 1" for messages
  std::size_t max_write_ = kMaxWrite;  ///< bytes per RDMA write: the port's max_msg_sz, at most 1 GiB
  std::unique_ptr<ibverbs::RegCache> cache_;
  std::unique_ptr<ibverbs::RegCache> dev_cache_;  ///< registrations of GPU memory (gdr_ != off)
  Gdr gdr_ = Gdr::off;
  /// Every QP's number: its connection and lane.
  std::unordered_map<std::uint32_t, std::pair<IbvConnection*, std::size_t>> by_qpn_;
  base::UniqueFd timer_fd_;
  Clock::time_point armed_for_ = Clock::time_point::max();
  bool watching_ = false;
  bool armed_ = false;
  bool changed_ = false;
  bool closed_ = false;
  std::string closed_reason_;
};

// --- Opening the device ------------------------------------------------------------------

void IbvTransport::open() {
  // Fork safety: registered pages must not be shared copy-on-write with a child. Kernels
  // from 5.13 make that safe by themselves (IBV_FORK_UNNEEDED); older ones need
  // ibv_fork_init() before the first registration.
  if (api_.is_fork_initialized == nullptr || api_.is_fork_initialized() == IBV_FORK_DISABLED) {
    if (api_.fork_init() != 0) {
      BRAID_LOG(warn, self() << ": ibv_fork_init failed (" << errno_text(errno)
                             << "): a child forked while braid holds registered memory may corrupt it");
    }
  }
  int n = 0;
  ibv_device** list = api_.get_device_list(&n);
  if (list == nullptr) {
    throw Error(ErrorCode::Unsupported,
                "ibverbs transport: no RDMA devices (ibv_get_device_list: " + errno_text(errno) + ")");
  }
  struct Found {
    ibv_device* dev;
    ibv_port_attr attr;
  };
  std::vector<ibverbs::PortInfo> ports;
  std::vector<Found> found;
  for (int i = 0; i < n; ++i) {
    ibv_context* c = api_.open_device(list[i]);
    if (c == nullptr) continue;
    ibv_device_attr da{};
    if (api_.query_device(c, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (api_.query_port(c, static_cast<std::uint8_t>(p), &pa) != 0) continue;
        ibverbs::PortInfo info;
        info.device = api_.get_device_name(list[i]);
        info.port = p;
        info.active = pa.state == IBV_PORT_ACTIVE;
        info.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        info.active_mtu = ibverbs::mtu_bytes(pa.active_mtu);
        info.numa_node = ibverbs::read_numa_node(o_.sysfs_root, info.device);
        info.pci_path = ibverbs::read_pci_path(o_.sysfs_root, info.device);
        ports.push_back(info);
        found.push_back({list[i], pa});
      }
    }
    api_.close_device(c);
  }
  const ibverbs::HcaSpec spec = ibverbs::parse_hca(o_.hca);
  // The NIC nearest the rank's GPU: its PCI path, compared with each port's device's.
  std::string gpu_path;
  if (!o_.gpu_pci_bus_id.empty()) {
    char resolved[PATH_MAX];
    const std::string link = o_.sysfs_root + "/bus/pci/devices/" + o_.gpu_pci_bus_id;
    if (::realpath(link.c_str(), resolved) != nullptr) gpu_path = resolved;
  }
  const ibverbs::PortChoice pc = ibverbs::choose_port(ports, spec, gpu_path);
  if (pc.index < 0) {
    api_.free_device_list(list);
    throw Error(ErrorCode::Unsupported, "ibverbs transport: " + pc.reason);
  }
  const ibverbs::PortInfo& pi = ports[static_cast<std::size_t>(pc.index)];
  const ibv_port_attr pa = found[static_cast<std::size_t>(pc.index)].attr;
  ctx_ = api_.open_device(found[static_cast<std::size_t>(pc.index)].dev);
  api_.free_device_list(list);
  if (ctx_ == nullptr) throw Error(ErrorCode::System, "ibverbs transport: cannot open " + pi.device + ": " + errno_text(errno));
  port_ = static_cast<std::uint8_t>(pi.port);
  ethernet_ = pi.ethernet;
  lid_ = pa.lid;
  mtu_ = pa.active_mtu;
  // The GID: index 0 on InfiniBand; on RoCE as NCCL chooses (ibv_config.hpp).
  std::vector<ibverbs::GidEntry> table;
  for (int i = 0; i < pa.gid_tbl_len && i < 256; ++i) {
    ibv_gid g{};
    if (api_.query_gid(ctx_, port_, i, &g) != 0) continue;
    ibverbs::GidEntry e;
    e.index = i;
    std::memcpy(e.raw.data(), g.raw, 16);
    e.type = ibverbs::read_gid_type(o_.sysfs_root, pi.device, pi.port, i, ethernet_);
    table.push_back(e);
  }
  const ibverbs::GidPolicy policy =
      ibverbs::parse_gid_policy(o_.gid_index, o_.addr_family, o_.addr_range, o_.roce_version);
  const ibverbs::GidChoice gc = ibverbs::choose_gid(table, ethernet_, policy);
  if (gc.index < 0) throw Error(ErrorCode::Unsupported, "ibverbs transport: " + pi.device + ":" +
                                                           std::to_string(pi.port) + ": " + gc.reason);
  gid_index_ = gc.index;
  for (const auto& e : table)
    if (e.index == gc.index) gid_ = e.raw;
  where_ = pi.device + ":" + std::to_string(pi.port) + (ethernet_ ? " GID " + std::to_string(gid_index_) : "");
  BRAID_LOG(info, self() << ": " << pc.reason << "; " << (ethernet_ ? "RoCE" : "InfiniBand") << ", MTU "
                         << ibverbs::mtu_bytes(mtu_) << "; " << gc.reason);

  pd_ = api_.alloc_pd(ctx_);
  if (pd_ == nullptr) throw Error(ErrorCode::System, self() + ": ibv_alloc_pd: " + errno_text(errno));
  channel_ = api_.create_comp_channel(ctx_);
  if (channel_ == nullptr) throw Error(ErrorCode::System, self() + ": ibv_create_comp_channel: " + errno_text(errno));
  ibv_device_attr da{};
  if (api_.query_device(ctx_, &da) != 0) throw Error(ErrorCode::System, self() + ": ibv_query_device: " + errno_text(errno));
  const long long per_peer = sq_depth_ + rq_depth_ +
                             static_cast<long long>(o_.qps_per_peer - 1) * (kDataSqDepth + kDataRqDepth);
  const long long want = std::max<long long>(256, static_cast<long long>(o_.size - 1) * per_peer);
  const int cqe = static_cast<int>(std::min<long long>(want, da.max_cqe > 0 ? da.max_cqe : want));
  max_write_ = std::min<std::size_t>(kMaxWrite, pa.max_msg_sz > 0 ? pa.max_msg_sz : kMaxWrite);
  cq_ = api_.create_cq(ctx_, cqe, nullptr, channel_, 0);
  if (cq_ == nullptr) throw Error(ErrorCode::System, self() + ": ibv_create_cq of " + std::to_string(cqe) +
                                                         " entries: " + errno_text(errno));
  for (int fd : {channel_->fd, ctx_->async_fd}) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
      throw Error(ErrorCode::System, self() + ": cannot make the verbs event fds non-blocking: " + errno_text(errno));
  }
  timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timer_fd_) throw Error(ErrorCode::System, self() + ": timerfd_create: " + errno_text(errno));
  cache_ = std::make_unique<ibverbs::RegCache>(
      [this](std::uintptr_t base, std::size_t bytes, ibverbs::Registration* out, std::string* why) {
        ibv_mr* mr = api_.reg_mr(pd_, reinterpret_cast<void*>(base), bytes,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (mr == nullptr) {
          const int err = errno;
          *why = "ibv_reg_mr of " + std::to_string(bytes) + " bytes: " + errno_text(err) + memlock_hint(err);
          return false;
        }
        return registered(mr, base, bytes, out);
      },
      [this](const ibverbs::Registration& r) { api_.dereg_mr(static_cast<ibv_mr*>(r.handle)); }, 64);
  choose_gdr();
  poller_.watch(channel_->fd, EPOLLIN, [](std::uint32_t) {});
  poller_.watch(ctx_->async_fd, EPOLLIN, [this](std::uint32_t) { on_async(); });
  poller_.watch(timer_fd_.get(), EPOLLIN, [this](std::uint32_t) {
    std::uint64_t x = 0;
    while (::read(timer_fd_.get(), &x, sizeof x) > 0) {
    }
    armed_for_ = Clock::time_point::max();
  });
  watching_ = true;
  if (ibv_req_notify_cq(cq_, 0) != 0) throw Error(ErrorCode::System, self() + ": ibv_req_notify_cq failed");
  armed_ = true;
}

void IbvTransport::unwatch() noexcept {
  if (!watching_) return;
  poller_.unwatch(channel_->fd);
  poller_.unwatch(ctx_->async_fd);
  poller_.unwatch(timer_fd_.get());
  watching_ = false;
}

void IbvTransport::teardown() noexcept {
  unwatch();
  for (IbvConnection* c : conns_.all()) {
    for (Lane& l : c->lanes_) {
      if (l.qp != nullptr) api_.destroy_qp(l.qp);
      l.qp = nullptr;
    }
    c->ring_.reset();
    c->staging_.reset();
    c->control_.reset();
    c->outbox_.reset();
  }
  by_qpn_.clear();
  dev_cache_.reset();
  cache_.reset();
  if (cq_ != nullptr) {
    if (unacked_events_ > 0) api_.ack_cq_events(cq_, unacked_events_);
    unacked_events_ = 0;
    api_.destroy_cq(cq_);
    cq_ = nullptr;
  }
  if (channel_ != nullptr) api_.destroy_comp_channel(channel_);
  channel_ = nullptr;
  if (pd_ != nullptr) api_.dealloc_pd(pd_);
  pd_ = nullptr;
  if (ctx_ != nullptr) api_.close_device(ctx_);
  ctx_ = nullptr;
  timer_fd_.reset();
}

// --- Connections -------------------------------------------------------------------------

void IbvConnection::send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  post_send(buf, bytes, tag, req, false);
}

void IbvConnection::recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  post_recv(buf, bytes, tag, req, false);
}

bool IbvConnection::takes_device_memory() const noexcept { return t_.gdr() != IbvTransport::Gdr::off; }

void IbvConnection::send_device(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  if (!takes_device_memory()) return Connection::send_device(buf, bytes, tag, req);
  post_send(buf, bytes, tag, req, true);
}

void IbvConnection::recv_device(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  if (!takes_device_memory()) return Connection::recv_device(buf, bytes, tag, req);
  post_recv(buf, bytes, tag, req, true);
}

void IbvConnection::post_send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req, bool device) {
  check_post("ibverbs", "send", buf, bytes, req, peer_);
  start_request(req);
  if (failure_.failed) return failure_.apply(req);
  SendOp op;
  op.req = req;
  op.buf = static_cast<const unsigned char*>(buf);
  op.bytes = bytes;
  op.tag = tag;
  op.device = device;
  sends_.push_back(op);
  t_.posted(*this);
}

void IbvConnection::post_recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req, bool device) {
  check_post("ibverbs", "recv", buf, bytes, req, peer_);
  start_request(req);
  if (failure_.failed) return failure_.apply(req);
  RecvOp op;
  op.req = req;
  op.buf = static_cast<unsigned char*>(buf);
  op.bytes = bytes;
  op.tag = tag;
  op.device = device;
  recvs_.push_back(op);
  t_.posted(*this);
}

IbvConnection& IbvTransport::get(int peer) {
  bool fresh = false;
  IbvConnection& c = conns_.get(peer, [&] { return std::make_unique<IbvConnection>(*this, peer); }, &fresh);
  if (!fresh) return c;
  if (closed_) {
    c.failure_.set(closed_reason_, false, -1);
    c.state_ = IbvConnection::State::failed;
    return c;
  }
  std::string why;
  if (!make_qp(c, &why)) {
    fail(c, "cannot connect to rank " + std::to_string(peer) + ": " + why, false, -1);
    return c;
  }
  c.state_ = IbvConnection::State::looking_up;
  c.lookup_ = PeerLookup{Clock::now() + o_.connect_timeout};
  c.lookup_.retry_at = Clock::now();
  changed_ = true;
  return c;
}

bool IbvTransport::make_qp(IbvConnection& c, std::string* why) {
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (!c.ring_.make(api_, pd_, slots_ * o_.slot_bytes, remote, why) ||
      !c.staging_.make(api_, pd_, slots_ * o_.slot_bytes, IBV_ACCESS_LOCAL_WRITE, why) ||
      !c.control_.make(api_, pd_, wire::kControlBytes, remote, why) ||
      !c.outbox_.make(api_, pd_, wire::kControlBytes, IBV_ACCESS_LOCAL_WRITE, why)) {
    return false;
  }
  c.staging_wr_.assign(slots_, 0);
  c.lanes_.resize(o_.qps_per_peer);
  for (std::size_t l = 0; l < c.lanes_.size(); ++l) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq_;
    ia.recv_cq = cq_;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 0;
    ia.cap.max_send_wr = static_cast<std::uint32_t>(l == 0 ? sq_depth_ : kDataSqDepth);
    ia.cap.max_recv_wr = static_cast<std::uint32_t>(l == 0 ? rq_depth_ : kDataRqDepth);
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = l == 0 ? 64 : 0;  // credits and CTS entries go inline where the HCA allows
    ibv_qp*& qp = c.lanes_[l].qp;
    qp = api_.create_qp(pd_, &ia);
    if (qp == nullptr && ia.cap.max_inline_data > 0) {  // an HCA without inline sends: again without
      ia.cap.max_inline_data = 0;
      qp = api_.create_qp(pd_, &ia);
    }
    if (qp == nullptr) {
      *why = "ibv_create_qp (queue pair " + std::to_string(l + 1) + " of " + std::to_string(c.lanes_.size()) +
             "): " + errno_text(errno);
      return false;
    }
    if (l == 0) c.max_inline_ = ia.cap.max_inline_data;
    by_qpn_[qp->qp_num] = {&c, l};
    ibv_qp_attr a{};
    const int mask = ibverbs::init_attr(&a, port_, static_cast<unsigned>(remote));
    if (const int rc = api_.modify_qp(qp, &a, mask); rc != 0) {
      *why = "ibv_modify_qp to INIT: " + errno_text(rc);
      return false;
    }
  }
  if (!post_recvs(c)) {
    *why = "ibv_post_recv failed";
    return false;
  }
  c.psn_ = static_cast<std::uint32_t>(rng_()) & 0xffffffu;
  ibverbs::ConnRecord r;
  r.comm_id = o_.comm_id;
  r.from = o_.rank;
  r.to = c.peer_;
  r.lid = lid_;
  r.gid = gid_;
  r.ethernet = ethernet_;
  r.mtu = static_cast<std::uint8_t>(mtu_);
  r.qpn = c.lanes_[0].qp->qp_num;
  r.psn = c.psn_;
  for (std::size_t l = 1; l < c.lanes_.size(); ++l) r.data_qpns.push_back(c.lanes_[l].qp->qp_num);
  r.ring_addr = c.ring_.addr();
  r.ring_rkey = c.ring_.rkey();
  r.slots = static_cast<std::uint32_t>(slots_);
  r.slot_bytes = static_cast<std::uint32_t>(o_.slot_bytes);
  r.ctrl_addr = c.control_.addr();
  r.ctrl_rkey = c.control_.rkey();
  r.ctrl_bytes = static_cast<std::uint32_t>(wire::kControlBytes);
  ibverbs::sign_record(&r, o_.auth_token);  // the token itself never goes into the store
  const std::string rec = ibverbs::encode_record(r);
  try {
    directory_.publish("ibv-record-" + std::to_string(c.peer_), base::hex_bytes(rec.data(), rec.size()));
  } catch (const std::exception& e) {
    *why = std::string("cannot publish its connection record: ") + e.what();
    return false;
  }
  return true;
}

bool IbvTransport::post_recvs(IbvConnection& c) {
  // Zero-length receives: every write the peer makes with an immediate consumes one.
  for (std::size_t l = 0; l < c.lanes_.size(); ++l) {
    Lane& lane = c.lanes_[l];
    while (lane.recvs_posted < (l == 0 ? rq_depth_ : kDataRqDepth)) {
      ibv_recv_wr wr{};
      ibv_recv_wr* bad = nullptr;
      wr.wr_id = 0;
      wr.num_sge = 0;
      if (ibv_post_recv(lane.qp, &wr, &bad) != 0) return false;
      ++lane.recvs_posted;
    }
  }
  return true;
}

bool IbvTransport::to_rts(IbvConnection& c, std::string* why) {
  const ibverbs::ConnRecord& r = c.remote_;
  ibverbs::PathEnds p;
  p.ethernet = ethernet_;
  p.port = port_;
  p.sgid_index = gid_index_;
  p.remote_lid = r.lid;
  p.remote_gid = r.gid;
  p.remote_psn = r.psn;
  p.local_psn = c.psn_;
  p.mtu = std::min(mtu_, static_cast<ibv_mtu>(r.mtu));
  p.traffic_class = static_cast<std::uint8_t>(o_.traffic_class);
  p.service_level = static_cast<std::uint8_t>(o_.service_level);
  p.timeout = static_cast<std::uint8_t>(o_.timeout);
  p.retry_cnt = static_cast<std::uint8_t>(o_.retry_cnt);
  // Lane l connects to the peer's lane l (the peer's record lists its data QPs in order).
  for (std::size_t l = 0; l < c.lanes_.size(); ++l) {
    p.remote_qpn = l == 0 ? r.qpn : r.data_qpns[l - 1];
    ibv_qp_attr a{};
    int mask = ibverbs::rtr_attr(&a, p);
    if (const int rc = api_.modify_qp(c.lanes_[l].qp, &a, mask); rc != 0) {
      *why = "ibv_modify_qp to RTR: " + errno_text(rc) + "; " + ibverbs::rtr_failure_hint(p, rc);
      return false;
    }
    a = ibv_qp_attr{};
    mask = ibverbs::rts_attr(&a, p);
    if (const int rc = api_.modify_qp(c.lanes_[l].qp, &a, mask); rc != 0) {
      *why = "ibv_modify_qp to RTS: " + errno_text(rc);
      return false;
    }
  }
  return true;
}

void IbvTransport::connect_steps(IbvConnection& c, Clock::time_point now) {
  using S = IbvConnection::State;
  if ((c.state_ != S::looking_up && c.state_ != S::awaiting_ready) || now < c.lookup_.retry_at) return;
  // A peer that died before its side of the pair existed leaves nothing to find (a socket
  // transport's connect would be refused): the job's records say so, if a rank noticed.
  if (now >= c.gone_check_at_) {
    c.gone_check_at_ = now + std::chrono::milliseconds(250);
    if (const std::optional<std::string> gone = directory_.peer_gone(c.peer_)) {
      fail(c, "cannot connect to rank " + std::to_string(c.peer_) + ": reset or closed by peer: " + *gone, true,
           c.peer_);
      return;
    }
  }
  const bool records = c.state_ == S::looking_up;
  std::string error;
  const std::optional<std::string> value =
      c.lookup_.look(directory_, c.peer_, (std::string(records ? "ibv-record-" : "ibv-ready-") + std::to_string(o_.rank)).c_str(),
                     records ? "its verbs connection record" : "that its queue pair is ready",
                     "is it running, does it use the ibverbs transport, and has it posted the matching call?",
                     o_.connect_timeout, &error);
  if (!value && error.empty()) return;
  if (error.empty() && records) {
    std::vector<unsigned char> bytes;
    if (!base::from_hex_bytes(*value, &bytes)) {
      error = "its published record is not hex";
    } else if (!ibverbs::decode_record(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                                       &c.remote_, &error)) {
      error = "its published record is malformed: " + error;
    } else if (!ibverbs::record_authentic(c.remote_, o_.comm_id, o_.rank, c.peer_, o_.auth_token)) {
      // A stranger's (another job or communicator sharing the store): refused and reported
      // once, and looked at again until the connect timeout, since the real peer may yet
      // publish its own in its place.
      if (*value != c.refused_) {
        c.refused_ = *value;
        if (o_.on_refused) {
          o_.on_refused(self() + " refused the verbs record published as rank " + std::to_string(c.peer_) +
                        "'s: it names another communicator, rank or token");
        }
      }
      if (now < c.lookup_.deadline) {
        c.lookup_.later(now);
        return;
      }
      error = "it published no record for this communicator within " + std::to_string(o_.connect_timeout.count()) +
              " ms (only one naming another communicator, rank or token)";
    } else if (c.remote_.ethernet != ethernet_) {
      error = std::string("its port is ") + (c.remote_.ethernet ? "RoCE" : "InfiniBand") + " and ours (" + where_ +
              ") is " + (ethernet_ ? "RoCE" : "InfiniBand") + ": choose ports on one fabric (BRAID_IB_HCA)";
    } else if (c.remote_.data_qpns.size() + 1 != o_.qps_per_peer) {
      error = "it uses " + std::to_string(c.remote_.data_qpns.size() + 1) + " queue pairs per peer and we " +
              std::to_string(o_.qps_per_peer) + ": set BRAID_IB_QPS_PER_PEER alike on every rank";
    } else if (c.remote_.slots != slots_ || c.remote_.slot_bytes != o_.slot_bytes ||
               c.remote_.ctrl_bytes != wire::kControlBytes) {
      error = "it uses " + std::to_string(c.remote_.slots) + " slots of " + std::to_string(c.remote_.slot_bytes) +
              " bytes and we " + std::to_string(slots_) + " of " + std::to_string(o_.slot_bytes) +
              ": set BRAID_IB_SLOTS and BRAID_IB_SLOT_BYTES alike on every rank";
    } else if (to_rts(c, &error) && publish_ready(c, &error)) {
      c.state_ = S::awaiting_ready;
      c.lookup_.retry_at = now;
      c.lookup_.backoff = std::chrono::milliseconds(1);
      changed_ = true;
      return;
    }
  } else if (error.empty()) {
    c.state_ = S::established;
    BRAID_LOG(trace, self() << ": connected to rank " << c.peer_ << " (QPN " << c.lanes_[0].qp->qp_num << " -> "
                            << c.remote_.qpn << ", " << where_ << ")");
    changed_ = true;
    return;
  }
  fail(c, "cannot connect to rank " + std::to_string(c.peer_) + ": " + error, false, c.peer_);
}

void IbvTransport::fail(IbvConnection& c, const std::string& msg, bool closed, int blame) {
  if (!c.failure_.set(msg, closed, blame)) return;
  // A failure found here that the peer caused while alive (a mismatch, a bad write):
  // tell it with an abort slot, so that it fails at once instead of finding a dead queue
  // pair by its probes; the QP goes to ERR once the slot is acknowledged (or after 1 s).
  // Not when the failure is ours alone (blame -1: the port went down, close_all()).
  const bool tell = c.state_ == IbvConnection::State::established && !closed && !closed_ && blame == c.peer_;
  c.state_ = IbvConnection::State::failed;
  changed_ = true;
  for (SendOp& op : c.sends_) {
    if (op.req->state == Request::State::pending) c.failure_.apply(op.req);
    release_user(op.reg, op.device);
  }
  for (RecvOp& op : c.recvs_) {
    if (op.req->state == Request::State::pending) c.failure_.apply(op.req);
    release_user(op.reg, op.device);
  }
  c.sends_.clear();
  c.recvs_.clear();
  c.cursor_ = 0;
  if (tell && post_control_slot(c, wire::kAbort, 0)) {
    c.abort_wr_ = c.lanes_[0].wr_posted;
    c.error_at_ = Clock::now() + std::chrono::seconds(1);
    return;
  }
  to_error(c);
}

void IbvTransport::to_error(IbvConnection& c) {
  // The QP to ERR: its outstanding work requests are flushed (their completions ignored),
  // and nothing the peer writes lands any more.
  c.error_at_ = Clock::time_point::max();
  if (c.lanes_.empty() || c.lanes_[0].qp == nullptr || c.in_error_) return;
  c.in_error_ = true;
  for (Lane& l : c.lanes_) {
    if (l.qp == nullptr) continue;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    api_.modify_qp(l.qp, &a, IBV_QP_STATE);
  }
}

bool IbvTransport::post_control_slot(IbvConnection& c, std::uint32_t kind, std::uint64_t total) {
  const std::uint64_t freed =
      __atomic_load_n(reinterpret_cast<const std::uint64_t*>(c.control_.data()), __ATOMIC_ACQUIRE);
  const std::size_t idx = c.slots_written_ % slots_;
  if (wire::credits(slots_, c.slots_written_, freed) <= 0 || sq_room(c) < 2 || c.staging_wr_[idx] > c.lanes_[0].wr_completed)
    return false;
  wire::SlotHeader h;
  h.kind = kind;
  h.total = total;
  unsigned char* s = c.staging_.data() + idx * o_.slot_bytes;
  wire::put_header(s, h);
  // Best effort (it runs from fail() and close_all()): a refused post just sends nothing.
  if (post_write(c, reinterpret_cast<std::uintptr_t>(s), c.staging_.lkey(), wire::kHeaderBytes,
                 c.remote_.ring_addr + idx * o_.slot_bytes, c.remote_.ring_rkey, wire::imm(wire::kImmData, 0),
                 true) != 0) {
    return false;
  }
  c.staging_wr_[idx] = c.lanes_[0].wr_posted;
  ++c.slots_written_;
  return true;
}

// --- The data path -----------------------------------------------------------------------

const ibverbs::Registration* IbvTransport::register_user(const void* buf, std::size_t bytes, IbvConnection& c,
                                                         bool device) {
  std::string why;
  const ibverbs::Registration* r = (device ? *dev_cache_ : *cache_).acquire(buf, std::max<std::size_t>(bytes, 1), &why);
  if (r == nullptr) {
    fail(c, c.who() + ": cannot register a " + std::to_string(bytes) + "-byte " + (device ? "GPU " : "") +
                "buffer: " + why,
         false, -1);
  }
  return r;
}

void IbvTransport::choose_gdr() {
  gdr_ = Gdr::off;
  if (o_.gdr == 0 || o_.gpu == nullptr || o_.gpu_device < 0) return;  // off, or no GPU to read
  // dma-buf (Linux 5.12+, rdma-core 34+, a CUDA driver and GPU that export one): probed as
  // NCCL does, with an invalid fd: a kernel or HCA without dma-buf support says
  // EOPNOTSUPP/EPROTONOSUPPORT, one with it fails on the fd itself.
  std::string no_dmabuf;
  if (api_.reg_dmabuf_mr == nullptr) {
    no_dmabuf = api_.file + " has no ibv_reg_dmabuf_mr (rdma-core 34+ needed)";
  } else if (std::string why = o_.gpu->dmabuf_support(o_.gpu_device); !why.empty()) {
    no_dmabuf = why;
  } else {
    errno = 0;
    ibv_mr* probe = api_.reg_dmabuf_mr(pd_, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE);
    const int err = errno;
    if (probe != nullptr) {
      api_.dereg_mr(probe);  // a provider that took fd -1: it will take real ones too
    } else if (err == EOPNOTSUPP || err == EPROTONOSUPPORT) {
      no_dmabuf = "the kernel or HCA does not register dma-buf memory (ibv_reg_dmabuf_mr: " + errno_text(err) + ")";
    }
  }
  // nvidia-peermem (or the older nv_peer_mem, nv_mem_nc): the NIC pins device pointers
  // through ibv_reg_mr. The files NCCL looks for.
  bool peermem = false;
  for (const char* f : {"/kernel/mm/memory_peers/nv_mem/version", "/kernel/mm/memory_peers/nv_mem_nc/version",
                        "/module/nvidia_peermem/version"})
    peermem |= ::access((o_.sysfs_root + f).c_str(), F_OK) == 0;
  if (no_dmabuf.empty()) {
    gdr_ = Gdr::dmabuf;
  } else if (peermem) {
    gdr_ = Gdr::peermem;
  } else if (o_.gdr == 1) {
    throw Error(ErrorCode::Unsupported,
                self() + ": BRAID_GDR=1, but GPUDirect RDMA is not available here: no dma-buf (" + no_dmabuf +
                    ") and no nvidia-peermem (none of " + o_.sysfs_root + "/kernel/mm/memory_peers/nv_mem{,_nc}/version, " +
                    o_.sysfs_root +
                    "/module/nvidia_peermem/version exists). Load nvidia-peermem (modprobe nvidia-peermem), or use a dma-buf "
                    "capable kernel and driver, or set BRAID_GDR=auto to stage GPU buffers through host memory");
  }
  if (gdr_ != Gdr::off) {
    dev_cache_ = std::make_unique<ibverbs::RegCache>(
        [this](std::uintptr_t base, std::size_t bytes, ibverbs::Registration* out, std::string* why) {
          return register_device(base, bytes, out, why);
        },
        [this](const ibverbs::Registration& r) { api_.dereg_mr(static_cast<ibv_mr*>(r.handle)); }, 64);
  }
  BRAID_LOG(info, self() << ": GPU " << o_.gpu_device << ": "
                         << (gdr_ == Gdr::dmabuf    ? "GPUDirect RDMA through dma-buf"
                             : gdr_ == Gdr::peermem ? "GPUDirect RDMA through nvidia-peermem (no dma-buf: " + no_dmabuf + ")"
                                                    : "no GPUDirect RDMA (" + no_dmabuf +
                                                          "; no nvidia-peermem): GPU buffers are staged through host memory"));
}

bool IbvTransport::register_device(std::uintptr_t base, std::size_t bytes, ibverbs::Registration* out,
                                   std::string* why) {
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_mr* mr = nullptr;
  if (gdr_ == Gdr::dmabuf) {
    std::uintptr_t alloc_base = 0;
    std::size_t alloc_bytes = 0;
    int fd = -1;
    try {
      fd = o_.gpu->export_dmabuf(reinterpret_cast<const void*>(base), bytes, &alloc_base, &alloc_bytes);
    } catch (const std::exception& e) {
      *why = std::string("cannot export it as a dma-buf: ") + e.what();
      return false;
    }
    // The registration's addresses (iova) are the device pointers themselves, as for host
    // memory: a peer writes to the address it was told, the NIC translates.
    mr = api_.reg_dmabuf_mr(pd_, base - alloc_base, bytes, base, fd, access);
    const int err = errno;
    ::close(fd);  // the registration keeps what it needs
    if (mr == nullptr) {
      *why = "ibv_reg_dmabuf_mr of " + std::to_string(bytes) + " bytes: " + errno_text(err) + memlock_hint(err);
      return false;
    }
  } else {
    mr = api_.reg_mr(pd_, reinterpret_cast<void*>(base), bytes, access);
    if (mr == nullptr) {
      const int err = errno;
      *why = "ibv_reg_mr of " + std::to_string(bytes) + " bytes of GPU memory (nvidia-peermem): " + errno_text(err) +
             memlock_hint(err);
      return false;
    }
  }
  return registered(mr, base, bytes, out);
}

bool IbvTransport::write(IbvConnection& c, std::uint64_t addr, std::uint32_t lkey, std::size_t bytes,
                         std::uint64_t raddr, std::uint32_t rkey, std::uint32_t imm, bool signaled, std::size_t lane) {
  if (const int rc = post_write(c, addr, lkey, bytes, raddr, rkey, imm, signaled, lane); rc != 0) {
    fail(c, c.who() + ": ibv_post_send: " + errno_text(rc), false, -1);
    return false;
  }
  return true;
}

int IbvTransport::post_write(IbvConnection& c, std::uint64_t addr, std::uint32_t lkey, std::size_t bytes,
                             std::uint64_t raddr, std::uint32_t rkey, std::uint32_t imm, bool signaled,
                             std::size_t lane) {
  Lane& l = c.lanes_[lane];
  ibv_sge sge{};
  sge.addr = addr;
  sge.length = static_cast<std::uint32_t>(bytes);
  sge.lkey = lkey;
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = ++l.wr_posted;
  wr.sg_list = bytes > 0 ? &sge : nullptr;
  wr.num_sge = bytes > 0 ? 1 : 0;
  wr.opcode = imm != 0 ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.imm_data = htonl(imm);
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  // Small control words (credits, CTS entries) inline: their source is read at the post, so
  // the outbox may be rewritten at once (a credit word changes while its write is queued).
  if (bytes > 0 && bytes <= c.max_inline_ && lkey == c.outbox_.lkey()) wr.send_flags |= IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  const int rc = ibv_post_send(l.qp, &wr, &bad);
  if (rc != 0) --l.wr_posted;
  return rc;
}

bool IbvTransport::receive_side(IbvConnection& c) {
  bool moved = false;
  while (c.state_ == IbvConnection::State::established) {
    if (c.rndv_wait_) {
      std::uint64_t per = 0;
      const std::uint64_t parts = wire::stripes(c.recvs_.front().bytes, c.lanes_.size(), &per);
      if (c.rndv_done_ - c.rndv_used_ < parts) {
        // A bye behind the request to send: the peer closed before writing the message.
        if (c.slots_done_ < c.slots_arrived_) {
          wire::SlotHeader next;
          std::string ignored;
          const unsigned char* slot = c.ring_.data() + (c.slots_done_ % slots_) * o_.slot_bytes;
          if (wire::get_header(slot, o_.slot_bytes, &next, &ignored) && next.kind == wire::kBye) {
            fail(c, c.who() + " closed by peer before it wrote message #" + std::to_string(c.messages_received_), true,
                 c.peer_);
            return true;
          }
        }
        break;
      }
      c.rndv_used_ += parts;
      RecvOp& r = c.recvs_.front();
      if (r.device) {
        // The NIC wrote GPU memory: make that visible to the kernels that read it next.
        try {
          o_.gpu->flush_rdma_writes(o_.gpu_device);
        } catch (const std::exception& e) {
          fail(c, c.who() + ": cannot flush the NIC's writes into GPU memory: " + e.what(), false, -1);
          return true;
        }
      }
      release_user(r.reg, r.device);
      r.req->state = Request::State::done;
      c.recvs_.pop_front();
      ++c.messages_received_;
      c.rndv_wait_ = false;
      moved = true;
      continue;
    }
    if (c.slots_done_ == c.slots_arrived_) break;
    const unsigned char* slot = c.ring_.data() + (c.slots_done_ % slots_) * o_.slot_bytes;
    wire::SlotHeader h;
    std::string why;
    if (!wire::get_header(slot, o_.slot_bytes, &h, &why)) {
      fail(c, c.who() + ": rank " + std::to_string(c.peer_) + " wrote " + why, false, c.peer_);
      return true;
    }
    if (h.kind == wire::kAbort) {
      fail(c, c.who() + " closed by peer: rank " + std::to_string(c.peer_) +
                  " failed the connection on its side (its error says why)",
           true, c.peer_);
      return true;
    }
    if (h.kind == wire::kBye) {
      c.bye_ = true;
      c.bye_count_ = h.total;
      ++c.slots_done_;
      moved = true;
      continue;
    }
    if (c.recvs_.empty()) break;  // the slot waits for its receive
    RecvOp& r = c.recvs_.front();
    if (h.offset == 0 && (h.tag != r.tag || h.total != r.bytes)) {
      fail(c,
           "message #" + std::to_string(c.messages_received_) + " from rank " + std::to_string(c.peer_) +
               " does not match the posted receive: expected tag " + std::to_string(r.tag) + " and " +
               std::to_string(r.bytes) + " bytes, got tag " + std::to_string(h.tag) + " and " +
               std::to_string(h.total) + " bytes (" + c.who() +
               "); the ranks disagree about the operation they are running",
           false, c.peer_);
      return true;
    }
    if (h.kind == wire::kRts) {
      // Rendezvous: tell the sender where to write.
      if (sq_room(c) < 2) break;
      const ibverbs::Registration* reg = register_user(r.buf, r.bytes, c, r.device);
      if (reg == nullptr) return true;  // the connection failed (r is gone)
      r.reg = reg;
      const std::size_t e = c.cts_sent_ % wire::kCtsEntries;
      wire::Cts cts;
      cts.addr = reinterpret_cast<std::uintptr_t>(r.buf);
      cts.rkey = r.reg->rkey;
      cts.message = static_cast<std::uint32_t>(c.messages_received_);
      cts.bytes = r.bytes;
      cts.seq = ++c.cts_sent_;
      unsigned char* src = c.outbox_.data() + wire::kCtsOffset + e * wire::kCtsBytes;
      wire::put_cts(src, cts);
      const bool sig = ++c.control_writes_ % 8 == 0;
      if (!write(c, reinterpret_cast<std::uintptr_t>(src), c.outbox_.lkey(), wire::kCtsBytes,
                 c.remote_.ctrl_addr + wire::kCtsOffset + e * wire::kCtsBytes, c.remote_.ctrl_rkey,
                 wire::imm(wire::kImmCts, cts.seq), sig)) {
        return true;
      }
      c.rndv_wait_ = true;
      ++c.slots_done_;
      moved = true;
      continue;
    }
    if (h.offset != r.got || (h.offset > 0 && h.total != r.bytes)) {
      fail(c, c.who() + ": rank " + std::to_string(c.peer_) + " wrote a chunk out of order (offset " +
                  std::to_string(h.offset) + ", expected " + std::to_string(r.got) + ")",
           false, c.peer_);
      return true;
    }
    if (h.chunk > 0 && r.device) {
      // A peer that sends from host memory sends small messages eagerly: into GPU memory
      // through the runtime (the CPU cannot store there).
      try {
        o_.gpu->copy(r.buf + h.offset, slot + wire::kHeaderBytes, h.chunk);
      } catch (const std::exception& e) {
        fail(c, c.who() + ": cannot copy a received chunk into GPU memory: " + e.what(), false, -1);
        return true;
      }
    } else if (h.chunk > 0) {
      std::memcpy(r.buf + h.offset, slot + wire::kHeaderBytes, h.chunk);
    }
    r.got += h.chunk;
    ++c.slots_done_;
    moved = true;
    if (r.got == r.bytes) {
      r.req->state = Request::State::done;
      c.recvs_.pop_front();
      ++c.messages_received_;
    }
  }
  // Credits: the count of freed slots, written into the sender's credit word.
  if (c.state_ == IbvConnection::State::established && c.slots_done_ > c.credits_returned_ && sq_room(c) >= 2) {
    std::memcpy(c.outbox_.data(), &c.slots_done_, sizeof c.slots_done_);
    const bool sig = ++c.control_writes_ % 8 == 0;
    if (!write(c, c.outbox_.addr(), c.outbox_.lkey(), sizeof(std::uint64_t), c.remote_.ctrl_addr, c.remote_.ctrl_rkey,
               wire::imm(wire::kImmCredit, 0), sig)) {
      return true;
    }
    c.credits_returned_ = c.slots_done_;
    moved = true;
  }
  if (c.state_ == IbvConnection::State::established && c.bye_ && c.messages_received_ >= c.bye_count_) {
    fail(c, c.who() + " closed by peer", true, c.peer_);
    moved = true;
  }
  return moved;
}

bool IbvTransport::send_side(IbvConnection& c) {
  bool moved = false;
  // CTS entries: write each waiting rendezvous message straight into the receiver's buffer.
  while (c.state_ == IbvConnection::State::established && c.cts_used_ < c.cts_arrived_) {
    const std::size_t e = c.cts_used_ % wire::kCtsEntries;
    const wire::Cts cts = wire::get_cts(c.control_.data() + wire::kCtsOffset + e * wire::kCtsBytes);
    SendOp* op = nullptr;
    for (SendOp& s : c.sends_) {
      if (s.state == SendOp::State::wait_cts) {
        op = &s;
        break;
      }
    }
    if (cts.seq != c.cts_used_ + 1 || op == nullptr || cts.bytes != op->bytes) {
      fail(c, c.who() + ": rank " + std::to_string(c.peer_) + " wrote a clear-to-send that matches no message (seq " +
                  std::to_string(cts.seq) + ", " + std::to_string(cts.bytes) + " bytes)",
           false, c.peer_);
      return true;
    }
    // Stripe s of the message on lane s, each in writes of at most max_write_ bytes, the last
    // of a stripe carrying the immediate: the receiver counts one per stripe.
    std::uint64_t per = 0;
    const std::uint64_t parts = wire::stripes(op->bytes, c.lanes_.size(), &per);
    const auto writes_of = [&](std::uint64_t s) {
      const std::uint64_t n = std::min<std::uint64_t>(per, op->bytes - s * per);
      return std::max<std::uint64_t>(1, (n + max_write_ - 1) / max_write_);
    };
    bool room = true;
    for (std::uint64_t s = 0; s < parts; ++s) {
      const std::uint64_t need = writes_of(s) + (s == 0 ? 1 : 0);
      if (need > static_cast<std::uint64_t>(s == 0 ? sq_depth_ : kDataSqDepth)) {
        // Would wait for room that never comes: say so instead of hanging.
        fail(c, c.who() + ": a " + std::to_string(op->bytes) + "-byte message needs " + std::to_string(need) +
                    " RDMA writes on one queue pair, more than its send queue holds; raise BRAID_IB_QPS_PER_PEER "
                    "or send it in parts",
             false, -1);
        return true;
      }
      room &= sq_room(c, s) >= static_cast<int>(need);
    }
    if (!room) break;
    const ibverbs::Registration* reg = register_user(op->buf, op->bytes, c, op->device);
    if (reg == nullptr) return true;  // the connection failed (op is gone)
    op->reg = reg;
    for (std::uint64_t s = 0; s < parts; ++s) {
      const std::uint64_t begin = s * per, end = std::min<std::uint64_t>(begin + per, op->bytes);
      const std::uint64_t writes = writes_of(s);
      for (std::uint64_t i = 0; i < writes; ++i) {
        const std::uint64_t at = begin + i * max_write_;
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(max_write_, end - at));
        const bool last = i + 1 == writes;
        if (!write(c, reinterpret_cast<std::uintptr_t>(op->buf) + at, op->reg->lkey, n, cts.addr + at, cts.rkey,
                   last ? wire::imm(wire::kImmRndvDone, cts.message) : 0, last, s)) {
          return true;
        }
      }
      op->done_wr[s] = c.lanes_[s].wr_posted;
    }
    op->state = SendOp::State::writing;
    ++c.cts_used_;
    moved = true;
  }
  // Eager chunks and requests to send, in order, as far as credits, staging and the send
  // queue allow.
  const std::uint64_t freed = __atomic_load_n(reinterpret_cast<const std::uint64_t*>(c.control_.data()), __ATOMIC_ACQUIRE);
  long long credit = wire::credits(slots_, c.slots_written_, freed);
  if (credit < 0) {
    fail(c, c.who() + ": rank " + std::to_string(c.peer_) + " returned impossible credits (" + std::to_string(freed) +
                " freed of " + std::to_string(c.slots_written_) + " written)",
         false, c.peer_);
    return true;
  }
  const std::uint64_t room = o_.slot_bytes - wire::kHeaderBytes;
  const std::uint64_t every = std::max<std::uint64_t>(1, slots_ / 4);
  while (c.state_ == IbvConnection::State::established && c.cursor_ < c.sends_.size()) {
    SendOp& op = c.sends_[c.cursor_];
    // GPU memory always by rendezvous: the CPU cannot copy it into a slot.
    if (op.state == SendOp::State::queued && op.sent == 0)
      op.rndv = op.bytes > 0 && (op.device || op.bytes >= o_.rndv_threshold);
    const std::size_t idx = c.slots_written_ % slots_;
    if (credit <= 0 || sq_room(c) < 2 || c.staging_wr_[idx] > c.lanes_[0].wr_completed) break;
    wire::SlotHeader h;
    h.tag = op.tag;
    h.total = op.bytes;
    std::size_t chunk = 0;
    if (op.rndv) {
      h.kind = wire::kRts;
    } else {
      h.kind = wire::kData;
      h.offset = op.sent;
      chunk = static_cast<std::size_t>(std::min<std::uint64_t>(room, op.bytes - op.sent));
      h.chunk = static_cast<std::uint32_t>(chunk);
    }
    unsigned char* s = c.staging_.data() + idx * o_.slot_bytes;
    wire::put_header(s, h);
    if (chunk > 0) std::memcpy(s + wire::kHeaderBytes, op.buf + op.sent, chunk);
    const bool op_done = op.rndv || op.sent + chunk == op.bytes;
    const bool burst_end = op_done && c.cursor_ + 1 == c.sends_.size();
    const std::uint64_t n = ++c.data_writes_;
    const std::size_t next = (c.slots_written_ + 1) % slots_;
    const bool sig = n % every == 0 || burst_end || credit == 1 || c.staging_wr_[next] > c.lanes_[0].wr_completed;
    if (!write(c, reinterpret_cast<std::uintptr_t>(s), c.staging_.lkey(), wire::kHeaderBytes + chunk,
               c.remote_.ring_addr + idx * o_.slot_bytes, c.remote_.ring_rkey, wire::imm(wire::kImmData, 0), sig)) {
      return true;
    }
    c.staging_wr_[idx] = c.lanes_[0].wr_posted;
    ++c.slots_written_;
    --credit;
    moved = true;
    op.sent += chunk;
    if (op_done) {
      op.state = op.rndv ? SendOp::State::wait_cts : SendOp::State::copied;
      ++c.messages_sent_;
      ++c.cursor_;
    }
  }
  // Completions, in the order posted: an eager send is done once copied out of the caller's
  // buffer, a rendezvous one once its last write has completed.
  while (!c.sends_.empty()) {
    SendOp& op = c.sends_.front();
    bool written = op.state == SendOp::State::writing;
    for (std::size_t l = 0; written && l < c.lanes_.size(); ++l) written = c.lanes_[l].wr_completed >= op.done_wr[l];
    if (op.state == SendOp::State::copied || written) {
      release_user(op.reg, op.device);
      op.req->state = Request::State::done;
      c.sends_.pop_front();
      --c.cursor_;
      moved = true;
    } else {
      break;
    }
  }
  return moved;
}

bool IbvTransport::step(IbvConnection& c) {
  if (c.state_ != IbvConnection::State::established) return false;
  bool moved = false;
  if (!post_recvs(c)) {
    fail(c, c.who() + ": ibv_post_recv failed", false, -1);
    return true;
  }
  moved |= receive_side(c);
  moved |= send_side(c);
  if (c.state_ == IbvConnection::State::established) probe(c, moved);
  return moved;
}

void IbvTransport::probe(IbvConnection& c, bool moved) {
  // Waiting on the peer: receives posted, or a rendezvous send waiting for its CTS. Nothing
  // else tells a receiver that its peer died: RC reports a dead peer only to a sender.
  bool waiting = !c.recvs_.empty() || c.cursor_ < c.sends_.size();  // receives, or sends held by credits
  for (const SendOp& op : c.sends_) waiting |= op.state == SendOp::State::wait_cts;
  const auto now = Clock::now();
  if (!waiting || moved) {
    c.probe_at_ = waiting ? now + kProbeEvery : Clock::time_point::max();
    return;
  }
  if (c.probe_at_ == Clock::time_point::max()) c.probe_at_ = now + kProbeEvery;
  if (now < c.probe_at_) return;
  if (c.probe_wr_ > c.lanes_[0].wr_completed || sq_room(c) < 2) {  // the last probe is still out
    c.probe_at_ = now + kProbeEvery;
    return;
  }
  // A zero-byte write into the spare bytes of the peer's control area.
  if (!write(c, 0, 0, 0, c.remote_.ctrl_addr + 8, c.remote_.ctrl_rkey, 0, true)) return;
  c.probe_wr_ = c.lanes_[0].wr_posted;
  c.probe_at_ = now + kProbeEvery;
}

void IbvTransport::on_completion(const ibv_wc& wc) {
  auto it = by_qpn_.find(wc.qp_num);
  if (it == by_qpn_.end()) return;
  IbvConnection& c = *it->second.first;
  Lane& lane = c.lanes_[it->second.second];
  // Our sends have wr_id >= 1, receives 0 (wc.opcode is undefined in an error completion).
  const bool recv = wc.wr_id == 0;
  if (wc.status != IBV_WC_SUCCESS) {
    if (recv) --lane.recvs_posted;
    if (c.failure_.failed || wc.status == IBV_WC_WR_FLUSH_ERR) return;
    const char* what = api_.wc_status_str(wc.status);
    if (wc.status == IBV_WC_RETRY_EXC_ERR) {
      fail(c, c.who() + " failed: reset or closed by peer: rank " + std::to_string(c.peer_) + " is unreachable (" +
                  what + ": its HCA stopped acknowledging; the process died or the link is down)",
           true, c.peer_);
    } else {
      fail(c, c.who() + " failed: " + what + " (verbs status " + std::to_string(wc.status) + ", " + where_ + ")",
           wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_REM_OP_ERR, c.peer_);
    }
    return;
  }
  if (!recv) {
    lane.wr_completed = std::max<std::uint64_t>(lane.wr_completed, wc.wr_id);
    return;
  }
  --lane.recvs_posted;
  const std::uint32_t imm = ntohl(wc.imm_data);
  if (it->second.second != 0 && wire::imm_kind(imm) != wire::kImmRndvDone) {
    fail(c, c.who() + ": rank " + std::to_string(c.peer_) + " sent immediate " + std::to_string(imm) +
                " on data queue pair " + std::to_string(it->second.second) + ", which carries rendezvous stripes only",
         false, c.peer_);
    return;
  }
  switch (wire::imm_kind(imm)) {
    case wire::kImmData: ++c.slots_arrived_; break;
    case wire::kImmCredit: break;  // the credit word is read where it is used
    case wire::kImmCts: ++c.cts_arrived_; break;
    case wire::kImmRndvDone: {
      // A stripe of the rendezvous message this side cleared to send, and only that: the
      // front receive, its message number, a queue pair within its stripe count.
      std::uint64_t per = 0;
      const bool expected = c.rndv_wait_ && !c.recvs_.empty() &&
                            wire::imm_low(imm) == (c.messages_received_ & 0x0fffffffu) &&
                            it->second.second < wire::stripes(c.recvs_.front().bytes, c.lanes_.size(), &per);
      if (!expected) {
        fail(c, c.who() + ": rank " + std::to_string(c.peer_) + " completed a rendezvous write (message " +
                    std::to_string(wire::imm_low(imm)) + ", queue pair " + std::to_string(it->second.second) +
                    ") that this side did not clear to send",
             false, c.peer_);
        return;
      }
      ++c.rndv_done_;
      break;
    }
    default:
      fail(c, c.who() + ": rank " + std::to_string(c.peer_) + " sent an unknown immediate " + std::to_string(imm), false,
           c.peer_);
  }
}

bool IbvTransport::poll_cq() {
  bool moved = false;
  ibv_wc wc[kPollBatch];
  for (;;) {
    const int n = ibv_poll_cq(cq_, kPollBatch, wc);
    if (n < 0) {
      for (IbvConnection* c : conns_.all()) fail(*c, self() + ": ibv_poll_cq failed", false, -1);
      return true;
    }
    for (int i = 0; i < n; ++i) on_completion(wc[i]);
    moved |= n > 0;
    if (n < kPollBatch) return moved;
  }
}

void IbvTransport::on_async() {
  ibv_async_event ev{};
  while (api_.get_async_event(ctx_, &ev) == 0) {
    const char* what = api_.event_type_str(ev.event_type);
    switch (ev.event_type) {
      case IBV_EVENT_PORT_ERR:
        if (ev.element.port_num != port_) break;
        [[fallthrough]];
      case IBV_EVENT_DEVICE_FATAL:
      case IBV_EVENT_CQ_ERR:
        for (IbvConnection* c : conns_.all())
          fail(*c, self() + ": " + where_ + ": " + what + " (the port went down, the device failed or its completion queue overflowed)",
               false, -1);
        break;
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
        for (IbvConnection* c : conns_.all())
          for (const Lane& l : c->lanes_)
            if (l.qp == ev.element.qp) fail(*c, c->who() + " failed: " + what, false, c->peer_);
        break;
      default:
        BRAID_LOG(info, self() << ": " << where_ << ": " << what);
    }
    api_.ack_async_event(&ev);
    changed_ = true;
  }
}

bool IbvTransport::progress() {
  if (closed_) return false;
  bool moved = changed_;
  changed_ = false;
  armed_ = false;
  // The channel's events: acknowledged in batches (ibv_destroy_cq waits for every one).
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  while (api_.get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) ++unacked_events_;
  if (unacked_events_ >= 64) {
    api_.ack_cq_events(cq_, unacked_events_);
    unacked_events_ = 0;
  }
  moved |= poll_cq();
  const auto now = Clock::now();
  moved |= conns_.step_all([&](IbvConnection& c) {
    if (c.error_at_ != Clock::time_point::max() && (c.lanes_[0].wr_completed >= c.abort_wr_ || now >= c.error_at_)) to_error(c);
    connect_steps(c, now);
    return step(c);
  });
  moved |= changed_;
  changed_ = false;
  arm_timer();
  return moved;
}

bool IbvTransport::prepare_sleep() {
  if (cq_ == nullptr || closed_) return true;
  if (changed_) return false;
  // No lost wake-up: arm, then look once more; a completion added after the arm raises an
  // event on the channel even if this poll takes it.
  if (ibv_req_notify_cq(cq_, 0) != 0) return false;
  armed_ = true;
  if (poll_cq()) {
    changed_ = true;
    return false;
  }
  arm_timer();
  return true;
}

void IbvTransport::arm_timer() {
  Clock::time_point next = Clock::time_point::max();
  for (IbvConnection* c : conns_.all()) {
    if (c->state_ == IbvConnection::State::looking_up || c->state_ == IbvConnection::State::awaiting_ready)
      next = std::min(next, c->lookup_.retry_at);
    if (c->state_ == IbvConnection::State::established) next = std::min(next, c->probe_at_);
    next = std::min(next, c->error_at_);
  }
  if (next == armed_for_ || !timer_fd_) return;
  armed_for_ = next;
  base::arm_timerfd(timer_fd_.get(), next);
}

void IbvTransport::close_all(const std::string& reason) {
  if (closed_) return;
  // A bye to every connected peer, so that it sees "closed by peer" once it has received
  // what we sent, then a second at most for the byes' completions (their acknowledgement by
  // the peer's HCA: the bye is in its memory).
  const auto until = Clock::now() + std::chrono::seconds(1);
  // First the stripes still in flight on the data queue pairs, which a bye on the first could
  // overtake (the peer would then see it before the message it ends). Their last writes
  // are signalled, so completions catch up with what was posted.
  auto striping = [&] {
    for (IbvConnection* c : conns_.all())
      for (std::size_t l = 1; l < c->lanes_.size() && !c->failure_.failed; ++l)
        if (c->lanes_[l].wr_completed < c->lanes_[l].wr_posted) return true;
    return false;
  };
  while (striping() && Clock::now() < until) poll_cq();
  for (IbvConnection* c : conns_.all()) {
    if (c->state_ == IbvConnection::State::established && post_control_slot(*c, wire::kBye, c->messages_sent_))
      c->bye_wr_ = c->lanes_[0].wr_posted;
  }
  auto waiting = [&] {
    for (IbvConnection* c : conns_.all())
      if (c->bye_wr_ != 0 && c->lanes_[0].wr_completed < c->bye_wr_ && !c->failure_.failed) return true;
    return false;
  };
  while (waiting() && Clock::now() < until) poll_cq();
  closed_ = true;
  closed_reason_ = reason;
  for (IbvConnection* c : conns_.all()) fail(*c, reason, false, -1);  // keeps an earlier failure
  // Nothing reads the fds any more (progress() returns at once): out of the poller, or a
  // flushed receive's event or a due probe timer would wake the engine thread forever.
  unwatch();
}

}  // namespace

std::unique_ptr<Transport> make_ibverbs_transport(const IbvOptions& options, Poller& poller, PeerDirectory& directory) {
  std::string why;
  const Api* api = ibverbs::load(options.library, &why);
  if (api == nullptr) throw Error(ErrorCode::Unsupported, "ibverbs transport: " + why);
  const auto pow2 = [](std::size_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (options.slots < 4 || options.slots > 4096 || !pow2(options.slots)) {
    throw Error(ErrorCode::InvalidUsage, "BRAID_IB_SLOTS=" + std::to_string(options.slots) +
                                             ": give a power of two from 4 to 4096");
  }
  if (options.qps_per_peer < 1 || options.qps_per_peer > kMaxLanes) {
    throw Error(ErrorCode::InvalidUsage, "BRAID_IB_QPS_PER_PEER=" + std::to_string(options.qps_per_peer) +
                                             ": give 1 to " + std::to_string(kMaxLanes));
  }
  if (options.slot_bytes < 256 || options.slot_bytes > (16u << 20) || !pow2(options.slot_bytes)) {
    throw Error(ErrorCode::InvalidUsage, "BRAID_IB_SLOT_BYTES=" + std::to_string(options.slot_bytes) +
                                             ": give a power of two from 256 to 16M");
  }
  return std::make_unique<IbvTransport>(options, *api, poller, directory);
}

}  // namespace braid::transport
