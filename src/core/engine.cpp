// The progress engine (see engine.hpp for the model).
#include "core/engine.hpp"

#include "core/config.hpp"
#include "core/device_flow.hpp"
#include "core/plan_regions.hpp"
#include "core/failure.hpp"
#include "base/check.hpp"

#include <braid/config.hpp>

#include "base/logging.hpp"
#include "compression/framed.hpp"
#include "compression/reference.hpp"
#include "kernels/host/reduce.hpp"
#include "base/poller.hpp"
#include "transport/loopback.hpp"

#include <braid/config.hpp>
#include <braid/error.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>

namespace braid::core {

using collectives::Buffer;
using collectives::Plan;
using collectives::Region;
using collectives::Step;
using collectives::StepKind;
using Clock = std::chrono::steady_clock;

/// The transport's view of the store: "peer/<rank>/<key>".
class StoreDirectory final : public transport::PeerDirectory {
 public:
  StoreDirectory(std::shared_ptr<Store> store, FailureBoard& board, int rank)
      : store_(std::move(store)), board_(board), rank_(rank) {}
  void publish(const std::string& key, const std::string& value) override {
    store_->set("peer/" + std::to_string(rank_) + "/" + key, value);
  }
  std::string lookup(int peer, const std::string& key, std::chrono::milliseconds timeout) override {
    return store_->get("peer/" + std::to_string(peer) + "/" + key, timeout);
  }
  std::optional<std::string> try_lookup(int peer, const std::string& key) override {
    const std::string k = "peer/" + std::to_string(peer) + "/" + key;
    if (!store_->check({k})) return std::nullopt;
    return store_->get(k, std::chrono::seconds(10));
  }
  // The records Engine::fail_current and the destructor leave, read within the failure
  // board's budget: the peer's own report, a report of another rank that blames it, or
  // its clean leave.
  std::optional<std::string> peer_gone(int peer) override { return board_.peer_gone(peer); }

 private:
  std::shared_ptr<Store> store_;
  FailureBoard& board_;
  int rank_;
};

namespace {

enum : std::uint8_t { kWaiting = 0, kPosted = 1, kDone = 2 };

const char* kind_name(StepKind k) {
  switch (k) {
    case StepKind::send: return "send to";
    case StepKind::recv: return "receive from";
    case StepKind::recv_reduce: return "receive-and-reduce from";
    case StepKind::copy: return "copy";
    case StepKind::reduce: return "reduce";
    case StepKind::encode: return "encode";
    case StepKind::decode: return "decode";
    case StepKind::decode_add: return "decode-and-add";
    case StepKind::scale: return "scale";
  }
  return "?";
}

}  // namespace

/// Scratch buffers of finished operations (see Engine::scratch_pool_). Leases return
/// their buffer when the operation is gone, from whichever thread drops it.
class ScratchPool : public std::enable_shared_from_this<ScratchPool> {
 public:
  struct Buf {
    std::unique_ptr<std::byte[]> data;
    std::size_t size = 0;
  };
  class Lease {
   public:
    Lease() = default;
    Lease(std::shared_ptr<ScratchPool> pool, Buf buf) : pool_(std::move(pool)), buf_(std::move(buf)) {}
    Lease(Lease&&) noexcept = default;
    Lease& operator=(Lease&& o) noexcept {
      give_back();
      pool_ = std::move(o.pool_);
      buf_ = std::move(o.buf_);
      return *this;
    }
    ~Lease() { give_back(); }
    std::byte* data() const noexcept { return buf_.data.get(); }

   private:
    void give_back() noexcept {
      if (pool_ && buf_.data) pool_->put(std::move(buf_));
      pool_.reset();
    }
    std::shared_ptr<ScratchPool> pool_;
    Buf buf_;
  };

  /// A buffer of at least `bytes` (uninitialized; none for 0).
  Lease take(std::size_t bytes) {
    if (bytes == 0) return {};
    Buf b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The smallest free buffer that fits; else replace the largest.
      std::size_t best = free_.size();
      for (std::size_t i = 0; i < free_.size(); ++i)
        if (free_[i].size >= bytes && (best == free_.size() || free_[i].size < free_[best].size)) best = i;
      if (best < free_.size()) {
        b = std::move(free_[best]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      }
    }
    if (!b.data) {
      b.data.reset(new std::byte[bytes]);
      b.size = bytes;
    }
    return Lease(shared_from_this(), std::move(b));
  }

 private:
  static constexpr std::size_t kKeep = 2;  // typical: one operation in flight, one next
  void put(Buf b) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() >= kKeep) {
      auto smallest = std::min_element(free_.begin(), free_.end(),
                                       [](const Buf& x, const Buf& y) { return x.size < y.size; });
      if (smallest->size >= b.size) return;  // drop the new one
      *smallest = std::move(b);
      return;
    }
    free_.push_back(std::move(b));
  }
  std::mutex mu_;
  std::vector<Buf> free_;
};

bool lands_in_staging(const Step& s, std::size_t elem_bytes, const void* input, const void* output) {
  if (s.kind != StepKind::recv_reduce) return false;
  const auto user = [](Buffer b) { return b == Buffer::input || b == Buffer::output; };
  if (!user(s.src.buf) || !user(s.dst.buf))  // library buffers: the same one, overlapping elements
    return s.src.buf == s.dst.buf && s.dst.offset < s.src.offset + s.src.count &&
           s.src.offset < s.dst.offset + s.dst.count;
  // The caller's buffers: in-place calls alias input and output.
  const auto at = [&](const Region& r) {
    return static_cast<const std::byte*>(r.buf == Buffer::input ? input : output) + r.offset * elem_bytes;
  };
  const std::byte* d = at(s.dst);
  const std::byte* x = at(s.src);
  return d < x + s.src.count * elem_bytes && x < d + s.dst.count * elem_bytes;
}

StagingNeed staging_need(const Plan& plan, std::size_t elem_bytes, const void* input, const void* output) {
  std::size_t steps = 0, largest = 0;
  for (const Step& s : plan.steps)
    if (lands_in_staging(s, elem_bytes, input, output)) {
      ++steps;
      largest = std::max<std::size_t>(largest, s.dst.count * elem_bytes);
    }
  return {std::min(steps, kMaxStaging), (largest + 63) / 64 * 64};
}

/// Execution state of the running operation.
/// Operations of at least this many bytes feed the link report (Engine::LinkStats): big
/// enough that a send's time is the link's, not the per-message cost.
constexpr std::uint64_t kLinkStatsBytes = 64 * 1024;

/// How often the engine looks at the words of a device program that it waits for when
/// nothing else moves: a stream's write wakes nobody (it is a store into pinned memory), so
/// this bounds how late a filled slot is sent; it costs a wake-up per period only while a
/// device call waits for its stream.
constexpr auto kFlowPoll = std::chrono::microseconds(20);

struct Engine::Exec {
  Operation op;
  const Plan* plan = nullptr;
  std::size_t elem = 1;
  Clock::time_point deadline;
  std::vector<std::uint8_t> state;
  std::vector<transport::Request> req;
  std::vector<int> staging_of;  // staging slot a receive landed in, or -1
  // The staging slots of in-place receive-and-reduces: the end of the scratch lease,
  // stage_stride bytes each, reserved at admission (see admit()).
  std::byte* staging = nullptr;
  std::size_t stage_stride = 0;
  std::vector<int> free_staging;
  std::vector<std::vector<std::uint32_t>> sendq, recvq;  // by index into plan->peers
  std::vector<std::size_t> send_head, recv_head;
  std::vector<transport::Connection*> conns;
  std::vector<std::uint32_t> localq;
  std::size_t local_head = 0;
  std::vector<std::uint32_t> inflight;
  std::size_t done = 0;
  ScratchPool::Lease scratch;  ///< Plan::scratch_count elements, then the packed payloads
  std::byte* packed = nullptr;
  std::size_t frame = 1, frame_bytes = 0;  ///< compressed plans: Plan::packed_frame, its bytes
  std::uint64_t sent_bytes = 0;  ///< what the plan sends, summed at admission (metrics)
  /// Large operations (kLinkStatsBytes) time their sends and the first arrival from each
  /// peer for the link report; small ones pay nothing for it.
  bool measure = false;
  std::vector<Clock::time_point> posted_at;  ///< measure: per step, when its send was posted
  std::vector<std::uint8_t> heard;           ///< measure: per plan peer, a receive from it is done
  bool routed = false;  ///< every peer has a connection
  std::byte* scratch_base = nullptr;  ///< the scratch lease's

  /// The device path (op.flow): the stream runs the program; the engine moves messages.
  FlowOp* flow = nullptr;
  Exec() = default;
  Exec(const Exec&) = delete;
  Exec& operator=(const Exec&) = delete;

  /// Takes the vectors of a finished Exec, emptied, so that the next admission allocates
  /// none of them (a small call paid a dozen malloc/free pairs for them; issue 32). A new
  /// vector member belongs here too; one left out is only allocated afresh.
  void reuse_storage(Exec& from) noexcept {
    const auto take = [](auto& mine, auto& theirs) {
      mine.swap(theirs);
      mine.clear();
    };
    take(state, from.state);
    take(req, from.req);
    take(staging_of, from.staging_of);
    take(free_staging, from.free_staging);
    take(send_head, from.send_head);
    take(recv_head, from.recv_head);
    take(conns, from.conns);
    take(localq, from.localq);
    take(inflight, from.inflight);
    take(posted_at, from.posted_at);
    take(heard, from.heard);
    // The per-peer queues keep their slots (admission resizes them to the plan's peers)
    // and each its capacity.
    sendq.swap(from.sendq);
    recvq.swap(from.recvq);
    for (auto& q : sendq) q.clear();
    for (auto& q : recvq) q.clear();
  }

