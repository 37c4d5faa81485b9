// The UCX transport: braid's message contract (transport.hpp) over UCP's tag API.
//
// Resources. One ucp_context per process (made on first use, cleaned up when the last
// transport of the process closes), one ucp_worker per transport instance (serialized: only the
// communicator's progress thread touches it), one endpoint per peer. The worker's address
// is published under "ucx" (hex). The worker's event fd sits in the engine's poller and
// prepare_sleep() arms it; a timerfd serves the set-up retries and deadlines.
//
// Set-up (as tcp: the lower rank of a pair connects, the higher one accepts). The lower
// rank looks the higher one's address up (without blocking), makes an endpoint and sends a
// hello on a control tag: communicator, both ranks, a session number it chose, its own
// worker address and a fresh proof of the job's token bound to all of them (base/auth.hpp;
// the token never travels, and a nonce seen before is refused as a replay). The higher rank keeps one wildcard control receive posted;
// an authentic hello makes its endpoint (from the address in the hello) and it replies
// with its own hello (echoing the connector's session). Data moves only once each side
// holds an authentic hello from the other. An inauthentic hello is reported through
// on_refused and not answered: no endpoint is ever made towards an address a stranger
// gave (its requests fail at its set-up deadline); the accepting side's own requests for
// that rank stay pending (the real peer may come yet).
//
// UCP tags (64 bits): [sender rank 16 | sender's session 24 | 24 bits of braid's tag].
// Session 0 is the control channel (the low bits then say hello or bye; refusal is retired). A data
// receive is posted with a mask on rank + session: UCX matches the messages of one
// endpoint in the order they were sent, so the n-th receive posted for a peer takes its
// n-th message (FIFO) and no sequence number is needed. Because the session is the peer's
// own, chosen per connection and learnt from its authentic hello, messages a refused
// stranger sent under the same rank never match the real peer's receives. On completion
// the receiver compares the 24 tag bits and the received length with what it posted (it
// posts exactly `bytes`, so a longer message is truncated and a shorter one is seen) and
// fails the receive and the connection naming both; the sent tag is shown with the high
// 40 bits of the expected one, which is exact whenever the two differ only below bit 24.
//
// Completion order. UCX may finish a small send before a large rendezvous one posted
// earlier; braid requests are completed strictly in the order posted (per direction).
//
// Failures. An endpoint error (UCP_ERR_HANDLING_MODE_PEER: a reset socket, a dead
// process) or a failed send fails the connection naming the peer; close_all() and the
// destructor send each connected peer a bye carrying the number of messages sent, and wait
// (at most 1 s) for its acknowledgement before closing, so that a peer that closes is seen
// as "closed by peer" once its last messages are received, even where UCX itself would
// notice only by keepalive, and no unread data is lost to a reset socket.
//
// UCX is not fork-safe: the context is shared by the process's transports and cleaned up
// with the last one, so that a child forked while none is alive starts clean.
#include "transport/ucx/ucx_transport.hpp"

#include "base/fd.hpp"
#include "base/logging.hpp"
#include "base/text.hpp"
#include "transport/common.hpp"
#include "transport/interfaces.hpp"
#include "transport/skeleton.hpp"
#include "transport/ucx/ucx_lib.hpp"
#include "transport/ucx/ucx_wire.hpp"

#include <braid/error.hpp>

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <random>

