// braid progress engine: one thread per communicator that executes plans.
//
// The engine is the one place where a plan meets transports and kernels
// (DESIGN.md §1). Operations are executed one at a time in issue order; within an
// operation every step whose dependencies are met is started at once, so a rank
// sends to and receives from all its peers concurrently and pipelined slices
// overlap. When nothing moves the thread spins for BRAID_SPIN_US, then sleeps in
// epoll until a socket is ready or a new operation is posted.
//
// Waiting threads may help (BRAID_WAIT_HELPS=1; off by default, see
// docs/performance.md): Work::wait() on a submitted operation takes the engine's
// drive lock (the engine thread steps aside while a helper is there) and runs the
// same progress loop on the caller's thread until its work completes or nothing has
// moved for BRAID_SPIN_US; then it hands back to the engine thread and sleeps. A
// blocking small collective thus runs start to finish on the thread that waits for
// it, without the two thread hand-offs (post -> engine, engine -> waiter) that
// dominate its latency, and without a second spinning thread per rank.
//
// Failure model: the first failure (a peer's connection breaks, a deadline passes,
// abort()) fails the running operation with an Error naming collective, sequence
// number, step and peer, records the reason in the store under "abort/<rank>" so
// that other ranks can say why, closes every connection (which is how neighbours
// learn of it quickly), fails every queued operation with an error of the same kind
// (RemoteError naming the peer, TimeoutError; Aborted after abort()), and every later
// one with Aborted. The store is asked through core::FailureBoard (failure.hpp), which
// never lets it delay a report by more than a short budget: a store that does not
// answer leaves the engine's own verdict, and where a rank serves the store its
// silence names that rank.
#pragma once

#include "collectives/plan.hpp"
#include "core/config.hpp"
#include "core/failure.hpp"
#include "core/flight_recorder.hpp"
#include "core/metrics.hpp"
#include "core/router.hpp"
#include "core/topology.hpp"
#include "core/work_state.hpp"

#include <braid/store.hpp>
#include <braid/types.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace braid::base {
class Poller;
}  // namespace braid::base

namespace braid::transport {
class Transport;
}  // namespace braid::transport

namespace braid::gpu {
class Runtime;
}  // namespace braid::gpu