  std::byte* ptr(const Region& r) const {
    return region_address(r, op.input, op.output, scratch_base, packed, op.feedback, elem, frame, frame_bytes);
  }
  /// Bytes of a region (a message's size).
  std::size_t bytes(const Region& r) const { return region_bytes(r, *plan, elem, frame); }
  bool deps_done(std::uint32_t i) const {
    const Step& s = plan->steps[i];
    for (std::uint32_t d = 0; d < s.dep_count; ++d)
      if (state[plan->deps[s.dep_begin + d]] != kDone) return false;
    return true;
  }
  std::uint64_t tag(std::size_t index_in_queue) const {
    if (op.p2p) return op.tag_base;
    return (op.seq << 24) | (index_in_queue & 0xffffff);
  }
  std::string where(std::uint32_t i) const {
    const Step& s = plan->steps[i];
    std::ostringstream os;
    os << op.name << ": step " << i << "/" << plan->steps.size() << " ("
       << plan->phase_names.at(s.phase) << ", " << kind_name(s.kind);
    if (s.peer >= 0) os << " rank " << s.peer;
    os << ")";
    return os.str();
  }
};

/// What works call back into; outlives the engine safely (help() after detach()
/// does nothing).
class Engine::Gate final : public detail::WorkHelper {
 public:
  explicit Gate(Engine* e) : engine_(e) {}
  void help(detail::WorkState& w, Clock::time_point until) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (engine_ == nullptr) return;
      ++users_;
    }
    engine_->help(w, until);
    std::lock_guard<std::mutex> lock(mu_);
    if (--users_ == 0) cv_.notify_all();
  }
  /// Wakes the engine thread, if there still is one (any thread, a stream callback too).
  void wake() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine_ != nullptr) engine_->poller_->wake();
  }
  /// Refuses new helpers and waits for those inside to leave.
  void detach() noexcept {
    std::unique_lock<std::mutex> lock(mu_);
    engine_ = nullptr;
    cv_.wait(lock, [&] { return users_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Engine* engine_;
  int users_ = 0;
};

Engine::Engine(const EngineOptions& options, std::shared_ptr<Store> store)
    : opt_(options), store_(std::move(store)), recorder_(options.trace_entries) {
  poller_ = std::make_unique<base::Poller>();
  // A healthy store answers in well under a millisecond; a report waits for it a second
  // at most (docs/reliability.md, "Failure handling").
  board_ = std::make_unique<FailureBoard>(store_, opt_.rank, std::chrono::milliseconds(1000));
  if (opt_.serves_store && opt_.size > 1) board_->claim_store_host();
  directory_ = std::make_unique<StoreDirectory>(store_, *board_, opt_.rank);
  router_ = std::make_unique<Router>(opt_.transport_mode);
  if (opt_.size > 1) {
    // Every transport this communicator may use is made now (each publishes its address
    // for the peers); connections are made lazily, per pair, by route().
    transport::TransportContext c;
    c.common.rank = opt_.rank;
    c.common.size = opt_.size;
    c.common.auth_token = opt_.auth_token;
    c.common.tls = opt_.tls;
    c.common.comm_id = opt_.comm_id;
    c.common.connect_timeout = opt_.connect_timeout;
    c.common.on_refused = [](const std::string& what) { BRAID_LOG(warn, what); };
    c.master_addr = opt_.master_addr;
    c.gpu_pci_bus_id = opt_.gpu_pci_bus_id;
    c.emulated_device_memory = opt_.emulated_device_memory;
    c.gpu = opt_.gpu;
    c.gpu_device = opt_.gpu_device;
    c.settings = opt_.settings;
    c.poller = poller_.get();
    c.directory = directory_.get();
    // Auto mode goes without a transport whose library or device is absent here (UCX not
    // installed): its pairs take the next best; a forced one that cannot be made fails.
    // It also goes without one that no pair of this rank can choose (ucx on a rank with
    // no RDMA fabric): made, it would only cost; its idle UCX worker, progressed by every
    // inline call, made each call wake the engine thread to re-arm it, which tripled the
    // small-message latency (issue 32).
    if (opt_.topology != nullptr) {
      const bool rdma = opt_.topology->has_rdma(opt_.rank);
      for (const std::string& name : router_->drop_unchoosable(opt_.rank, rdma))
        BRAID_LOG(trace, "rank " << opt_.rank << ": auto mode makes no " << name
                                 << " transport: it serves no pair of this rank (RDMA fabric: " << (rdma ? "yes" : "no")
                                 << ")");
    }
    for (std::size_t i = 0; i < router_->entries().size();) {
      const auto* e = router_->entries()[i];
      try {
        transports_.push_back(e->make(c));
        ++i;
      } catch (const Error& err) {
        if (router_->mode() != "auto" || err.code() != ErrorCode::Unsupported) throw;
        BRAID_LOG(info, "rank " << opt_.rank << ": auto mode goes without the " << e->name
                                << " transport: " << err.what());
        router_->drop(i);
      }
    }
  }
  // Last: a rank's own number (send/recv to itself); see transport_for().
  transports_.push_back(std::make_unique<transport::LoopbackTransport>(opt_.rank));
  route_.assign(static_cast<std::size_t>(opt_.size), -1);
  scratch_pool_ = std::make_shared<ScratchPool>();
  order_mark_.assign(2 * static_cast<std::size_t>(opt_.size), 0);
  gate_ = std::make_shared<Gate>(this);
  links_.assign(static_cast<std::size_t>(opt_.size), LinkStats{});
  next_report_ = Clock::now() + opt_.report_period;
  // Last: the thread reads everything above.
  thread_ = std::thread([this] { run(); });
  if (!opt_.trace_dir.empty()) dump_listener_ = add_dump_listener([this] { request_dump("SIGUSR1"); });
  metrics_source_ = add_metrics_source(opt_.metrics_port, [this] { return metrics(); });
}

Engine::~Engine() {
  if (dump_listener_ >= 0) remove_dump_listener(dump_listener_);
  remove_metrics_source(metrics_source_);
  drain();
  gate_->detach();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  poller_->wake();
  if (thread_.joinable()) thread_.join();
  // The last report: what came since the previous one (this thread drives now: the engine
  // thread is gone).
  if (opt_.report_period.count() > 0) report();
  // Peers that still need this rank see its connections close; without a record they
  // would say it probably died. Written before the connections close, waited for briefly.
  if (!failed_.load())
    board_->publish_leaving("rank " + std::to_string(opt_.rank) + " closed its communicator '" + opt_.comm_name +
                            "' (destroyed or closed by the program; it did not fail)");
  for (auto& t : transports_) t->close_all("communicator " + opt_.comm_name + " destroyed");
}

void Engine::submit(Operation op) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failed_.load() && !stop_) {
      // Small: a collective or send/receive of at most inline_bytes that the caller's
      // thread may drive. Its Work helps whoever waits on it (the thread that will need
      // the result drives, instead of sleeping until the engine thread wakes it).
      // Not a device program: it completes when its stream has run it, which the caller's
      // thread must not wait for inside the call.
      const bool small = opt_.inline_bytes > 0 && !no_helpers_.load(std::memory_order_acquire) && !op.task &&
                         op.plan && !op.deferred && !op.flow &&
                         op.plan->request.count * dtype_size(op.dtype) <= opt_.inline_bytes &&
                         std::this_thread::get_id() != thread_.get_id();
      if (opt_.wait_helps || small) op.work->helper = gate_;
      if (op.gate) {
        const auto now = Clock::now();
        if (op.timeout < std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now))
          op.gate_deadline = now + op.timeout;
      }
      // Inline, on this thread: a small collective that finds the engine idle (nothing
      // queued or running, no helper inside) runs until it completes or stalls; a small
      // send or receive takes one pass if no other thread drives (posting must not block:
      // a receive whose data has not come must not hold up the send posted next).
      const bool p2p = op.p2p;
      const bool run_here = small && helpers_.load(std::memory_order_acquire) == 0 && (p2p || !busy_);
      auto work = op.work;
      queue_.push_back(std::move(op));
      queued_.store(queue_.size(), std::memory_order_release);
      busy_ = true;
      if (!run_here) {
        poller_->wake();
        return;
      }
      lock.unlock();
      help(*work, p2p ? Help::one_pass : Help::inline_call);
      return;
    }
  }
  // Made in a statement of its own, so that the temporary dies before the hand-over (see
  // fail_current).
  std::exception_ptr err = std::make_exception_ptr(
      Error(ErrorCode::Aborted, op.name + " not started: the communicator has failed earlier: " + reason()));
  op.work->complete(std::move(err));
}

std::function<void()> Engine::waker() const {
  return [g = gate_] { g->wake(); };
}

std::string Engine::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

void Engine::abort(const std::string& why) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load() || abort_requested_.load()) return;
    if (reason_.empty()) reason_ = why;
    abort_requested_ = true;
  }
  poller_->wake();
}