namespace braid::transport {
namespace {

using ucx::Api;

constexpr std::uint64_t kRankShift = 48;
constexpr std::uint64_t kSessionShift = 24;
constexpr std::uint64_t kLow24 = (std::uint64_t{1} << 24) - 1;
constexpr std::uint64_t kDataMask = ~kLow24;                            // rank + session
constexpr std::uint64_t kSessionMask = kLow24 << kSessionShift;         // session only
constexpr std::size_t kControlBytes = 64 << 10;

using ucx_wire::Control;
using ucx_wire::ControlView;
using ucx_wire::Kind;
using ucx_wire::kBye;
using ucx_wire::kByeAck;
using ucx_wire::kControlFixed;
using ucx_wire::kHello;

/// 24 bits of braid's tag: the low 24 xor a fold of the high 40, so small tags are exact.
std::uint64_t tag_bits(std::uint64_t tag) {
  const std::uint64_t hi = tag >> 24;
  return (tag ^ hi ^ (hi >> 24)) & kLow24;
}
/// The sent tag as far as its 24 bits tell, assuming the high bits of `expected`.
std::uint64_t guess_tag(std::uint64_t bits, std::uint64_t expected) {
  const std::uint64_t hi = expected >> 24;
  return (hi << 24) | ((bits ^ hi ^ (hi >> 24)) & kLow24);
}


// --- The process's context ---------------------------------------------------------------

// The process's context, shared by its transports and cleaned up with the last of them:
// UCX is not fork-safe, and a context left alive keeps UCX's async thread, whose state a
// forked child would inherit (its connections would then never be accepted).
struct ProcessContext {
  std::mutex mu;
  ucp_context_h context = nullptr;
  pid_t owner = 0;
  int users = 0;
};
ProcessContext& process() {
  static ProcessContext* p = new ProcessContext;  // never destroyed: used by destructors
  return *p;
}

/// ucp_init with braid's settings; null with the reason in *why. `net_devices` non-empty:
/// UCX's NET_DEVICES (the network devices it may use).
ucp_context_h init_context(const Api& api, std::size_t eager_limit, bool no_zcopy, const std::string& net_devices,
                           std::string* why) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = api.config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    *why = std::string("ucp_config_read: ") + api.status_string(st) + " (check the UCX_* variables)";
    return nullptr;
  }
  // Messages up to BRAID_UCX_EAGER_LIMIT go eagerly, so that their sends complete without
  // the peer's receive (as a socket buffer or a shm ring lets them); UCX's own choice over
  // tcp is lower. 0 leaves it to UCX (UCX_RNDV_THRESH).
  if (eager_limit > 0) {
    const std::string v = std::to_string(eager_limit);
    api.config_modify(config, "RNDV_THRESH", v.c_str());
  }
  if (no_zcopy) api.config_modify(config, "ZCOPY_THRESH", "inf");
  if (!net_devices.empty()) api.config_modify(config, "NET_DEVICES", net_devices.c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // thread ranks of one process each have a worker
  ucp_context_h made = nullptr;
  st = api.init(&params, config, &made);
  api.config_release(config);
  if (st != UCS_OK) {
    *why = std::string("ucp_init: ") + api.status_string(st) + " (check UCX_TLS and UCX_NET_DEVICES)";
    return nullptr;
  }
  return made;
}

ucp_context_h acquire_context(const Api& api, const UcxOptions& o, std::string* why) {
  ProcessContext& pc = process();
  std::lock_guard<std::mutex> g(pc.mu);
  if (pc.context != nullptr && pc.owner == ::getpid()) {
    ++pc.users;
    return pc.context;
  }
  // A forked child never uses (or cleans up) the context of its parent.
  pc.context = nullptr;
  pc.users = 0;
  const std::size_t eager_limit = o.eager_limit;
  const std::string& zcopy = o.zcopy;
  // braid's interface, chosen before UCX is touched: a BRAID_SOCKET_IFNAME without an
  // address throws InvalidUsage here, leaving no context behind.
  // No master address known: an interface other hosts can reach (as the tcp transport).
  const Interface chosen = o.net_devices_given ? Interface{} : select_interface(o.ifname, o.master_addr, true);
  ucp_context_h made = init_context(api, eager_limit, zcopy == "0", "", why);
  if (made == nullptr) return nullptr;
  const std::vector<std::string> resources = ucx::context_resources(api, made);
  bool rdma = false, tcp = false;
  for (const auto& r : resources) {
    const std::string tl = r.substr(0, r.find('/'));
    rdma = rdma || ucx::is_rdma_transport(tl);
    tcp = tcp || tl == "tcp";
  }
  // Where UCX moves data between hosts over its tcp transport (no rc, dc or ud resource),
  // braid turns off zero-copy sends (ZCOPY_THRESH=inf) unless BRAID_UCX_ZCOPY says otherwise.
  // UCX 1.13's tcp transport completes a zero-copy send a second time when it finds its
  // endpoint failed (a peer's link cut with sends in flight: "Endpoint timeout"): the
  // process then aborts on UCX's assertion `comp->count > 0' (uct_iface.h), or touches a
  // freed request where assertions are compiled out. cluster_linkcut_ucx hit it in 4 of
  // 11 runs; with copies, 0 of 27. The price is speed where ucx is forced onto tcp or
  // shared memory (auto never does): docs/transport-ucx.md has the figures.
  const bool no_zcopy = zcopy == "0" || (zcopy == "auto" && !rdma && tcp);
  // UCX's tcp transport advertises every interface that has an address (docker0, a bridge
  // another program is making) and connects over them; a refused connection there aborted
  // the process inside UCX 1.13 (tcp_ep.c:478, issue 38). So it gets only the interface
  // braid chose, as the tcp transport binds, unless the user gave UCX_NET_DEVICES.
  std::string devices;
  if (!o.net_devices_given) {
    devices = ucx::net_devices_for(resources, chosen.name);
    if (tcp && std::find(resources.begin(), resources.end(), "tcp/" + chosen.name) == resources.end())
      BRAID_LOG(warn, "ucx: UCX's tcp transport offers no interface " + chosen.name + " (" + chosen.address +
                          ", braid's choice" + (o.ifname.empty() ? "" : ": BRAID_SOCKET_IFNAME") +
                          "); UCX keeps its own choice. Set UCX_NET_DEVICES to choose");
  }
  if (no_zcopy != (zcopy == "0") || !devices.empty()) {
    api.cleanup(made);
    made = init_context(api, eager_limit, no_zcopy, devices, why);
    if (made == nullptr) return nullptr;
    if (no_zcopy && zcopy == "auto")
      BRAID_LOG(info, "ucx: no RDMA transport, so zero-copy sends are off (BRAID_UCX_ZCOPY=1 turns them back on; "
                      "docs/transport-ucx.md says why)");
    if (!devices.empty()) BRAID_LOG(info, "ucx: network devices " + devices + " (braid's choice; UCX_NET_DEVICES overrides)");
  }
  pc.context = made;
  pc.owner = ::getpid();
  pc.users = 1;
  return made;
}

void release_context(const Api& api, ucp_context_h context) noexcept {
  ProcessContext& pc = process();
  std::lock_guard<std::mutex> g(pc.mu);
  if (context != pc.context || pc.owner != ::getpid()) return;
  if (--pc.users == 0) {
    api.cleanup(pc.context);
    pc.context = nullptr;
  }
}

class UcxTransport;

/// Which device buffers a ucx transport takes (UcxConnection::takes_device_memory).
enum class Device { none, cuda, emulated };

/// One UCX operation. Heap-allocated so its address stays put for the callback; outlives
/// its braid request when the connection fails first (then it waits in the orphans).
struct Op {
  bool recv = false;
  bool device = false;  ///< buf is device memory (send_device / recv_device)
  Request* req = nullptr;  ///< null for control messages
  void* buf = nullptr;
  std::size_t bytes = 0;
  std::uint64_t tag = 0;
  ucp_ep_h ep = nullptr;  ///< a control message's endpoint
  void* ucx = nullptr;  ///< the UCX request while it is outstanding
  const Api* api = nullptr;
  bool issued = false;
  bool done = false;
  ucs_status_t status = UCS_OK;
  ucp_tag_recv_info_t info{};
  std::vector<unsigned char> payload;  ///< a control message's bytes
};

void send_done(void* request, ucs_status_t status, void* user) {
  auto* op = static_cast<Op*>(user);
  op->status = status;
  op->done = true;
  op->ucx = nullptr;
  op->api->request_free(request);
}
void recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<Op*>(user);
  op->status = status;
  if (info != nullptr) op->info = *info;
  op->done = true;
  op->ucx = nullptr;
  op->api->request_free(request);
}