namespace braid::core {

class FlowOp;

/// One collective queued on the engine.
struct Operation {
  std::uint64_t seq = 0;
  std::shared_ptr<const collectives::Plan> plan;
  const void* input = nullptr;
  void* output = nullptr;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  double scale = 1.0;  ///< premul_sum's factor (the plan's scale steps)
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<detail::WorkState> work;
  std::shared_ptr<void> keepalive;  ///< buffers owned by the library (barrier)
  std::string name;                 ///< "allreduce #5 (ring, 1048576 x f32, sum)"
  /// Point-to-point (send/recv): may run concurrently with neighbouring point-to-point
  /// operations (so that a pair can exchange both ways without deadlock); its
  /// messages carry `tag_base` instead of the collective sequence number.
  bool p2p = false;
  std::uint64_t tag_base = 0;
  std::uint64_t p2p_seq = 0;  ///< point-to-point: its number among this rank's sends and receives
  bool barrier = false;       ///< Communicator::barrier (its plan is an all-reduce): metrics say "barrier"
  /// A host step (no plan): runs on the engine (or a helping waiter) in issue order,
  /// once everything issued before it has completed, and before anything issued after
  /// it starts; e.g. the measuring tuner reading its trials' times. An exception from
  /// it fails the communicator like a failed transfer.
  std::function<void()> task;
  /// A collective whose plan is decided after it was issued (the measuring tuner's
  /// verdict): an operation issued earlier fills the slot, and admission takes the
  /// plan from it in place of `plan` (which then only names the call).
  std::shared_ptr<std::shared_ptr<const collectives::Plan>> deferred;
  /// Compressed plans: the error-feedback residuals (Buffer::feedback_worker and
  /// feedback_owner, Plan::feedback_count values each; null without feedback) and the
  /// training step that keys stochastic rounding.
  float* feedback[2] = {nullptr, nullptr};
  std::uint64_t codec_step = 0;
  /// A gate (no plan, no task): admission stops at it until it is set, so that nothing
  /// issued after it starts before then (a device call's input is staged; core::DeviceStaging).
  /// It completes when it opens. If it is still shut `timeout` after it was submitted,
  /// the communicator fails with a Timeout naming the stream that never got there.
  std::shared_ptr<std::atomic<bool>> gate;
  std::chrono::steady_clock::time_point gate_deadline = std::chrono::steady_clock::time_point::max();
  /// The device path (core::DeviceFlow): the call's stream program was enqueued when it
  /// was issued; the engine only moves its messages between pinned slots, posting a send
  /// once the stream has filled its slot and telling the stream when a message landed,
  /// and completes the operation once the stream has run the whole program. Its local
  /// steps are the stream's.
  std::shared_ptr<FlowOp> flow;
};

/// Receive buffers an operation holds for its in-place receive-and-reduces: a receive
/// whose dst overlaps the src it is reduced with cannot land in dst, so its message lands
/// in a staging slot until the reduction. Plans complete with this many slots (the
/// verifier proves it, collectives::VerifyOptions::staging_slots).
inline constexpr std::size_t kMaxStaging = 8;

/// Whether plan step `s`, run on the caller's `input` and `output` with elements of
/// `elem_bytes`, lands its message in staging (a receive-and-reduce whose dst overlaps
/// its src). Scratch never overlaps the caller's buffers, so no scratch address is needed.
bool lands_in_staging(const collectives::Step& s, std::size_t elem_bytes, const void* input, const void* output);

/// The staging an operation reserves at admission, with its scratch and from the same
/// pool: one slot per step that lands in staging, at most kMaxStaging, each of the
/// largest of their messages (rounded up to 64 bytes). A function of the call alone, so
/// that what a rank holds does not depend on how receives happened to overlap in time.
struct StagingNeed {
  std::size_t slots = 0;
  std::size_t slot_bytes = 0;
};
StagingNeed staging_need(const collectives::Plan& plan, std::size_t elem_bytes, const void* input, const void* output);

/// Settings the engine needs, resolved by the communicator.
struct EngineOptions {
  int rank = 0;
  int size = 1;
  std::string comm_name = "braid";
  int spin_us = 100;
  bool wait_helps = false;  ///< waiting threads drive progress (Engine::help; BRAID_WAIT_HELPS)
  /// Collectives of at most this many bytes that find the engine idle run on the
  /// submitting thread (BRAID_INLINE_BYTES; 0: never).
  std::size_t inline_bytes = 0;
  int help_spin_us = 200;   ///< a helper polls (yielding) at least this long without progress
  // What every transport gets (transport::TransportContext); each transport reads its
  // own rows from `settings`.
  std::string master_addr;  ///< bootstrap store address: a hint for the interface to bind
  std::string gpu_pci_bus_id;  ///< the rank's GPU ("" for none): RDMA transports prefer the NIC nearest it
  bool emulated_device_memory = false;  ///< the GPU runtime is the emulation (TransportContext)
  gpu::Runtime* gpu = nullptr;  ///< the communicator's device runtime (null without a device; TransportContext)
  int gpu_device = -1;          ///< its GPU (-1 for none)
  std::string auth_token;
  std::shared_ptr<const base::tls::Context> tls;  ///< BRAID_TLS (core::tls_context); null: off
  std::uint64_t comm_id = 0;
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(300)};
  /// "auto" or a registered transport's name (core::Router).
  std::string transport_mode = "auto";
  /// The parsed configuration (outlives the engine: the communicator's copy).
  const base::Settings* settings = nullptr;
  /// Which host each rank is on (the router asks it per peer).
  std::shared_ptr<const Topology> topology;
  /// This rank's process serves the store (core::serves_store): recorded for the others,
  /// who then name this rank when the store stops answering in a failure.
  bool serves_store = false;
  /// The flight recorder (core/flight_recorder.hpp): operations kept (BRAID_TRACE_ENTRIES)
  /// and where dumps go on a failure or SIGUSR1 (BRAID_TRACE_DIR; "": nowhere).
  std::size_t trace_entries = 0;
  std::string trace_dir;
  /// The metrics endpoint's port (BRAID_METRICS_PORT + local rank; 0: none).
  int metrics_port = 0;
  /// BRAID_REPORT_SECONDS: a line per link (throughput, peers' arrival lag) at INFO this
  /// often, and a dump into trace_dir; 0: never.
  std::chrono::seconds report_period{0};
};