void Engine::drain() noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return !busy_; });
}

namespace {

// Why a device call fails whose gate is still shut at its deadline. The stream never got
// to the call: nothing of it has moved, and the peers wait for this rank. Failing now,
// naming why, keeps them from blaming a silent rank.
std::string gate_timeout_message(const Operation& gate) {
  return gate.name + ": timed out after " + std::to_string(gate.timeout.count()) +
         " ms: the call's stream has not reached it, so its device input was never staged. Work enqueued on "
         "that stream before the call has not finished (a kernel still running, a wait on an event never "
         "recorded), or the stream shares a hardware queue with a stream that waits on another collective "
         "(ranks that are threads of one process on one GPU; docs/gpu.md, \"Several ranks on one GPU\")";
}

}  // namespace

void Engine::settle_if_idle() {
  if (!active_.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) {
    busy_ = false;
    idle_cv_.notify_all();
  }
}

bool Engine::admit() {
  // Nothing queued while something runs: nothing to admit and no idle state to settle. A
  // submit() racing with this read is seen on the next pass (it wakes the engine thread,
  // or drives the pass itself).
  if (!active_.empty() && queued_.load(std::memory_order_acquire) == 0) {
    shut_gate_deadline_ = Clock::time_point::max();
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Every return below leaves queued_ equal to what admission left in queue_.
  struct Count {
    Engine& e;
    ~Count() { e.queued_.store(e.queue_.size(), std::memory_order_release); }
  } count{*this};
  bool any = false;
  shut_gate_deadline_ = Clock::time_point::max();
  for (;;) {
    if (queue_.empty()) {
      if (active_.empty()) {
        busy_ = false;
        idle_cv_.notify_all();
      }
      return any;
    }
    Operation& front = queue_.front();
    if (front.gate) {
      // A device call's gate: nothing issued after it starts before its stream has
      // staged the input (the stream callback opens it and wakes the engine).
      if (!front.gate->load(std::memory_order_acquire)) {
        shut_gate_deadline_ = front.gate_deadline;
        if (!failed_.load() && expired_gate_.empty() && front.gate_deadline != Clock::time_point::max() &&
            Clock::now() > front.gate_deadline)
          expired_gate_ = gate_timeout_message(front);
        return any;
      }
      Operation passed = std::move(front);
      queue_.pop_front();
      if (passed.work) passed.work->complete();
      any = true;
      continue;
    }
    if (front.task) {
      // A host task runs once everything issued before it is done; nothing after it
      // is admitted before it has run: what follows may read what it writes.
      if (!active_.empty()) return any;
      auto ex = std::make_unique<Exec>();
      ex->op = std::move(front);
      queue_.pop_front();
      ex->deadline = Clock::time_point::max();
      active_.push_back(std::move(ex));
      return true;
    }
    // A collective runs alone; point-to-point operations run together with the
    // point-to-point operations next to them (as in an NCCL group).
    for (const auto& ex : active_)
      if (!(front.p2p && ex->op.p2p)) return any;
    if (front.deferred) {
      if (!*front.deferred) {
        // Nothing filled the slot although everything issued before has run: a bug.
        Operation lost = std::move(front);
        queue_.pop_front();
        std::exception_ptr err = std::make_exception_ptr(
            Error(ErrorCode::Internal, lost.name + ": its deferred plan was never decided"));
        lost.work->complete(std::move(err));
        any = true;
        continue;
      }
      front.plan = *front.deferred;
      // Name the algorithm the verdict chose in the call's messages from now on.
      const auto at = front.name.find("(auto, ");
      if (at != std::string::npos)
        front.name.replace(at, 7, "(auto: " + std::string(front.plan->name()) + ", ");
    }
    std::unique_ptr<Exec> ex = spare_exec_ ? std::move(spare_exec_) : std::make_unique<Exec>();
    ex->op = std::move(queue_.front());
    queue_.pop_front();
    ex->plan = ex->op.plan.get();
    ex->elem = dtype_size(ex->op.dtype);
    const auto now = Clock::now();
    if (ex->op.work) ex->op.work->started = now;
    ex->deadline = ex->op.timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)
                       ? Clock::time_point::max()
                       : now + ex->op.timeout;
    const Plan& p = *ex->plan;
    ex->state.assign(p.steps.size(), kWaiting);
    ex->req.resize(p.steps.size());
    ex->staging_of.assign(p.steps.size(), -1);
    ex->sendq.resize(p.peers.size());
    ex->recvq.resize(p.peers.size());
    ex->send_head.assign(p.peers.size(), 0);
    ex->recv_head.assign(p.peers.size(), 0);
    ex->conns.assign(p.peers.size(), nullptr);
    std::size_t scratch_bytes = p.scratch_count * ex->elem, packed_bytes = 0;
    if (p.packed_count > 0) {
      ex->frame = p.packed_frame;
      ex->frame_bytes = compression::encoded_bytes(p.request.codec, ex->frame);
      packed_bytes = compression::framed_bytes(p.request.codec, ex->frame, p.packed_count);
      scratch_bytes = (scratch_bytes + 63) / 64 * 64;
    }
    // The staging of in-place receive-and-reduces comes after the scratch, in the same
    // lease (staging_need). Staging the engine kept across operations stayed at the
    // largest message each slot had ever held, and how many slots there were depended
    // on how past receives happened to overlap in time: a rank's memory grew in steps
    // long after start-up (tests/soak).
    const StagingNeed staging = staging_need(p, ex->elem, ex->op.input, ex->op.output);
    ex->stage_stride = staging.slot_bytes;
    const std::size_t staging_at = staging.slots > 0 ? (scratch_bytes + packed_bytes + 63) / 64 * 64 : 0;
    const std::size_t lease_bytes =
        staging.slots > 0 ? staging_at + staging.slots * staging.slot_bytes : scratch_bytes + packed_bytes;
    // In active_ before anything that can throw (a device allocation): a failure is then
    // this operation's own, and its Work (and its caller's stream) completes with it.
    Exec& e = *ex;
    active_.push_back(std::move(ex));
    any = true;
    if (e.op.flow) {
      e.flow = e.op.flow.get();  // device scratch and slots are the program's own
    } else {
      e.scratch = scratch_pool_->take(lease_bytes);
      e.scratch_base = e.scratch.data();
    }
    e.packed = e.scratch_base + scratch_bytes;
    e.staging = e.scratch_base + staging_at;
    for (std::size_t k = staging.slots; k > 0; --k) e.free_staging.push_back(static_cast<int>(k - 1));
    if (p.request.count * e.elem >= kLinkStatsBytes) {
      e.measure = true;
      e.posted_at.assign(p.steps.size(), Clock::time_point{});
      e.heard.assign(p.peers.size(), 0);
    }
    for (std::uint32_t i = 0; i < p.steps.size(); ++i) {
      const Step& s = p.steps[i];
      if (collectives::is_local(s.kind)) {
        if (e.flow) {  // the stream's, enqueued with the program
          e.state[i] = kDone;
          ++e.done;
          continue;
        }
        e.localq.push_back(i);
        continue;
      }
      const auto pos = static_cast<std::size_t>(std::lower_bound(p.peers.begin(), p.peers.end(), s.peer) - p.peers.begin());
      (s.kind == StepKind::send ? e.sendq : e.recvq)[pos].push_back(i);
      if (s.kind == StepKind::send) e.sent_bytes += e.bytes(s.src);
    }
    BRAID_LOG(trace, "start " << e.op.name << " with " << p.steps.size() << " steps");
  }
}

int Engine::transport_for(int peer) {
  int& r = route_[static_cast<std::size_t>(peer)];
  if (r >= 0) return r;
  if (peer == opt_.rank) return r = static_cast<int>(transports_.size() - 1);  // the loopback
  // Peers publish their host before they start their engine; do not wait for one that
  // has not: try again on the next pass.
  const auto same = opt_.topology->same_host(peer);
  if (!same) return -1;
  const transport::PairFacts pair{opt_.rank, peer, *same, !*same && opt_.topology->has_rdma(opt_.rank) && opt_.topology->has_rdma(peer)};
  r = static_cast<int>(router_->choose(pair));
  board_->learn_store_host();  // while the store is healthy (it just answered same_host)
  if (!transports_[static_cast<std::size_t>(r)]->helpers_welcome()) no_helpers_.store(true, std::memory_order_release);
  BRAID_LOG(info, "rank " << opt_.rank << " -> rank " << peer << ": " << router_->explain(pair));
  return r;
}

bool Engine::route(Exec& ex) {
  // Connections are made here, lazily, only to the peers this plan uses.
  bool all = true;
  for (std::size_t q = 0; q < ex.conns.size(); ++q) {
    if (ex.conns[q]) continue;
    const int peer = ex.plan->peers[q];
    const int t = transport_for(peer);
    if (t < 0) {
      all = false;
      continue;
    }
    ex.conns[q] = transports_[static_cast<std::size_t>(t)]->connection(peer);
  }
  return ex.routed = all;
}