class UcxConnection final : public Connection {
 public:
  enum class State { idle, looking_up, awaiting_reply, awaiting_hello, established, failed };
  UcxConnection(UcxTransport& t, int peer, std::uint32_t session) : t_(t), peer_(peer), session_(session) {}
  int peer() const noexcept override { return peer_; }
  void send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  bool broken(std::string* why) const override { return failure_.report(why); }
  bool takes_device_memory() const noexcept override;
  void send_device(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void recv_device(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void post(bool recv, bool device, void* buf, std::size_t bytes, std::uint64_t tag, Request* req);
  std::string who() const { return "ucx connection to rank " + std::to_string(peer_); }

  UcxTransport& t_;
  const int peer_;
  const std::uint32_t session_;   ///< ours: the session bits of what we send
  std::uint32_t peer_session_ = 0;
  State state_ = State::idle;
  PeerLookup lookup_;
  Clock::time_point deadline_ = Clock::time_point::max();
  ucp_ep_h ep_ = nullptr;
  bool ep_error_ = false;
  ucs_status_t ep_status_ = UCS_OK;
  Failure failure_;
  std::deque<std::unique_ptr<Op>> sends_, recvs_;
  std::uint64_t received_ = 0;  ///< data messages received
  std::uint32_t sent_ = 0;      ///< data messages sent (a bye carries the count)
  bool bye_ = false;            ///< the peer closed after sending bye_count_ messages
  std::uint32_t bye_count_ = 0;
  bool bye_sent_ = false, bye_acked_ = false;
};

void ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* c = static_cast<UcxConnection*>(arg);
  if (c->ep_error_) return;
  c->ep_error_ = true;
  c->ep_status_ = status;
}

/// An endpoint to the worker address `addr`, with peer error handling (`peer_errors`:
/// `on_error(arg, ...)` is told when the peer dies or cannot be reached) or without it
/// (UCX's shared-memory transports have no peer failure handler: UCX_TLS=sm).
ucp_ep_params_t ep_params(const unsigned char* addr, ucp_err_handler_cb_t on_error, void* arg,
                          bool peer_errors = true) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(addr);
  p.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  p.err_handler.cb = on_error;
  p.err_handler.arg = arg;
  return p;
}

/// ucp_ep_create with peer error handling, and without it where UCX has no transport to
/// the peer that can report a peer's failure (UCX_TLS=sm,self: sysv, posix and cma have
/// none). Then a dead peer is found by the bye protocol (a clean exit) or braid's deadline
/// (a crash), not at once; `*degraded` says so.
ucs_status_t create_ep(const Api& api, ucp_worker_h worker, const unsigned char* addr, ucp_err_handler_cb_t on_error,
                       void* arg, ucp_ep_h* ep, bool* degraded) {
  ucp_ep_params_t p = ep_params(addr, on_error, arg);
  ucs_status_t st = api.ep_create(worker, &p, ep);
  *degraded = false;
  if (st == UCS_ERR_UNREACHABLE) {
    p = ep_params(addr, on_error, arg, false);
    st = api.ep_create(worker, &p, ep);
    *degraded = st == UCS_OK;
  }
  return st;
}