class Engine {
 public:
  /// Starts the transport (publishing this rank's address in `store`) and the
  /// progress thread. `store` is the communicator's (prefixed) store.
  Engine(const EngineOptions& options, std::shared_ptr<Store> store);
  /// The router the engine chooses transports with: in auto mode without the transports
  /// that could not be made here (their library absent). Fixed once constructed.
  const Router& router() const noexcept { return *router_; }
  /// Drains (see drain()), stops the thread and closes connections.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues `op` and makes its work helpable (see the file comment). Thread-safe. If
  /// the engine has failed, completes op.work with Aborted at once. A small collective
  /// (EngineOptions::inline_bytes) submitted while the engine is idle runs on the
  /// calling thread before submit returns, as a helper would run it (help()): until
  /// it completes, or nothing has moved for the spin time, when the engine thread
  /// is woken to finish it. The engine thread is not woken otherwise, so a blocking
  /// small collective costs no thread hand-off at all.
  void submit(Operation op);
  /// Fails everything with Aborted and closes connections. Thread-safe, idempotent.
  void abort(const std::string& reason) noexcept;
  /// Waits until every submitted operation has completed (each is bounded by its
  /// own deadline).
  void drain() noexcept;
  /// True once a failure or abort happened; reason() says which.
  bool failed() const noexcept { return failed_.load(); }
  std::string reason() const;
  /// Something that wakes the engine thread from any thread (a stream callback too),
  /// and does nothing once the engine is gone.
  std::function<void()> waker() const;
  /// Drives progress on the calling (waiting) thread; see detail::WorkHelper::help.
  void help(detail::WorkState& w, std::chrono::steady_clock::time_point until) noexcept;
  /// The flight recorder's dump (JSON), made by the driving thread, which is woken for it;
  /// also written into BRAID_TRACE_DIR when set. Throws braid::Error(Timeout) when no
  /// thread made it within `wait` (the engine held up outside braid, e.g. in a store
  /// callback). Thread-safe.
  std::string dump_trace(const std::string& reason, std::chrono::milliseconds wait);
  /// Asks for a dump into BRAID_TRACE_DIR without waiting for it (SIGUSR1). Thread-safe.
  void request_dump(const std::string& reason) noexcept;
  /// What the cost model expects of one direction of a link inside a host and between
  /// hosts, in bytes per second (dumps and reports show it beside the measured rate).
  /// Thread-safe.
  void set_link_model(double intra_bytes_per_s, double inter_bytes_per_s) noexcept {
    model_rate_[0].store(intra_bytes_per_s);
    model_rate_[1].store(inter_bytes_per_s);
  }
  /// The counters so far (core/metrics.hpp). Thread-safe.
  Metrics metrics() const { return metrics_.snapshot(opt_.comm_name, opt_.rank, opt_.size); }