std::exception_ptr Engine::peer_error(const Exec& ex, std::uint32_t i) {
  const transport::Request& r = ex.req[i];
  int blame = r.failed_peer >= 0 ? r.failed_peer : ex.plan->steps[i].peer;
  std::string msg = ex.where(i) + " failed: " + r.error;
  if (r.peer_told) {
    // The peer said why before closing (Transport::tell_peers): its words are in the error
    // and failed_peer is whom it blamed; no store needed. A peer that blamed this rank (its
    // deadline fired waiting on us while we waited elsewhere) is itself the one to name.
    if (blame < 0 || blame >= opt_.size || blame == opt_.rank) blame = ex.plan->steps[i].peer;
  } else if (r.peer_closed && blame >= 0) {
    // The peer may have closed because it failed first; it leaves its reason (and the
    // rank it blames) in the store before closing its connections.
    const std::string b = std::to_string(blame);
    const PeerRecord rec = board_->record_of(blame);
    switch (rec.kind) {
      case PeerRecord::Kind::failed: {
        std::string text = rec.text;
        if (text.rfind("braid ", 0) == 0 && text.find(": ") != std::string::npos) text = text.substr(text.find(": ") + 2);
        msg += "; rank " + b + " reported: " + text;
        if (rec.blame >= 0 && rec.blame < opt_.size && rec.blame != opt_.rank) blame = rec.blame;
        break;
      }
      case PeerRecord::Kind::left:
        // No failure of its own: it closed its communicator while this rank still needed it
        // (a program that left early, or ranks that disagree on the calls).
        msg += "; " + rec.text + ", while this rank still needed it: did the ranks issue the same calls?";
        break;
      case PeerRecord::Kind::none:
        msg += " (rank " + b + " left no reason: it probably died)";
        break;
      case PeerRecord::Kind::unknown: {
        // The store cannot say why: decide from what this rank knows. A rank whose process
        // serves the store and does not answer is itself stopped, dead or cut off.
        msg += " (rank " + b + "'s reason could not be read: " + rec.text + ")";
        const int host = board_->store_host();
        if (host == blame) {
          msg += "; rank " + b + " serves the store, which cannot be reached either: rank " + b +
                 " is dead, stopped or cut off from this rank";
        } else if (host >= 0 && host != opt_.rank) {
          msg += "; rank " + std::to_string(host) + " serves the store, which cannot be reached: rank " +
                 std::to_string(host) + " is dead, stopped or cut off from this rank, the likely cause (rank " + b +
                 " may have failed waiting on it)";
          blame = host;
        } else {
          msg += "; rank " + b + " died, or failed on its own and its reason is in the store";
          // What this rank sees itself: other connections of the call that broke too (a rank
          // that died breaks all of its own; the one that closed first here may have failed
          // because of it).
          std::string also;
          for (std::size_t q = 0; q < ex.plan->peers.size(); ++q)
            if (ex.plan->peers[q] != blame && ex.conns[q] != nullptr && ex.conns[q]->broken(nullptr))
              also += (also.empty() ? "" : ", ") + std::to_string(ex.plan->peers[q]);
          if (!also.empty())
            msg += " (the connection to rank " + also + " broke too: either may have failed first)";
        }
        break;
      }
    }
  }
  return std::make_exception_ptr(RemoteError(blame, msg));
}

namespace {

// The error of an operation that could not run because of `cause`: of the same kind
// (a peer's failure stays a RemoteError naming that peer, a deadline a TimeoutError),
// so that a caller sees why whichever of its operations it waits for; Aborted when
// the cause was something else (abort(), a local error).
std::exception_ptr same_kind(const std::exception_ptr& cause, const std::string& message) {
  if (cause) {
    try {
      std::rethrow_exception(cause);
    } catch (const RemoteError& e) {
      return std::make_exception_ptr(RemoteError(e.peer(), message));
    } catch (const TimeoutError&) {
      return std::make_exception_ptr(TimeoutError(message));
    } catch (...) {
    }
  }
  return std::make_exception_ptr(Error(ErrorCode::Aborted, message));
}

}  // namespace

namespace {

/// The call's fields of a trace record or ring entry (everything but state, times,
/// progress and name).
template <class Record>
void describe_call(const Operation& op, Record& r) {
  r.seq = op.seq;
  r.p2p_seq = op.p2p_seq;
  r.dtype = op.dtype;
  r.op = op.op;
  r.task = static_cast<bool>(op.task) || op.gate != nullptr;
  r.root = -1;
  r.count = 0;
  r.codec = compression::CodecSpec{};
  r.algorithm = "";
  const Plan* p = op.plan.get();
  if (r.task || p == nullptr) return;
  r.count = p->request.count;
  r.codec = p->request.codec;
  if (op.p2p) {
    r.algorithm = "p2p";
    if (!p->steps.empty()) r.root = p->steps.front().peer;
    return;
  }
  r.algorithm = op.deferred && !*op.deferred ? "auto" : p->name();
  const auto c = p->request.collective;
  if (c == collectives::Collective::broadcast || c == collectives::Collective::reduce ||
      c == collectives::Collective::gather || c == collectives::Collective::scatter)
    r.root = p->request.root;
}

/// Per peer, the messages and bytes of `ex` done and to do (a record of an unfinished operation).
template <class ExecT>
void describe_progress(const ExecT& ex, TraceRecord& r) {
  const Plan& p = *ex.plan;
  r.steps = static_cast<std::uint32_t>(p.steps.size());
  r.steps_done = static_cast<std::uint32_t>(ex.done);
  r.peers.assign(p.peers.size(), PeerProgress{});
  for (std::size_t q = 0; q < p.peers.size(); ++q) {
    PeerProgress& pp = r.peers[q];
    pp.rank = p.peers[q];
    // One direction: its messages, how many are posted (before `head`), done, and their bytes.
    const auto tally = [&](const std::vector<std::uint32_t>& queue, std::size_t head, bool send,
                           std::uint32_t& count, std::uint32_t& posted, std::uint32_t& done, std::uint64_t& to_move,
                           std::uint64_t& moved, std::int64_t& next) {
      for (std::size_t k = 0; k < queue.size(); ++k) {
        const std::uint32_t i = queue[k];
        const std::uint64_t b = ex.bytes(send ? p.steps[i].src : p.steps[i].dst);
        ++count;
        to_move += b;
        if (k < head) ++posted;
        // A receive that has landed counts as received even while its reduction waits.
        if (ex.state[i] == kDone ||
            (!send && ex.state[i] == kPosted && ex.req[i].state == transport::Request::State::done)) {
          ++done;
          moved += b;
        } else if (next < 0) {
          next = i;
        }
      }
    };
    tally(ex.sendq[q], ex.send_head[q], true, pp.sends, pp.sends_posted, pp.sends_done, pp.bytes_to_send,
          pp.bytes_sent, pp.next_send_step);
    tally(ex.recvq[q], ex.recv_head[q], false, pp.recvs, pp.recvs_posted, pp.recvs_done, pp.bytes_to_recv,
          pp.bytes_received, pp.next_recv_step);
  }
}

/// A dump's record of an operation not finished: queued (or never run), or running (or
/// failed) with each peer's progress.
TraceRecord unfinished(const Operation& op, TraceRecord::State state) {
  TraceRecord r;
  describe_call(op, r);
  r.state = state;
  r.name = op.name;
  if (op.work) r.started = op.work->started;
  return r;
}
template <class ExecT>
TraceRecord unfinished(const ExecT& ex, TraceRecord::State state) {
  TraceRecord r = unfinished(ex.op, state);
  if (ex.plan != nullptr && !ex.op.task) describe_progress(ex, r);
  return r;
}

}  // namespace

MetricSeries* Engine::series_of(const Exec& ex) {
  if (ex.op.task || ex.plan == nullptr) return nullptr;
  const Plan& p = *ex.plan;
  if (ex.op.p2p) {
    const bool send = !p.steps.empty() && p.steps.front().kind == StepKind::send;
    return &metrics_.series(send ? "send" : "recv", "p2p", p.request.codec);
  }
  return &metrics_.series(ex.op.barrier ? "barrier" : collectives::to_string(p.request.collective), p.name(),
                          p.request.codec);
}

TraceEntry* Engine::record_done(const Exec& ex) noexcept {
  TraceEntry* e = recorder_.next();
  if (e == nullptr) return nullptr;
  const Operation& op = ex.op;
  describe_call(op, *e);
  e->set_call(op.name);
  e->bytes_sent = ex.sent_bytes;
  e->started = op.work ? op.work->started : Clock::time_point{};
  e->ended = Clock::time_point{};
  return e;
}

/// Queued operations a dump lists (the rest are counted).
constexpr std::size_t kTraceQueued = 100;

void Engine::link_sent(int peer, std::uint64_t bytes, Clock::time_point posted) noexcept {
  LinkStats& l = links_[static_cast<std::size_t>(peer)];
  // Sends to one peer complete in order, and a send posted while earlier ones still move
  // waits for them: count each stretch of time once.
  const Clock::time_point from = std::max(posted, l.last_done);
  if (pass_now_ > from)
    l.busy_ns += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(pass_now_ - from).count());
  l.last_done = std::max(l.last_done, pass_now_);
  l.bytes += bytes;
}

namespace {

double mb_per_s(std::uint64_t bytes, std::uint64_t ns) { return ns > 0 ? static_cast<double>(bytes) * 1e3 / ns : 0; }
double ms(std::uint64_t ns) { return static_cast<double>(ns) * 1e-6; }

}  // namespace