class UcxTransport final : public Transport {
 public:
  UcxTransport(const UcxOptions& o, const Api& api, ucp_context_h context, Poller& poller, PeerDirectory& dir)
      : common_(o), api_(api), context_(context), poller_(poller), directory_(dir), conns_(o.size) {
    // Device buffers: CUDA memory where the loaded UCX was built with CUDA (the PyPI
    // wheel's, HPC-X's); as host memory on the emulated GPU runtime; else none (the engine
    // stages them through pinned host slots).
    ucp_context_attr_t attr{};
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (o.emulated_device_memory)
      device_memory_ = Device::emulated;
    else if (api_.context_query(context, &attr) == UCS_OK &&
             (attr.memory_types & (std::uint64_t{1} << UCS_MEMORY_TYPE_CUDA)) != 0)
      device_memory_ = Device::cuda;
    std::random_device rd;
    rng_.seed((std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid()));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    wp.events = UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
    ucs_status_t st = api_.worker_create(context, &wp, &worker_);
    if (st != UCS_OK) throw Error(ErrorCode::System, self() + ": ucp_worker_create: " + api_.status_string(st));
    int efd = -1;
    st = api_.worker_get_efd(worker_, &efd);
    if (st != UCS_OK) {
      api_.worker_destroy(worker_);
      throw Error(ErrorCode::System, self() + ": ucp_worker_get_efd: " + api_.status_string(st));
    }
    timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!timer_fd_) {
      api_.worker_destroy(worker_);
      throw Error(ErrorCode::System, self() + ": timerfd_create: " + errno_text(errno));
    }
    efd_ = efd;
    poller_.watch(efd_, EPOLLIN, [](std::uint32_t) {});
    poller_.watch(timer_fd_.get(), EPOLLIN, [this](std::uint32_t) {
      std::uint64_t n = 0;
      while (::read(timer_fd_.get(), &n, sizeof n) > 0) {
      }
      armed_for_ = Clock::time_point::max();
    });
    ucp_address_t* addr = nullptr;
    std::size_t len = 0;
    st = api_.worker_get_address(worker_, &addr, &len);
    if (st != UCS_OK) {
      shutdown();
      throw Error(ErrorCode::System, self() + ": ucp_worker_get_address: " + api_.status_string(st));
    }
    address_.assign(reinterpret_cast<unsigned char*>(addr), reinterpret_cast<unsigned char*>(addr) + len);
    api_.worker_release_address(worker_, addr);
    post_control_recv();
    directory_.publish("ucx", base::hex_bytes(address_.data(), address_.size()));
  }
  ~UcxTransport() override {
    close_all("ucx transport closed");
    release_context(api_, context_);
  }

  const char* name() const noexcept override { return "ucx"; }
  Connection* connection(int peer) override {
    if (peer < 0 || peer >= common_.size || peer == common_.rank) {
      throw Error(ErrorCode::InvalidUsage, "ucx transport: no connection from rank " + std::to_string(common_.rank) +
                                               " to rank " + std::to_string(peer));
    }
    return &get(peer);
  }
  bool progress() override;
  void close_all(const std::string& reason) override;
  /// Kept for close_all, whose byes carry it (ucx_wire: a bye's payload is the notice).
  void tell_peers(int blame, const std::string& reason) override {
    notice_ = ucx_wire::encode_notice(blame, reason.substr(0, kMaxNoticeBytes));
  }
  bool prepare_sleep() override {
    if (worker_ == nullptr) return true;
    if (changed_) return false;
    // UCX asks for progress to return 0 right before arming: what was posted since the
    // last progress (a send the engine issued after it) may have left work in UCX that no
    // fd will report (pending sends on a busy socket), and sleeping then costs a timeout.
    if (api_.worker_progress(worker_) != 0) {
      changed_ = true;
      return false;
    }
    arm_timer();
    const ucs_status_t st = api_.worker_arm(worker_);
    armed_ = st == UCS_OK;
    return st != UCS_ERR_BUSY;
  }
  bool needs_rearm() const override { return worker_ != nullptr && !armed_; }
  bool helpers_welcome() const override { return false; }

  // --- for the connections ---
  void post(UcxConnection& c, std::unique_ptr<Op> op, bool recv) {
    auto& q = recv ? c.recvs_ : c.sends_;
    q.push_back(std::move(op));
    if (c.state_ == UcxConnection::State::established) issue(c, *q.back());
    changed_ = true;
  }
  void fail(UcxConnection& c, const std::string& msg, bool closed, int blame);
  bool closed() const noexcept { return closed_; }
  const std::string& closed_reason() const noexcept { return closed_reason_; }
  std::string self() const { return "ucx transport (rank " + std::to_string(common_.rank) + ")"; }
  Device device_memory() const noexcept { return device_memory_; }

 private:
  UcxConnection& get(int peer) {
    bool fresh = false;
    UcxConnection& c = conns_.get(
        peer, [&] { return std::make_unique<UcxConnection>(*this, peer, new_session()); }, &fresh);
    if (fresh) {
      if (closed_) {
        c.failure_.set(closed_reason_, false, -1);
        c.state_ = UcxConnection::State::failed;
      } else if (common_.rank < peer) {
        c.state_ = UcxConnection::State::looking_up;
        c.lookup_ = PeerLookup{Clock::now() + common_.connect_timeout};
        c.lookup_.retry_at = Clock::now();
        c.deadline_ = c.lookup_.deadline;
        changed_ = true;
      } else {
        c.state_ = UcxConnection::State::awaiting_hello;
      }
    }
    return c;
  }
  std::uint32_t new_session() {
    std::uint32_t s = 0;
    while (s == 0) s = static_cast<std::uint32_t>(rng_()) & kLow24;
    return s;
  }
  void issue(UcxConnection& c, Op& op);
  bool make_ep(UcxConnection& c, const unsigned char* addr, std::string* why) {
    bool degraded = false;
    const ucs_status_t st = create_ep(api_, worker_, addr, &ep_error, &c, &c.ep_, &degraded);
    if (st != UCS_OK) {
      c.ep_ = nullptr;
      *why = std::string("ucp_ep_create: ") + api_.status_string(st);
      return false;
    }
    if (degraded && !warned_no_peer_errors_) {
      warned_no_peer_errors_ = true;
      BRAID_LOG(info, self() << ": UCX has no transport to rank " << c.peer()
                             << " that reports a peer's failure (UCX_TLS=sm?): a peer that crashes is named at "
                                "the deadline, not at once");
    }
    return true;
  }
  std::vector<unsigned char> control(Kind kind, int to, std::uint32_t session, std::uint32_t echo, bool with_addr,
                                     const std::vector<unsigned char>* payload = nullptr) {
    Control h;
    h.kind = kind;
    h.comm_id = common_.comm_id;
    h.from = common_.rank;
    h.to = to;
    h.session = session;
    h.echo = echo;
    return ucx_wire::encode_control(h, common_.auth_token,
                                    payload != nullptr ? *payload : with_addr ? address_ : std::vector<unsigned char>());
  }
  /// Sends a control message on `ep`; the op waits in controls_ until it completes.
  void send_control(ucp_ep_h ep, Kind kind, std::vector<unsigned char> payload) {
    auto op = std::make_unique<Op>();
    op->api = &api_;
    op->payload = std::move(payload);
    op->ep = ep;
    op->tag = (std::uint64_t(common_.rank) << kRankShift) | kind;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &send_done;
    p.user_data = op.get();
    void* r = api_.tag_send_nbx(ep, op->payload.data(), op->payload.size(), op->tag, &p);
    if (UCS_PTR_IS_PTR(r)) {
      op->ucx = r;
    } else {
      op->done = true;
      op->status = UCS_PTR_STATUS(r);
    }
    controls_.push_back(std::move(op));
  }
  void post_control_recv() {
    control_in_ = std::make_unique<Op>();
    control_in_->api = &api_;
    control_in_->recv = true;
    control_in_->payload.resize(kControlBytes);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &recv_done;
    p.user_data = control_in_.get();
    p.recv_info.tag_info = &control_in_->info;
    void* r = api_.tag_recv_nbx(worker_, control_in_->payload.data(), kControlBytes, 0, kSessionMask, &p);
    if (UCS_PTR_IS_PTR(r)) {
      if (!control_in_->done) control_in_->ucx = r;
    } else {
      control_in_->done = true;
      control_in_->status = UCS_PTR_STATUS(r);
    }
  }
  bool on_control();
  void refuse(const Control& h, const std::string& why);
  void connect_steps(UcxConnection& c, Clock::time_point now);
  bool complete(UcxConnection& c);
  void arm_timer();
  void shutdown() noexcept;
  void close_ep(ucp_ep_h ep, bool force) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* r = api_.ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
  }

  const CommonOptions common_;
  const Api& api_;
  ucp_context_h context_;
  Device device_memory_ = Device::none;
  Poller& poller_;
  PeerDirectory& directory_;
  ConnectionTable<UcxConnection> conns_;
  std::mt19937_64 rng_;
  bool warned_no_peer_errors_ = false;
  bool armed_ = false;  ///< the worker is armed and not progressed since (needs_rearm)  ///< logged once: UCX cannot report a peer's failure
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  base::UniqueFd timer_fd_;
  Clock::time_point armed_for_ = Clock::time_point::max();
  std::vector<unsigned char> address_;
  std::unique_ptr<Op> control_in_;
  std::vector<std::unique_ptr<Op>> controls_;  ///< control sends in flight
  std::vector<std::unique_ptr<Op>> orphans_;   ///< ops of failed connections still in UCX
  base::auth::ReplayGuard replays_;            ///< nonces of the control messages accepted
  std::vector<void*> closing_;                 ///< endpoint closes in flight
  bool changed_ = false;
  bool closed_ = false;
  std::string closed_reason_;
  std::vector<unsigned char> notice_;  // tell_peers: what every bye carries (empty: none)
};