 private:
  /// Who drives in help(): a thread waiting for its work (until it is done or nothing
  /// moves for the spin time; then the engine thread is woken at once); a small call run
  /// inline by submit() (the same, but the engine thread is woken only after a grace,
  /// as the caller will most likely wait and drive); or one pass of a small send or
  /// receive, only if no other thread is driving.
  enum class Help { waiter, inline_call, one_pass };
  void help(detail::WorkState& w, Help how,
            std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max()) noexcept;
  struct Exec;
  class Gate;
  // Not noexcept: a store callback into foreign code (a Python store) may end the
  // thread with a forced unwind (pthread_exit), which must pass through, not abort.
  void run();
  /// One pass: abort requests, admission, transports, every active operation.
  /// Call with drive_mu_ held. Returns whether anything moved; sets `unrouted` when
  /// an operation waits for a peer that has not joined.
  bool step(bool& unrouted);
  void finish_step(Exec& ex, std::uint32_t i);
  /// Posts what is ready of `ex`, but nothing on a connection an operation admitted
  /// before it still has unposted messages of the same direction on (per-connection
  /// issue order; see order_mark_).
  bool post_ready(Exec& ex);
  bool post_flow(Exec& ex);
  /// Records the connections on which `ex` still has messages to post (call after
  /// post_ready(ex), in admission order).
  void mark_unposted(const Exec& ex);
  bool reap(Exec& ex);
  void check_peers(Exec& ex);
  std::string deadline_error(Exec& ex);
  /// After a deadline: publishes whom this rank waits on ("stall/<rank>") and follows the
  /// records of the ranks waited on, for a short grace while their deadlines fire too, to
  /// the first rank with none (a silent peer: stopped, hung outside braid, or not calling
  /// this collective). Sets timeout_blame_ to it and returns the sentence that names it,
  /// or "" when the chain shows nothing beyond this rank's own wait. When the store does
  /// not answer, says so, and blames the rank that serves the store if one does.
  std::string follow_stalls(const Exec& ex);
  /// Watches the connection of `ex` to `peer` for up to `window`, driving the transports:
  /// why it broke, or "" when it stayed up (or `ex` has none to `peer`).
  std::string watch_close(const Exec& ex, int peer, std::chrono::milliseconds window);
  /// With nothing running or queued, marks the engine idle (busy_ false; drain() and
  /// submit()'s inline path see it). Driving thread only.
  void settle_if_idle();
  bool admit();
  bool route(Exec& ex);
  int transport_for(int peer);
  void fail_current(std::exception_ptr error, const std::string& reason, Exec* culprit = nullptr);
  /// Fails every queued operation, with an error of the same kind as `cause` (a
  /// peer's failure: RemoteError naming it; a deadline: TimeoutError; else Aborted).
  void fail_all(const std::string& reason, const std::exception_ptr& cause = nullptr);
  std::exception_ptr peer_error(const Exec& ex, std::uint32_t step);
  /// Records `ex`, just finished, in the flight recorder; returns its slot (null when
  /// recording is off) for the end time. Driving thread only.
  TraceEntry* record_done(const Exec& ex) noexcept;
  /// Makes the dump (running and queued operations live) and writes it into
  /// opt_.trace_dir when set; wakes dump_trace() callers. Driving thread only.
  void write_dump(const std::string& reason) noexcept;

  EngineOptions opt_;
  std::shared_ptr<Store> store_;
  /// The failure records in the store, asked within a budget (failure.hpp). Before
  /// directory_, which answers peer_gone() from it.
  std::unique_ptr<FailureBoard> board_;
  bool learned_after_first_ = false;  ///< board_->learn_store_host() after the first completion
  std::unique_ptr<base::Poller> poller_;
  std::unique_ptr<class StoreDirectory> directory_;
  std::unique_ptr<Router> router_;
  /// One per router_->entries(), then the loopback (a rank's own number).
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<int> route_;  ///< per peer: index into transports_, -1 = not decided yet

  /// Held by whoever drives transports and active_: the engine thread or a helper.
  std::mutex drive_mu_;
  std::atomic<int> helpers_{0};  ///< threads in help(); the engine thread stays out
  /// A pair runs over a transport only the engine thread may drive (helpers_welcome()):
  /// no inline calls, no helping waiters from then on.
  std::atomic<bool> no_helpers_{false};
  std::shared_ptr<Gate> gate_;   ///< what submitted works call back into
  /// Scratch (and packed payload, and in-place reductions' staging) buffers of finished
  /// operations, reused by the next ones so that a large compressed all-reduce does not
  /// allocate and page-fault its payload buffers again on every call.
  std::shared_ptr<class ScratchPool> scratch_pool_;