double Engine::model_mb_per_s(int peer) {
  // A routed peer's host is known (no store round trip).
  const auto same = route_[static_cast<std::size_t>(peer)] >= 0 && opt_.topology ? opt_.topology->same_host(peer)
                                                                                 : std::optional<bool>();
  return model_rate_[same.value_or(false) ? 0 : 1].load() * 1e-6;
}

std::string Engine::links_json() {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (int p = 0; p < opt_.size; ++p) {
    const LinkStats& l = links_[static_cast<std::size_t>(p)];
    if (l.bytes == 0 && l.arrivals == 0) continue;
    const int t = route_[static_cast<std::size_t>(p)];
    const bool routed = t >= 0 && static_cast<std::size_t>(t) < router_->entries().size();
    const auto same = routed && opt_.topology ? opt_.topology->same_host(p) : std::optional<bool>();
    os << (first ? "" : ",") << "{\"peer\":" << p << ",\"transport\":\""
       << (routed ? router_->entries()[static_cast<std::size_t>(t)]->name : "?") << "\",\"class\":\""
       << (routed ? router_->entries()[static_cast<std::size_t>(t)]->link_class : "?") << "\",\"same_host\":"
       << (same.value_or(false) ? "true" : "false") << ",\"bytes\":" << l.bytes << ",\"busy_us\":" << l.busy_ns / 1000
       << ",\"MBps\":" << mb_per_s(l.bytes, l.busy_ns) << ",\"model_MBps\":" << model_mb_per_s(p)
       << ",\"recent_MBps\":" << mb_per_s(l.bytes - l.mark_bytes, l.busy_ns - l.mark_busy_ns)
       << ",\"arrivals\":" << l.arrivals << ",\"mean_lag_ms\":" << (l.arrivals ? ms(l.lag_ns) / l.arrivals : 0)
       << ",\"max_lag_ms\":" << ms(l.lag_max_ns) << ",\"recent_mean_lag_ms\":"
       << (l.arrivals > l.mark_arrivals ? ms(l.lag_ns - l.mark_lag_ns) / (l.arrivals - l.mark_arrivals) : 0) << "}";
    first = false;
  }
  os << "]";
  return os.str();
}

std::string Engine::links_line() {
  std::ostringstream os;
  os << std::fixed;
  os.precision(1);
  for (int p = 0; p < opt_.size; ++p) {
    const LinkStats& l = links_[static_cast<std::size_t>(p)];
    const std::uint64_t bytes = l.bytes - l.mark_bytes, busy = l.busy_ns - l.mark_busy_ns;
    const std::uint64_t arrivals = l.arrivals - l.mark_arrivals, lag = l.lag_ns - l.mark_lag_ns;
    if (bytes == 0 && arrivals == 0) continue;
    os << "; rank " << p << ":";
    if (bytes > 0) os << " sent " << mb_per_s(bytes, busy) << " MB/s (model " << model_mb_per_s(p) << ")";
    if (arrivals > 0) os << " first data " << ms(lag) / arrivals << " ms after this rank started (" << arrivals << " calls)";
  }
  return os.str();
}

void Engine::report() {
  next_report_ = Clock::now() + opt_.report_period;
  const std::string line = links_line();
  if (line.empty()) return;  // nothing large since the last report
  BRAID_LOG(info, "rank " << opt_.rank << " links over the last " << opt_.report_period.count() << " s" << line);
  if (!opt_.trace_dir.empty()) write_dump("periodic report (BRAID_REPORT_SECONDS)");
  for (LinkStats& l : links_) {
    l.mark_bytes = l.bytes;
    l.mark_busy_ns = l.busy_ns;
    l.mark_arrivals = l.arrivals;
    l.mark_lag_ns = l.lag_ns;
  }
}

void Engine::write_dump(const std::string& reason) noexcept {
  std::string json;
  std::string path;
  try {
    std::vector<TraceRecord> live;
    for (const auto& ex : active_) live.push_back(unfinished(*ex, TraceRecord::State::running));
    TraceHeader h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The first ones (a program that never waits can queue without bound).
      for (const Operation& op : queue_) {
        if (h.queued_more > 0 || live.size() >= active_.size() + kTraceQueued) {
          ++h.queued_more;
          continue;
        }
        live.push_back(unfinished(op, TraceRecord::State::queued));
      }
      if (failed_.load()) h.engine_error = reason_;
    }
    h.rank = opt_.rank;
    h.size = opt_.size;
    h.comm = opt_.comm_name;
    h.comm_id = opt_.comm_id;
    h.reason = reason;
    h.links = links_json();
    json = trace_json(h, recorder_, live);
    if (!opt_.trace_dir.empty()) {
      path = write_trace(opt_.trace_dir, h, json);
      // Loud after a failure (where to look); the asked-for and periodic ones at INFO.
      const std::string what = "rank " + std::to_string(opt_.rank) + ": flight recorder (" + reason.substr(0, 80) +
                               (reason.size() > 80 ? "..." : "") + "): wrote " + path;
      if (h.engine_error.empty()) BRAID_LOG(info, what);
      else BRAID_LOG(warn, what);
    }
  } catch (const std::exception& e) {
    BRAID_LOG(warn, "rank " << opt_.rank << ": flight recorder: no dump: " << e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_dump_ = std::move(json);
    ++dumps_done_;
  }
  dump_cv_.notify_all();
}

void Engine::request_dump(const std::string& reason) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    dump_reason_ = reason;
  } catch (...) {
  }
  dump_requested_.store(true);
  poller_->wake();
}

std::string Engine::dump_trace(const std::string& reason, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t target = dumps_done_ + 1;
  lock.unlock();
  request_dump(reason);
  lock.lock();
  BRAID_CHECK(dump_cv_.wait_for(lock, wait, [&] { return dumps_done_ >= target; }), Timeout,
              "dump_trace on rank " << opt_.rank << ": the progress engine did not answer within " << wait.count()
                                    << " ms (held up outside braid?)");
  BRAID_CHECK(!last_dump_.empty(), System, "dump_trace on rank " << opt_.rank << ": the dump failed (see the log)");
  return last_dump_;
}

void Engine::fail_current(std::exception_ptr error, const std::string& reason, Exec* culprit) {
  int blame = timeout_blame_;
  try {
    std::rethrow_exception(error);
  } catch (const RemoteError& e) {
    blame = e.peer();
  } catch (...) {
  }
  BRAID_LOG(error, reason);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reason_.empty() || !abort_requested_) reason_ = reason;
    failed_ = true;
  }
  // Leave the reason for neighbours before closing the connections they will see drop
  // (within the board's budget: a store that does not answer delays no report).
  board_->publish_failure(blame, reason);
  // The peers hear it directly too, before the close (the store may be the failure).
  for (auto& t : transports_) t->tell_peers(blame, reason);
  for (auto& t : transports_) t->close_all(reason);
  // Callers make `error` in a statement of their own, never as
  // fail_current(std::make_exception_ptr(E(...)), ...): std::runtime_error shares its
  // message (a reference-counted string inside libstdc++) between the temporary E and the
  // copy the exception_ptr holds, and a temporary destroyed after the hand-over releases
  // that string while a waiter may be reading what() (a ThreadSanitizer report in CI).
  // `error` is handed to the culprit's Work below; from then on a waiting thread may read
  // it and drop the last reference. That count lives in libstdc++, where ThreadSanitizer
  // cannot see it, so this thread reads nothing of `error` after the hand-over: the other
  // operations' errors are made from `kind`, a copy of its kind (and step() leaves its
  // catch block before calling here). Only this thread's own reference remains, dropped
  // in std::exception_ptr (tests/tsan.supp; docs/reliability.md, "ThreadSanitizer").
  const std::exception_ptr kind = same_kind(error, reason);
  // The operation that failed gets the error itself; others running beside it
  // (point-to-point) are aborted with the reason. The recorder keeps where each stood.
  const auto now = Clock::now();
  for (auto& ex : active_) {
    const bool own = ex.get() == culprit || (culprit == nullptr && ex == active_.front());
    if (MetricSeries* series = series_of(*ex)) metrics_.count(*series, 0, 0, {}, false);
    if (recorder_.capacity() > 0) {
      TraceRecord r = unfinished(*ex, TraceRecord::State::failed);
      r.ended = now;
      r.error = own ? reason : "aborted: the communicator failed";
      recorder_.keep_ended(std::move(r));
    }
    if (own)
      ex->op.work->complete(error);
    else
      ex->op.work->complete(same_kind(kind, ex->op.name + " aborted: the communicator failed: " + reason));
  }
  active_.clear();
  fail_all(reason, kind);
  if (!opt_.trace_dir.empty()) write_dump(reason);
}

void Engine::fail_all(const std::string& why, const std::exception_ptr& cause) {
  std::deque<Operation> q;
  {
    std::lock_guard<std::mutex> lock(mu_);
    q.swap(queue_);
    queued_.store(0, std::memory_order_release);
  }
  for (auto& op : q) {
    // Issued here, never started: what this rank was asked to do next.
    if (recorder_.capacity() > 0) recorder_.keep_ended(unfinished(op, TraceRecord::State::not_run));
    op.work->complete(same_kind(cause, op.name + " not run: the communicator failed earlier: " + why));
  }
}