// --- Connections -------------------------------------------------------------------------

void UcxConnection::post(bool recv, bool device, void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  check_post("ucx", recv ? "recv" : "send", buf, bytes, req, peer_);
  start_request(req);
  if (failure_.failed) return failure_.apply(req);
  auto op = std::make_unique<Op>();
  op->recv = recv;
  op->device = device;
  op->req = req;
  op->buf = buf;
  op->bytes = bytes;
  op->tag = tag;
  t_.post(*this, std::move(op), recv);
}

void UcxConnection::send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  post(false, false, const_cast<void*>(buf), bytes, tag, req);
}

void UcxConnection::recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  post(true, false, buf, bytes, tag, req);
}

bool UcxConnection::takes_device_memory() const noexcept { return t_.device_memory() != Device::none; }

void UcxConnection::send_device(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  if (!takes_device_memory()) return Connection::send_device(buf, bytes, tag, req);
  post(false, true, const_cast<void*>(buf), bytes, tag, req);
}

void UcxConnection::recv_device(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  if (!takes_device_memory()) return Connection::recv_device(buf, bytes, tag, req);
  post(true, true, buf, bytes, tag, req);
}

void UcxTransport::issue(UcxConnection& c, Op& op) {
  op.api = &api_;
  op.issued = true;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  // Host memory is declared (UCX would otherwise look the pointer up on every call).
  // Device buffers are left to UCX's detection where UCX has CUDA: device memory and
  // managed memory are different UCX types (cuda, cuda_managed). The emulation's device
  // memory is host memory.
  p.memory_type = UCS_MEMORY_TYPE_HOST;
  if (op.device && device_memory_ == Device::cuda) p.op_attr_mask &= ~UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.user_data = &op;
  void* r = nullptr;
  if (op.recv) {
    // Always through the callback: it is where UCX 1.13 reliably reports the tag and length.
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &recv_done;
    p.recv_info.tag_info = &op.info;
    const std::uint64_t t = (std::uint64_t(c.peer_) << kRankShift) | (std::uint64_t(c.peer_session_) << kSessionShift);
    r = api_.tag_recv_nbx(worker_, op.buf, op.bytes, t, kDataMask, &p);
  } else {
    p.cb.send = &send_done;
    const std::uint64_t t = (std::uint64_t(common_.rank) << kRankShift) |
                            (std::uint64_t(c.session_) << kSessionShift) | tag_bits(op.tag);
    r = api_.tag_send_nbx(c.ep_, op.buf, op.bytes, t, &p);
    ++c.sent_;
  }
  if (UCS_PTR_IS_PTR(r)) {
    if (!op.done) op.ucx = r;  // NO_IMM_CMPL: the callback may have run (and freed it) already
  } else {
    op.done = true;
    op.status = UCS_PTR_STATUS(r);
  }
}