  /// Set by admit() (the driving thread, under the drive lock): the deadline of a device
  /// call's gate that holds the queue's head shut (max() when none), and, once it has
  /// passed, the message step() fails the communicator with.
  std::chrono::steady_clock::time_point shut_gate_deadline_ = std::chrono::steady_clock::time_point::max();
  std::string expired_gate_;

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  std::deque<Operation> queue_;
  /// queue_.size(), written under mu_ wherever queue_ changes, read without it by admit():
  /// a pass with nothing queued and something running skips mu_ (issue 32: the polling
  /// loop of a small call locked it on every pass).
  std::atomic<std::size_t> queued_{0};
  bool stop_ = false;
  bool busy_ = false;
  std::string reason_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> abort_requested_{false};

  std::deque<std::unique_ptr<Exec>> active_;  ///< running, in admission order: one collective or
                                              ///< task, or point-to-point operations
  /// An empty Exec holding a finished one's vectors for the next admission (drive_mu_).
  std::unique_ptr<Exec> spare_exec_;
  /// Per peer (2r: sends, 2r+1: receives): equal to order_gen_ when an operation
  /// earlier in active_ still has messages of that direction to post to that peer in the
  /// current pass, so later operations must not post there yet.
  std::vector<std::uint64_t> order_mark_;
  std::uint64_t order_gen_ = 0;
  int timeout_blame_ = -1;  ///< peer blamed in the abort record of a timeout
  /// Set by a pass that left a device-path operation waiting for its stream (a slot not
  /// filled yet, or the program's end): the stream writes host memory and wakes nobody,
  /// so the engine polls instead of sleeping on its poller (kFlowPoll).
  bool awaiting_stream_ = false;

  // --- the flight recorder (driving thread), and dumps asked for from other threads ---
  FlightRecorder recorder_;
  std::atomic<bool> dump_requested_{false};
  std::string dump_reason_;     ///< under mu_
  std::uint64_t dumps_done_ = 0;  ///< under mu_
  std::string last_dump_;       ///< under mu_
  std::condition_variable dump_cv_;
  int dump_listener_ = -1;  ///< SIGUSR1 (add_dump_listener), with a trace directory
  // --- links: throughput of large sends per peer and the peers' arrival lag (driving thread) ---
  struct LinkStats {
    std::uint64_t bytes = 0;    ///< large sends completed
    std::uint64_t busy_ns = 0;  ///< the union of their post-to-completion intervals
    std::chrono::steady_clock::time_point last_done{};  ///< the latest completion counted
    std::uint64_t arrivals = 0, lag_ns = 0, lag_max_ns = 0;  ///< first arrivals in large collectives
    std::uint64_t mark_bytes = 0, mark_busy_ns = 0, mark_arrivals = 0, mark_lag_ns = 0;  ///< at the last report
  };
  std::vector<LinkStats> links_;  ///< per peer rank
  /// The time of the current pass of step() over an operation (read once, for its deadline;
  /// large operations also time their sends and arrivals with it).
  std::chrono::steady_clock::time_point pass_now_{};
  /// The clock at the start of the latest step() (its deadline checks; help()'s spin):
  /// one read per pass instead of one per operation and one more per helper's pass.
  std::chrono::steady_clock::time_point step_now_{};
  std::atomic<double> model_rate_[2] = {0.0, 0.0};  ///< set_link_model: inside a host, between hosts
  std::chrono::steady_clock::time_point next_report_{};
  /// Counts a large send to `peer` done now (posted at `posted`). Driving thread only.
  void link_sent(int peer, std::uint64_t bytes, std::chrono::steady_clock::time_point posted) noexcept;
  /// The links as a JSON array (totals, and figures since the last report); and the
  /// latter in words, for the report line. Driving thread only.
  std::string links_json();
  std::string links_line();
  /// The cost model's rate for the link to `peer`, in MB/s (0: unknown).
  double model_mb_per_s(int peer);
  /// BRAID_REPORT_SECONDS: logs links_line() and writes a dump. Driving thread only.
  void report();
  MetricsTable metrics_;     ///< written by the driving thread
  int metrics_source_ = -1;  ///< add_metrics_source's handle
  /// The series of `ex` (null for host tasks). Driving thread only.
  MetricSeries* series_of(const Exec& ex);
  std::thread thread_;
};

}  // namespace braid::core