void Engine::finish_step(Exec& ex, std::uint32_t i) {
  const Step& s = ex.plan->steps[i];
  if (ex.flow) {
    // A message is in its pinned slot: the stream may go past its wait (a host store).
    if (s.kind != StepKind::send) ex.flow->landed(i);
    ex.state[i] = kDone;
    ++ex.done;
    return;
  }
  if (s.kind == StepKind::recv_reduce) {
    std::byte* dst = ex.ptr(s.dst);
    const std::byte* src = ex.ptr(s.src);
    const int slot = ex.staging_of[i];
    // Commutative ops: the message either sits in staging or already in dst.
    const std::byte* msg = slot >= 0 ? ex.staging + static_cast<std::size_t>(slot) * ex.stage_stride : dst;
    if (s.scale_src) kernels::reduce_scaled(ex.op.dtype, dst, msg, src, s.dst.count, ex.op.scale);
    else kernels::reduce(ex.op.dtype, ex.op.op, dst, msg, src, s.dst.count);
    if (slot >= 0) ex.free_staging.push_back(slot);
  }
  if (s.finalize) kernels::divide(ex.op.dtype, ex.ptr(s.dst), s.dst.count, opt_.size);
  ex.state[i] = kDone;
  ++ex.done;
}

// The device path: a send goes once the stream has filled its slot; every receive is
// posted at once into its own slot (the stream, not the engine, orders what reads it).
// No device call: the words are host memory.
bool Engine::post_flow(Exec& ex) {
  bool any = false;
  const Plan& p = *ex.plan;
  for (std::size_t q = 0; q < p.peers.size(); ++q) {
    const auto peer2 = 2 * static_cast<std::size_t>(p.peers[q]);
    while (order_mark_[peer2] != order_gen_ && ex.send_head[q] < ex.sendq[q].size()) {
      const std::uint32_t i = ex.sendq[q][ex.send_head[q]];
      if (!ex.flow->filled(i)) {
        awaiting_stream_ = true;
        break;
      }
      ex.state[i] = kPosted;
      if (ex.measure) ex.posted_at[i] = pass_now_;
      ex.conns[q]->send(ex.flow->slot(i), ex.bytes(p.steps[i].src), ex.tag(ex.send_head[q]), &ex.req[i]);
      ex.inflight.push_back(i);
      ++ex.send_head[q];
      any = true;
    }
    while (order_mark_[peer2 + 1] != order_gen_ && ex.recv_head[q] < ex.recvq[q].size()) {
      const std::uint32_t i = ex.recvq[q][ex.recv_head[q]];
      ex.state[i] = kPosted;
      ex.conns[q]->recv(ex.flow->slot(i), ex.bytes(p.steps[i].dst), ex.tag(ex.recv_head[q]), &ex.req[i]);
      ex.inflight.push_back(i);
      ++ex.recv_head[q];
      any = true;
    }
  }
  return any;
}

// Starts every queue head whose dependencies are met; returns whether any started.
bool Engine::post_ready(Exec& ex) {
  if (ex.flow) return post_flow(ex);
  bool any = false;
  const Plan& p = *ex.plan;
  for (std::size_t q = 0; q < p.peers.size(); ++q) {
    const auto peer2 = 2 * static_cast<std::size_t>(p.peers[q]);
    while (order_mark_[peer2] != order_gen_ && ex.send_head[q] < ex.sendq[q].size()) {
      const std::uint32_t i = ex.sendq[q][ex.send_head[q]];
      if (!ex.deps_done(i)) break;
      const Step& s = p.steps[i];
      ex.state[i] = kPosted;
      if (ex.measure) ex.posted_at[i] = pass_now_;
      ex.conns[q]->send(ex.ptr(s.src), ex.bytes(s.src), ex.tag(ex.send_head[q]), &ex.req[i]);
      ex.inflight.push_back(i);
      ++ex.send_head[q];
      any = true;
    }
    while (order_mark_[peer2 + 1] != order_gen_ && ex.recv_head[q] < ex.recvq[q].size()) {
      const std::uint32_t i = ex.recvq[q][ex.recv_head[q]];
      if (!ex.deps_done(i)) break;
      const Step& s = p.steps[i];
      const std::size_t bytes = ex.bytes(s.dst);
      std::byte* target = ex.ptr(s.dst);
      if (lands_in_staging(s, ex.elem, ex.op.input, ex.op.output)) {
        if (ex.free_staging.empty()) break;  // wait for a slot to free up
        const int slot = ex.free_staging.back();
        ex.free_staging.pop_back();
        ex.staging_of[i] = slot;
        target = ex.staging + static_cast<std::size_t>(slot) * ex.stage_stride;
      }
      ex.state[i] = kPosted;
      ex.conns[q]->recv(target, bytes, ex.tag(ex.recv_head[q]), &ex.req[i]);
      ex.inflight.push_back(i);
      ++ex.recv_head[q];
      any = true;
    }
  }
  while (ex.local_head < ex.localq.size()) {
    const std::uint32_t i = ex.localq[ex.local_head];
    if (!ex.deps_done(i)) break;
    const Step& s = p.steps[i];
    switch (s.kind) {
      case StepKind::reduce:
        if (s.scale_src)
          kernels::reduce_scaled(ex.op.dtype, ex.ptr(s.dst), ex.ptr(s.src2), ex.ptr(s.src), s.dst.count, ex.op.scale);
        else
          kernels::reduce(ex.op.dtype, ex.op.op, ex.ptr(s.dst), ex.ptr(s.src), ex.ptr(s.src2), s.dst.count);
        break;
      case StepKind::encode: {
        const auto cs = compression::stream_spec(p.request.codec, s.stream_rank, static_cast<compression::Phase>(s.stream));
        float* residual = s.src2.count > 0 ? reinterpret_cast<float*>(ex.ptr(s.src2)) : nullptr;
        compression::encode_framed(cs, ex.frame, reinterpret_cast<const float*>(ex.ptr(s.src)), residual, s.src.count,
                                   reinterpret_cast<std::uint8_t*>(ex.ptr(s.dst)), ex.op.codec_step, s.at);
        break;
      }
      case StepKind::decode:
        compression::decode_framed(p.request.codec, ex.frame, reinterpret_cast<const std::uint8_t*>(ex.ptr(s.src)),
                                   s.dst.count, reinterpret_cast<float*>(ex.ptr(s.dst)), s.sum_start);
        break;
      case StepKind::decode_add:
        compression::decode_add_framed(p.request.codec, ex.frame, reinterpret_cast<const std::uint8_t*>(ex.ptr(s.src)),
                                       s.dst.count, reinterpret_cast<float*>(ex.ptr(s.dst)));
        break;
      case StepKind::scale:
        kernels::scale(ex.op.dtype, ex.ptr(s.dst), ex.ptr(s.src), s.dst.count, ex.op.scale);
        break;
      default:
        if (ex.ptr(s.dst) != ex.ptr(s.src)) std::memmove(ex.ptr(s.dst), ex.ptr(s.src), s.dst.count * ex.elem);
    }
    finish_step(ex, i);
    ++ex.local_head;
    any = true;
  }
  return any;
}

void Engine::mark_unposted(const Exec& ex) {
  const Plan& p = *ex.plan;
  for (std::size_t q = 0; q < p.peers.size(); ++q) {
    const auto peer2 = 2 * static_cast<std::size_t>(p.peers[q]);
    if (!ex.routed || ex.send_head[q] < ex.sendq[q].size()) order_mark_[peer2] = order_gen_;
    if (!ex.routed || ex.recv_head[q] < ex.recvq[q].size()) order_mark_[peer2 + 1] = order_gen_;
  }
}

// Completes finished transfers; returns whether any completed, or throws the
// failure of the first failed one.
bool Engine::reap(Exec& ex) {
  bool any = false;
  for (std::size_t k = 0; k < ex.inflight.size();) {
    const std::uint32_t i = ex.inflight[k];
    const auto st = ex.req[i].state;
    if (st == transport::Request::State::pending) {
      ++k;
      continue;
    }
    if (st == transport::Request::State::failed) std::rethrow_exception(peer_error(ex, i));
    const Step& s = ex.plan->steps[i];
    if (ex.measure) {
      if (s.kind == StepKind::send) {
        link_sent(s.peer, ex.bytes(s.src), ex.posted_at[i]);
      } else if (!ex.op.p2p) {
        // The first message from a peer: how long after this rank started did it come?
        const auto q = static_cast<std::size_t>(
            std::lower_bound(ex.plan->peers.begin(), ex.plan->peers.end(), s.peer) - ex.plan->peers.begin());
        if (!ex.heard[q] && ex.op.work) {
          ex.heard[q] = 1;
          LinkStats& l = links_[static_cast<std::size_t>(s.peer)];
          const auto lag = static_cast<std::uint64_t>(
              std::max<std::int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(pass_now_ - ex.op.work->started).count()));
          ++l.arrivals;
          l.lag_ns += lag;
          l.lag_max_ns = std::max(l.lag_max_ns, lag);
        }
      }
    }
    finish_step(ex, i);
    ex.inflight[k] = ex.inflight.back();
    ex.inflight.pop_back();
    any = true;
  }
  return any;
}