void UcxTransport::fail(UcxConnection& c, const std::string& msg, bool closed, int blame) {
  if (!c.failure_.set(msg, closed, blame)) return;
  c.state_ = UcxConnection::State::failed;
  c.deadline_ = Clock::time_point::max();
  changed_ = true;
  for (auto* q : {&c.recvs_, &c.sends_}) {
    for (auto& op : *q) {
      if (op->req != nullptr && op->req->state == Request::State::pending) c.failure_.apply(op->req);
      op->req = nullptr;
      if (op->ucx != nullptr) {
        if (op->recv) api_.request_cancel(worker_, op->ucx);
        orphans_.push_back(std::move(op));
      }
    }
    q->clear();
  }
  if (c.ep_ != nullptr) {
    close_ep(c.ep_, true);  // completes its sends (canceled) in a later progress
    c.ep_ = nullptr;
  }
}

/// Completes, in the order posted, the ops UCX has finished. True if any did.
bool UcxTransport::complete(UcxConnection& c) {
  bool moved = false;
  while (!c.sends_.empty() && c.sends_.front()->done) {
    Op& op = *c.sends_.front();
    if (op.status != UCS_OK) {
      fail(c, c.who() + " failed: reset or closed by peer (" + api_.status_string(op.status) + ")", true, c.peer_);
      return true;
    }
    op.req->state = Request::State::done;
    c.sends_.pop_front();
    moved = true;
  }
  while (!c.recvs_.empty() && c.recvs_.front()->done) {
    Op& op = *c.recvs_.front();
    const std::uint64_t n = c.received_++;
    if (op.status != UCS_OK && op.status != UCS_ERR_MESSAGE_TRUNCATED) {
      fail(c, c.who() + " failed: reset or closed by peer (" + api_.status_string(op.status) + ")", true, c.peer_);
      return true;
    }
    const std::uint64_t bits = op.info.sender_tag & kLow24;
    const std::size_t got = op.info.length;
    if (op.status == UCS_ERR_MESSAGE_TRUNCATED || bits != tag_bits(op.tag) || got != op.bytes) {
      const std::uint64_t sent = bits == tag_bits(op.tag) ? op.tag : guess_tag(bits, op.tag);
      std::string got_bytes = std::to_string(got);
      if (op.status == UCS_ERR_MESSAGE_TRUNCATED && got <= op.bytes) got_bytes = "more than " + std::to_string(op.bytes);
      fail(c,
           "message #" + std::to_string(n) + " from rank " + std::to_string(c.peer_) +
               " does not match the posted receive: expected tag " + std::to_string(op.tag) + " and " +
               std::to_string(op.bytes) + " bytes, got tag " + std::to_string(sent) + " and " + got_bytes +
               " bytes (" + c.who() + "); the ranks disagree about the operation they are running" +
               (op.tag >> 24 != 0 && bits != tag_bits(op.tag) ? " (ucx carries 24 bits of the tag)" : ""),
           false, c.peer_);
      return true;
    }
    op.req->state = Request::State::done;
    c.recvs_.pop_front();
    moved = true;
  }
  return moved;
}

// --- Set-up ------------------------------------------------------------------------------

void UcxTransport::connect_steps(UcxConnection& c, Clock::time_point now) {
  if (c.state_ == UcxConnection::State::looking_up && now >= c.lookup_.retry_at) {
    std::string error;
    const std::optional<std::string> value =
        c.lookup_.look(directory_, c.peer_, "ucx", "its UCX worker address",
                       "is it running, and does it use the ucx transport?", common_.connect_timeout, &error);
    if (!value && error.empty()) return;  // not yet: retry_at is the next look
    std::vector<unsigned char> addr;
    if (error.empty() && !base::from_hex_bytes(*value, &addr)) error = "its published UCX address is not hex";
    if (error.empty() && make_ep(c, addr.data(), &error)) {
      send_control(c.ep_, kHello, control(kHello, c.peer_, c.session_, 0, true));
      c.state_ = UcxConnection::State::awaiting_reply;
      changed_ = true;
      return;
    }
    fail(c, "cannot connect to rank " + std::to_string(c.peer_) + ": " + error, false, c.peer_);
    return;
  }
  if (c.state_ == UcxConnection::State::awaiting_reply && now >= c.deadline_) {
    fail(c,
         "cannot connect to rank " + std::to_string(c.peer_) + ": no authentic hello in reply within " +
             std::to_string(common_.connect_timeout.count()) + " ms (do both ranks have the same token and communicator?)",
         false, c.peer_);
  }
}