// Fails the running operation when a peer it still has to send to has gone away:
// that peer will never read, even if nothing is posted on its connection yet (its
// receives may still be buffered, so only remaining sends count).
void Engine::check_peers(Exec& ex) {
  for (std::size_t q = 0; q < ex.plan->peers.size(); ++q) {
    std::string why;
    if (ex.send_head[q] < ex.sendq[q].size() && ex.conns[q]->broken(&why)) {
      const std::uint32_t i = ex.sendq[q][ex.send_head[q]];
      ex.req[i].state = transport::Request::State::failed;
      ex.req[i].error = why;
      ex.req[i].failed_peer = ex.plan->peers[q];
      ex.req[i].peer_closed = true;
      std::rethrow_exception(peer_error(ex, i));
    }
  }
}

std::string Engine::deadline_error(Exec& ex) {
  std::ostringstream os;
  os << ex.op.name << " timed out after " << ex.op.timeout.count() << " ms with "
     << (ex.plan->steps.size() - ex.done) << " of " << ex.plan->steps.size() << " steps left; waiting on:";
  int shown = 0;
  std::sort(ex.inflight.begin(), ex.inflight.end());
  for (std::uint32_t i : ex.inflight)
    if (shown++ < 4) os << " step " << i << " (" << kind_name(ex.plan->steps[i].kind) << " rank "
                        << ex.plan->steps[i].peer << ")";
  if (!ex.routed) {
    os << " ranks that have not joined yet:";
    for (std::size_t q = 0; q < ex.conns.size(); ++q)
      if (!ex.conns[q]) os << " " << ex.plan->peers[q];
  } else if (ex.inflight.empty()) {
    os << " nothing posted (dependencies)";
  }
  if (ex.flow && ex.done == ex.plan->steps.size()) {
    os << "; every message has moved, but the device stream has not run the program to its end (other work of the "
          "GPU may hold it up)";
  } else if (ex.flow) {
    for (std::size_t q = 0; q < ex.sendq.size(); ++q) {
      if (ex.send_head[q] >= ex.sendq[q].size()) continue;
      const std::uint32_t i = ex.sendq[q][ex.send_head[q]];
      if (ex.flow->filled(i)) continue;
      os << "; step " << i << " (send to rank " << ex.plan->steps[i].peer
         << ") waits for the device stream to fill its slot: the stream has not reached it (work enqueued before "
            "the call on the caller's stream has not finished) or other work of the GPU holds it up";
      break;
    }
  }
  os << ". A peer may be stuck or slow, or the ranks issued different collectives; "
        "raise BRAID_TIMEOUT if the job is just slow.";
  // Blame the peer of the oldest transfer still in flight: the one this rank was
  // waiting for, unless the chain of waits leads further (follow_stalls).
  timeout_blame_ = ex.inflight.empty() ? -1 : ex.plan->steps[ex.inflight.front()].peer;
  os << follow_stalls(ex);
  return os.str();
}

std::string Engine::follow_stalls(const Exec& ex) {
  // Every rank whose deadline fires in this call waits on someone; a silent rank (SIGSTOP,
  // a hang in the training script, a call it never made) writes nothing. The deadlines of
  // a call fire at about the same time on every rank, so the first to fire waits a little
  // for the others' records before it closes its connections, which would otherwise fail
  // its neighbours with its own report first and hide whom they were waiting on. The board
  // waits for the store a grace at most: a rank cut off from the store keeps its local
  // blame instead of waiting the store's I/O timeout.
  const auto grace = std::clamp<std::chrono::milliseconds>(ex.op.timeout / 10, std::chrono::milliseconds(200),
                                                           std::chrono::milliseconds(2000));
  const StallVerdict v = board_->follow_stalls(ex.op.seq, timeout_blame_, grace);
  if (v.no_record) {
    // No record is not silence when the rank cannot write one (it is cut off from the
    // store). A direct peer tells which: one that is alive fails on its own deadline and
    // closes its connections soon after; a stopped or hung one keeps them open and says
    // nothing. Waiting for that costs a grace and half a second, once, in a failure.
    const int p = v.blame;
    const std::string closed = watch_close(ex, p, grace + std::chrono::milliseconds(500));
    if (!closed.empty()) {
      const std::string b = std::to_string(p);
      const PeerRecord rec = board_->record_of(p);
      if (rec.kind == PeerRecord::Kind::failed) {
        std::string text = rec.text;
        if (text.rfind("braid ", 0) == 0 && text.find(": ") != std::string::npos) text = text.substr(text.find(": ") + 2);
        timeout_blame_ = rec.blame >= 0 && rec.blame < opt_.size && rec.blame != opt_.rank ? rec.blame : p;
        return " Rank " + b + " closed its connection meanwhile; it reported: " + text;
      }
      // It was not stopped: it died just now, or failed on its own without reaching the
      // store. Blame nobody in this rank's record: the others would take it as certain.
      const std::string silence = board_->store_silence();
      timeout_blame_ = -1;
      return " Rank " + b + " left no record in the store within " + std::to_string(grace.count()) +
             " ms but closed its connection meanwhile (" + closed +
             "): it was not stopped; it died, or failed on its own without reaching the store (cut off from it);"
             " whom it waited on could not be learned" +
             (silence.empty() ? std::string() : " (" + silence + ")") + ".";
    }
  }
  if (v.blame >= 0) timeout_blame_ = v.blame;
  if (v.store_silence.empty()) return v.text;
  std::string out = " Whom the ranks wait on could not be followed: " + v.store_silence + ".";
  const int host = board_->store_host();
  if (host >= 0 && host != opt_.rank) {
    const std::string h = std::to_string(host);
    out += " Rank " + h + " serves the store, which does not answer: rank " + h +
           " is stopped, dead or cut off from this rank, the likely cause.";
    timeout_blame_ = host;
  } else if (timeout_blame_ >= 0) {
    out += " Rank " + std::to_string(timeout_blame_) +
           " is the first this rank waits on; it may be the cause, or be waiting on the rank that is.";
  }
  return out;
}

std::string Engine::watch_close(const Exec& ex, int peer, std::chrono::milliseconds window) {
  transport::Connection* conn = nullptr;
  for (std::size_t q = 0; q < ex.plan->peers.size(); ++q)
    if (ex.plan->peers[q] == peer) conn = ex.conns[q];
  if (conn == nullptr) return "";
  const auto until = Clock::now() + window;
  std::string why;
  while (!conn->broken(&why) && Clock::now() < until) {
    try {
      poller_->collect(2);
      poller_->dispatch();
      for (auto& t : transports_) t->progress();
    } catch (const std::exception&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  if (conn->broken(&why)) return why.empty() ? "closed" : why;
  return "";
}

bool Engine::step(bool& unrouted) {
  step_now_ = Clock::now();
  bool progressed = false;
  Exec* running = nullptr;  // for blame when something throws
  // A failure is handled after its catch block has ended (see fail_current).
  std::exception_ptr failure;
  std::string failure_reason;
  try {
    if (dump_requested_.load(std::memory_order_relaxed) && dump_requested_.exchange(false)) {
      std::string why;
      {
        std::lock_guard<std::mutex> lock(mu_);
        why.swap(dump_reason_);
      }
      write_dump(why);
    }
    if (abort_requested_.load() && !failed_.load()) {
      const std::string why = reason();
      // Made in a statement of its own (see fail_current): the temporary dies before the hand-over.
      std::exception_ptr err = std::make_exception_ptr(Error(
          ErrorCode::Aborted, (active_.empty() ? std::string() : active_.front()->op.name + ": ") + "aborted: " + why));
      fail_current(std::move(err), "aborted: " + why);
    }
    if (admit()) progressed = true;
    if (!expired_gate_.empty()) {
      std::string stuck;
      stuck.swap(expired_gate_);
      std::exception_ptr err = std::make_exception_ptr(TimeoutError(stuck));
      fail_current(std::move(err), stuck);
      return true;
    }
    if (!failed_.load()) {
      if (poller_->dispatch() > 0) progressed = true;
      for (auto& t : transports_) progressed |= t->progress();
    }
    ++order_gen_;  // no connection is held back yet in this pass
    awaiting_stream_ = false;
    bool posted = false;  // a step was handed to a transport in this pass
    for (std::size_t k = 0; k < active_.size();) {
      Exec& ex = *active_[k];
      running = &ex;
      if (ex.op.task) {
        BRAID_LOG(trace, "run " << ex.op.name);
        ex.op.task();
        BRAID_LOG(trace, "done " << ex.op.name);
        ex.op.work->complete();
        if (TraceEntry* e = record_done(ex)) e->ended = ex.op.work->ended;
        active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(k));
        progressed = true;
        continue;
      }
      if (ex.measure) pass_now_ = Clock::now();
      if (!ex.routed && !route(ex)) unrouted = true;
      if (ex.routed) {
        progressed |= reap(ex);
        if (post_ready(ex)) progressed = posted = true;
      }
      bool finished = ex.done == ex.plan->steps.size();
      if (finished && ex.flow) {
        // Every message has moved; the stream may still be reducing the last ones.
        finished = ex.flow->ended();
        if (!finished) awaiting_stream_ = true;
        if (finished)
          if (const std::string why = ex.flow->failure(); !why.empty()) throw Error(ErrorCode::Network, why);
      }
      if (finished) {
        BRAID_LOG(trace, "done " << ex.op.name);
        const std::shared_ptr<detail::WorkState> work = ex.op.work;
        TraceEntry* rec = record_done(ex);
        MetricSeries* series = series_of(ex);
        const std::uint64_t bytes = ex.plan->request.count * ex.elem, wire = ex.sent_bytes;
        {
          // Ended here as before (its lease, plan and keepalive go now); its vectors stay
          // for the next admission.
          std::unique_ptr<Exec> ended = std::move(active_[k]);
          active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(k));
          auto next = std::make_unique<Exec>();
          next->reuse_storage(*ended);
          ended.reset();
          spare_exec_ = std::move(next);
        }
        // Idle before the caller hears of it: its next small call then runs inline
        // (submit) instead of finding the engine busy and handing itself to this thread,
        // which would hand the one after it over too (a 2-rank 4 KiB all-reduce then
        // took twice as long, run after run; issue 32).
        settle_if_idle();
        work->complete();
        if (rec != nullptr) rec->ended = work->ended;  // still ours: only the driving thread records
        if (series != nullptr) metrics_.count(*series, bytes, wire, work->ended - work->started, true);
        if (!learned_after_first_) {
          // Every rank has made its communicator by now, the one serving the store too.
          learned_after_first_ = true;
          board_->learn_store_host();
        }
        progressed = true;
        continue;
      }
      mark_unposted(ex);
      if (ex.routed && !progressed) check_peers(ex);
      if ((ex.measure ? pass_now_ : step_now_) > ex.deadline) {
        // The dump first: deadline_error() may wait a grace for the peers' records, and a
        // launcher that sees another rank fail meanwhile may kill this one.
        if (!opt_.trace_dir.empty()) write_dump(ex.op.name + " timed out (the dump at the deadline)");
        const std::string msg = deadline_error(ex);
        std::exception_ptr err = std::make_exception_ptr(TimeoutError(msg));
        fail_current(std::move(err), msg, &ex);
        timeout_blame_ = -1;
        return true;  // go round again: admit() settles the idle state
      }
      ++k;
    }
    // Transports move what was posted when they progress: now rather than at the next
    // pass, which a small call's every hop waited for (two hops of a 2-rank all-reduce;
    // issue 32).
    if (posted && !failed_.load())
      for (auto& t : transports_) t->progress();
    return progressed;
  } catch (const Error& e) {
    failure = std::current_exception();
    failure_reason = (running ? "" : "progress engine: ") + std::string(e.what());
  } catch (const std::exception& e) {
    failure_reason = (running ? running->op.name + ": " : std::string("progress engine: ")) +
                     "internal error: " + e.what();
    failure = std::make_exception_ptr(Error(ErrorCode::Internal, failure_reason));
  }
  fail_current(std::move(failure), failure_reason, running);
  return true;
}

void Engine::run() {
  base::set_log_rank(opt_.rank);
  gpu::mark_progress_thread();  // its device runtime calls count against the progress budget
  const auto spin = std::chrono::microseconds(opt_.spin_us);
  auto last_progress = Clock::now();
  auto route_backoff = std::chrono::milliseconds(1);
  for (;;) {
    if (helpers_.load(std::memory_order_acquire) > 0) {
      // A waiting thread drives (and dispatches what we fetch here); a helper that
      // leaves with work outstanding wakes us.
      try {
        poller_->collect(5);
      } catch (const std::exception&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      continue;
    }
    std::unique_lock<std::mutex> drive(drive_mu_);
    bool unrouted = false;
    const bool progressed = step(unrouted);
    if (active_.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ && queue_.empty()) break;
    }
    const auto now = Clock::now();
    if (opt_.report_period.count() > 0 && now >= next_report_) report();
    if (progressed) {
      last_progress = now;
      route_backoff = std::chrono::milliseconds(1);
      continue;
    }
    try {
      if (now - last_progress < spin) {
        poller_->collect(0);  // step() dispatches
        continue;
      }
      if (awaiting_stream_) {
        // A device program's words are host memory that nothing signals: look again soon.
        drive.unlock();
        poller_->collect(0);
        std::this_thread::sleep_for(kFlowPoll);
        continue;
      }
      long long wait_ms = -1;
      for (auto& ex : active_) {
        const long long left =
            ex->deadline == Clock::time_point::max()
                ? 1000LL
                : std::chrono::duration_cast<std::chrono::milliseconds>(ex->deadline - now).count() + 1;
        wait_ms = wait_ms < 0 ? left : std::min(wait_ms, left);
      }
      if (shut_gate_deadline_ != Clock::time_point::max()) {
        const long long gate_left = std::max<long long>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(shut_gate_deadline_ - now).count() + 1);
        wait_ms = wait_ms < 0 ? gate_left : std::min(wait_ms, gate_left);
      }
      if (wait_ms >= 0) wait_ms = std::clamp<long long>(wait_ms, 1, 1000);
      if (unrouted) {  // a peer has not joined yet: look again soon, backing off
        wait_ms = route_backoff.count();
        route_backoff = std::min(route_backoff * 2, std::chrono::milliseconds(50));
      }
      bool sleep_ok = true;
      if (!failed_.load())
        for (auto& t : transports_) sleep_ok = t->prepare_sleep() && sleep_ok;
      if (!sleep_ok) continue;
      drive.unlock();  // a helper may drive while we sleep
      poller_->collect(static_cast<int>(wait_ms));
    } catch (const std::exception& e) {
      const std::string msg = std::string("progress engine: waiting for events failed: ") + e.what();
      if (!drive.owns_lock()) drive.lock();
      if (!failed_.load()) {
        std::exception_ptr err = std::make_exception_ptr(Error(ErrorCode::System, msg));
        fail_current(std::move(err), msg);
      }
      drive.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // never spin on a broken poller
    }
  }
}

namespace {
/// How long a helper polls without system calls before it also collects socket events and
/// yields (Engine::help).
constexpr auto kHelpPollOnly = std::chrono::microseconds(20);
}  // namespace

void Engine::help(detail::WorkState& w, Clock::time_point until) noexcept { help(w, Help::waiter, until); }

void Engine::help(detail::WorkState& w, Help how, Clock::time_point until) noexcept {
  if (std::this_thread::get_id() == thread_.get_id()) return;
  if (no_helpers_.load(std::memory_order_acquire)) return;  // the waiter sleeps; the engine drives
  if (how == Help::one_pass) until = Clock::now();
  helpers_.fetch_add(1, std::memory_order_acq_rel);
  bool more = false;
  {
    std::unique_lock<std::mutex> drive(drive_mu_, std::defer_lock);
    if (how == Help::one_pass) {
      if (!drive.try_lock()) {  // another thread drives and will admit it
        helpers_.fetch_sub(1, std::memory_order_acq_rel);
        poller_->wake();
        return;
      }
    } else {
      drive.lock();
    }
    base::set_log_rank(opt_.rank);
    // A helper yields while it polls, so it may poll even where the engine thread must
    // not spin (more local ranks than cores, BRAID_SPIN_US=auto -> 0).
    const auto spin = std::chrono::microseconds(std::max(opt_.spin_us, opt_.help_spin_us));
    auto last_progress = Clock::now();
    while (!w.finished.load(std::memory_order_acquire)) {
      bool unrouted = false;
      const bool progressed = step(unrouted);
      if (w.finished.load(std::memory_order_acquire)) break;
      const auto now = step_now_;  // the pass's start: a pass later than the clock now
      if (now >= until || failed_.load()) break;
      if (progressed) {
        last_progress = now;
        continue;
      }
      // Nothing moves: poll for a while, yielding the core between polls (a peer rank
      // may need it to answer; with nothing else runnable a yield costs well under a
      // microsecond), then leave the waiting to the engine thread, which sleeps in
      // epoll instead of burning this thread's core.
      if (now - last_progress >= spin) break;
      // With a core per rank (the engine thread may spin), poll memory alone for the
      // first microseconds: a shared-memory peer's answer shows in the rings, and the
      // system calls below (epoll, yield) would double the time to see it.
      if (opt_.spin_us > 0 && now - last_progress < kHelpPollOnly) continue;
      try {
        poller_->collect(0);
      } catch (const std::exception&) {
        break;
      }
      std::this_thread::yield();
    }
    // Settle the idle state (drain() waits for it) and admit what was queued
    // meanwhile: the engine thread may be asleep, its wake-up consumed by this
    // helper's polls, and must be woken if anything is left.
    try {
      admit();
    } catch (...) {
    }
    // A transport whose sleep is armed by a call (UCX's worker) and that this helper
    // progressed is no longer armed: the engine thread, asleep on the old arm, would miss
    // its next message. Wake it to arm again.
    for (const auto& t : transports_) more = more || t->needs_rearm();
    std::lock_guard<std::mutex> lock(mu_);
    more = more || !active_.empty() || !queue_.empty();
  }
  helpers_.fetch_sub(1, std::memory_order_acq_rel);
  if (!more) return;
  // Hand the rest back to the engine thread. A waiter leaves because nothing moved for
  // the spin time: wake it now. A call run inline returns to its caller, who most likely
  // waits for it next and drives it then: wake the engine thread only if nobody has
  // finished it by the grace time (each such call moves the time on), so that a blocking
  // small call costs no thread hand-off, and an unwaited one still progresses.
  if (how == Help::waiter) {
    poller_->wake();
    return;
  }
  poller_->wake_at(Clock::now() + std::chrono::microseconds(opt_.help_spin_us));
}

}  // namespace braid::core