void UcxTransport::refuse(const Control& h, const std::string& why) {
  // No answer: an endpoint is made only towards an authenticated peer, never to an
  // address a stranger gave (a rank with another token learns at its set-up deadline).
  if (common_.on_refused) common_.on_refused(self() + " refused a hello claiming rank " + std::to_string(h.from) + ": " + why);
}

/// Handles the control message that arrived in control_in_ and re-posts the receive.
bool UcxTransport::on_control() {
  std::unique_ptr<Op> in = std::move(control_in_);
  post_control_recv();
  if (in->status != UCS_OK || in->info.length < kControlFixed) {
    if (common_.on_refused) common_.on_refused(self() + " refused a control message that is not a braid hello");
    return true;
  }
  ControlView v;
  if (!ucx_wire::decode_control(in->payload.data(), in->info.length, &v)) {
    if (common_.on_refused) common_.on_refused(self() + " refused a control message that is not a braid hello");
    return true;
  }
  const Control& h = v.h;
  const unsigned char* addr = v.addr;
  UcxConnection* c = h.from >= 0 && h.from < common_.size && h.from != common_.rank ? conns_.find(h.from) : nullptr;
  using S = UcxConnection::State;
  const bool valid = ucx_wire::control_authentic(v, common_.comm_id, common_.rank, common_.size, common_.auth_token,
                                                 static_cast<std::int32_t>(in->info.sender_tag >> kRankShift));
  if (!valid) {
    refuse(h, "its hello names another communicator, rank or token");
    return true;
  }
  if (!replays_.first_use(v.token)) {
    refuse(h, "it is a copy of a control message already received (a replay)");
    return true;
  }
  if (h.kind == kHello && h.from < common_.rank && addr != nullptr && h.session != 0 &&
      (c == nullptr || c->state_ == S::awaiting_hello)) {
    c = &get(h.from);
    std::string why;
    if (!make_ep(*c, addr, &why)) {
      fail(*c, c->who() + " failed: " + why, false, c->peer_);
      return true;
    }
    c->peer_session_ = h.session;
    send_control(c->ep_, kHello, control(kHello, c->peer_, c->session_, h.session, false));
  } else if (h.kind == kHello && h.from > common_.rank && c != nullptr && c->state_ == S::awaiting_reply &&
             h.echo == c->session_ && h.session != 0) {
    c->peer_session_ = h.session;
    c->deadline_ = Clock::time_point::max();
  } else if (h.kind == kBye && c != nullptr && c->state_ == S::established && h.session == c->peer_session_) {
    // The peer is gone once we have received what it sent before its bye (its count). A
    // peer that failed says why in its bye (Transport::tell_peers).
    int blamed = -1;
    std::string why;
    if (addr != nullptr && ucx_wire::decode_notice(addr, h.addr_bytes, kMaxNoticeBytes, &blamed, &why))
      c->failure_.note(c->peer_, blamed >= 0 && blamed < common_.size ? blamed : -1, why);
    c->bye_ = true;
    c->bye_count_ = h.echo;
    changed_ = true;
    if (c->ep_ != nullptr && !c->ep_error_) send_control(c->ep_, kByeAck, control(kByeAck, c->peer_, c->session_, 0, false));
    return true;
  } else if (h.kind == kByeAck && c != nullptr && c->state_ == S::established && h.session == c->peer_session_) {
    c->bye_acked_ = true;
    return true;
  } else {
    refuse(h, "an unexpected or repeated hello");
    return true;
  }
  c->state_ = S::established;
  for (auto& op : c->recvs_) issue(*c, *op);
  for (auto& op : c->sends_) issue(*c, *op);
  return true;
}

// --- Progress ----------------------------------------------------------------------------

bool UcxTransport::progress() {
  if (closed_) return false;
  bool moved = changed_;
  changed_ = false;
  armed_ = false;
  while (api_.worker_progress(worker_) != 0) moved = true;
  while (control_in_->done) moved |= on_control();
  const auto now = Clock::now();
  moved |= conns_.step_all([&](UcxConnection& c) {
    bool m = false;
    // After a bye the endpoint's error is the peer going away as it said it would.
    if (c.ep_error_ && !c.bye_ && c.state_ != UcxConnection::State::failed) {
      fail(c, c.who() + " failed: reset or closed by peer (" + api_.status_string(c.ep_status_) + ")", true, c.peer_);
      m = true;
    }
    connect_steps(c, now);
    m |= complete(c);
    if (c.bye_ && c.state_ != UcxConnection::State::failed && c.received_ >= c.bye_count_) {
      fail(c, c.who() + " closed by peer", true, c.peer_);
      m = true;
    }
    return m;
  });
  // Finished control sends, closes and orphans.
  for (std::size_t i = 0; i < controls_.size();) {
    if (controls_[i]->done) {
      controls_.erase(controls_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  for (std::size_t i = 0; i < closing_.size();) {
    if (api_.request_check_status(closing_[i]) != UCS_INPROGRESS) {
      api_.request_free(closing_[i]);
      closing_.erase(closing_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  for (std::size_t i = 0; i < orphans_.size();) {
    if (orphans_[i]->done) {
      orphans_.erase(orphans_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  moved |= changed_;
  changed_ = false;
  arm_timer();
  return moved;
}

void UcxTransport::arm_timer() {
  Clock::time_point next = Clock::time_point::max();
  for (UcxConnection* c : conns_.all()) {
    if (c->state_ == UcxConnection::State::looking_up) next = std::min(next, c->lookup_.retry_at);
    if (c->state_ == UcxConnection::State::awaiting_reply) next = std::min(next, c->deadline_);
  }
  if (next == armed_for_ || !timer_fd_) return;
  armed_for_ = next;
  base::arm_timerfd(timer_fd_.get(), next);
}

void UcxTransport::close_all(const std::string& reason) {
  if (closed_) return;
  // A bye to every connected peer first, so that it sees "closed by peer" at once.
  // The peer acknowledges it once it has read everything we sent before (UCX delivers an
  // endpoint's messages in order); only then do we close, since closing the sockets under
  // unread data would reset the peer's end and lose what it has not read yet. Bounded: a
  // peer that does not answer within a second is not waited for.
  for (UcxConnection* c : conns_.all()) {
    if (c->state_ == UcxConnection::State::established && c->ep_ != nullptr && !c->ep_error_ && !c->bye_) {
      send_control(c->ep_, kBye,
                   control(kBye, c->peer_, c->session_, c->sent_, false, notice_.empty() ? nullptr : &notice_));
      c->bye_sent_ = true;
    }
  }
  const auto until = Clock::now() + std::chrono::seconds(1);
  auto waiting = [&] {
    for (UcxConnection* c : conns_.all())
      if (c->bye_sent_ && !c->bye_acked_ && !c->ep_error_ && c->state_ == UcxConnection::State::established) return true;
    for (auto& op : controls_)
      if (!op->done) return true;
    return false;
  };
  while (waiting() && Clock::now() < until) {
    api_.worker_progress(worker_);
    while (control_in_->done) on_control();
  }
  // An endpoint with nothing of ours in flight is closed with a flush, so that messages
  // whose sends completed (copied out of the caller's buffer) still reach the peer; the
  // others are closed by force (fail() below), cancelling their operations. In flight
  // counts receives too: one that matched a peer's rendezvous send waits on the endpoint's
  // request list for data that may never come (the peer's link is cut), UCX cannot cancel
  // it, a flush does not end it, and ucp_worker_destroy then aborts the process on its
  // assertion that the list is empty. A forced close completes it first.
  auto control_in_flight = [&](ucp_ep_h ep) {
    for (auto& op : controls_)
      if (op->ep == ep && !op->done) return true;
    return false;
  };
  for (UcxConnection* c : conns_.all()) {
    if (c->ep_ != nullptr && !c->ep_error_ && c->sends_.empty() && c->recvs_.empty() &&
        !control_in_flight(c->ep_)) {
      close_ep(c->ep_, false);
      c->ep_ = nullptr;
    }
  }
  closed_ = true;
  closed_reason_ = reason;
  for (UcxConnection* c : conns_.all()) fail(*c, reason, false, -1);  // keeps an earlier failure
  shutdown();
}

void UcxTransport::shutdown() noexcept {
  if (worker_ == nullptr) return;
  if (control_in_ && control_in_->ucx != nullptr) api_.request_cancel(worker_, control_in_->ucx);
  for (UcxConnection* c : conns_.all()) {
    if (c->ep_ != nullptr) {
      close_ep(c->ep_, true);
      c->ep_ = nullptr;
    }
  }
  // Let the cancellations and forced closes call back while our ops still exist.
  const auto until = Clock::now() + std::chrono::milliseconds(500);
  auto busy = [&] {
    for (void* r : closing_)
      if (api_.request_check_status(r) == UCS_INPROGRESS) return true;
    for (auto& op : orphans_)
      if (!op->done) return true;
    for (auto& op : controls_)
      if (!op->done) return true;
    return control_in_ && !control_in_->done;
  };
  do {
    api_.worker_progress(worker_);
  } while (busy() && Clock::now() < until);
  for (void* r : closing_) api_.request_free(r);  // one still in flight is released by UCX
  closing_.clear();
  poller_.unwatch(efd_);
  poller_.unwatch(timer_fd_.get());
  api_.worker_destroy(worker_);
  worker_ = nullptr;
  timer_fd_.reset();
}

}  // namespace

std::unique_ptr<Transport> make_ucx_transport(const UcxOptions& options, Poller& poller, PeerDirectory& directory) {
  std::string why;
  const Api* api = ucx::load(options.library, &why);
  if (api == nullptr) throw Error(ErrorCode::Unsupported, "ucx transport: " + why);
  if (options.size > 65536) {
    throw Error(ErrorCode::Unsupported, "ucx transport: at most 65536 ranks (its tags carry 16 bits of rank)");
  }
  ucp_context_h context = acquire_context(*api, options, &why);
  if (context == nullptr) throw Error(ErrorCode::Unsupported, "ucx transport: " + why);
  try {
    return std::make_unique<UcxTransport>(options, *api, context, poller, directory);
  } catch (...) {
    release_context(*api, context);
    throw;
  }
}

}  // namespace braid::transport


