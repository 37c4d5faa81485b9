// braid::Communicator: the façade's calls, their argument checks, and the hand-off to
// the engine. Plans come from core::PlanCache, automatic algorithms from
// core::MeasuredTuner, compressed all-reduce from core::Compressor. Bootstrapping from
// the environment and UniqueIds is in bootstrap.cpp.
#include "core/communicator_impl.hpp"
#include "core/agreement.hpp"
#include "core/host_hardware.hpp"
#include "core/job_secret.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "base/text.hpp"
#include "collectives/tuner.hpp"
#include "gpu/nvml.hpp"
#include "gpu/runtime.hpp"
#include "transport/registry.hpp"

#include <braid/error.hpp>
#include <braid/config.hpp>
#if BRAID_HAVE_UCX
#include "transport/ucx/ucx_probe.hpp"
#endif
#include <braid/info.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

namespace braid {

namespace {

using collectives::Collective;
using collectives::PlanRequest;

using base::hex;

void check_dtype_op(DataType dtype, ReduceOp op, const char* what) {
  BRAID_CHECK(static_cast<unsigned>(dtype) < static_cast<unsigned>(kNumDataTypes), InvalidUsage,
              what << ": unknown data type value " << static_cast<int>(dtype)
                   << " (use braid::DataType: f32 f64 f16 bf16 i8 u8 i32 i64)");
  BRAID_CHECK(static_cast<unsigned>(op) < static_cast<unsigned>(kNumReduceOps), InvalidUsage,
              what << ": unknown reduce op value " << static_cast<int>(op)
                   << " (use braid::ReduceOp: sum prod min max avg premul_sum)");
}

/// premul_sum's factor must be one the element type can multiply by: any value for
/// floating types, an integral one inside the type's range for integer types.
void check_premul_scale(DataType dtype, double scale, const char* what) {
  if (is_floating(dtype)) return;
  double lo = -9223372036854775808.0, hi = 9223372036854775808.0;  // [-2^63, 2^63)
  switch (dtype) {
    case DataType::i8: lo = -128, hi = 128; break;
    case DataType::u8: lo = 0, hi = 256; break;
    case DataType::i32: lo = -2147483648.0, hi = 2147483648.0; break;
    default: break;
  }
  BRAID_CHECK(std::isfinite(scale) && std::trunc(scale) == scale && scale >= lo && scale < hi, InvalidUsage,
              what << ": premul_sum on " << to_string(dtype) << " needs an integral scale in [" << lo << ", " << hi
                   << "), got " << scale);
}

/// Timeouts beyond a year are treated as "a year": far enough for any job, and
/// deadline arithmetic cannot overflow.
std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds t) {
  return std::min<std::chrono::milliseconds>(t, std::chrono::hours(24 * 365));
}

/// Runs `call` on `store` on a thread of its own and waits `budget` at most: a store whose
/// host stopped or died costs the budget, not the store's I/O timeout. True when the call
/// returned in time (a store error counts as returned).
bool within(const std::shared_ptr<Store>& store, std::function<void(Store&)> call,
            std::chrono::milliseconds budget) noexcept {
  try {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> answered = done->get_future();
    std::thread([store, call = std::move(call), done] {
      try {
        call(*store);
      } catch (const std::exception&) {
      }
      done->set_value();
    }).detach();
    return answered.wait_for(budget) == std::future_status::ready;
  } catch (const std::exception&) {  // no thread
    return false;
  }
}

/// The key prefix of a communicator's namespace in the store it was made on.
std::string namespace_key(const std::string& name, int size, std::int64_t gen) {
  return "braid/" + name + "/" + std::to_string(size) + "/" + std::to_string(gen);
}

/// The k-th communicator of this name and size that each rank creates on a store gets
/// namespace k: every rank counts its own creations, so all agree without talking. Two
/// different groups that share a store and a name would collide; every rank claims its
/// seat, so that is an error rather than a silent mix-up. Returns the namespace and k.

std::pair<std::shared_ptr<Store>, std::int64_t> claim_namespace(const std::shared_ptr<Store>& base,
                                                                const std::string& name, int rank, int size) {
  const std::string family = name + "/" + std::to_string(size);
  const std::int64_t gen = base->add("braid/gen/" + family + "/" + std::to_string(rank), 1);
  auto store = std::make_shared<PrefixStore>(namespace_key(name, size, gen), base);
  BRAID_CHECK(store->add("seat/" + std::to_string(rank), 1) == 1, InvalidUsage,
              "Communicator '" << name << "': rank " << rank << " of " << size
                               << " is already taken in this store; two groups share the store under one name. "
                                  "Give each group its own CommOptions::name or its own PrefixStore");
  return {std::move(store), gen};
}

/// Refuses a configuration that names an unknown algorithm or codec.
void check_config(const core::Config& cfg) {
  // TLS covers braid's own TCP connections; UCX and verbs would carry the data in clear.
  BRAID_CHECK(!cfg.tls || (cfg.transport != "ucx" && cfg.transport != "ibverbs"), InvalidUsage,
              "BRAID_TLS=1 with BRAID_TRANSPORT=" << cfg.transport << ": TLS covers the tcp transport and the store "
              "only, and " << cfg.transport << " would carry the job's data in clear; use auto or tcp");
  (void)core::tls_context(cfg);  // a missing or unfit certificate is refused now, before any byte moves
  if (cfg.algo != "auto" && cfg.algo != "ring") {
    const auto a = parse_algorithm(cfg.algo);
    BRAID_CHECK(a.has_value(), InvalidUsage,
                "BRAID_ALGO='" << cfg.algo << "' is not an algorithm: use auto, ring, tree, rhd or hier");
  }
  try {
    (void)compression::parse_codec(cfg.codec);
  } catch (const Error& e) {
    throw Error(ErrorCode::InvalidUsage, std::string("BRAID_CODEC: ") + e.what());
  }
}

/// The engine's options: the configuration's engine rows (spinning, waiting threads
/// that help, inline size, transport, every row for the transports), the master address
/// (else `address_hint`), and this communicator's identity, secret and topology.
core::EngineOptions engine_options(const core::Config& cfg, const core::Membership& member, const std::string& name,
                                   const core::JobSecret& secret, const std::string& address_hint,
                                   const std::string& gpu_pci_bus_id) {
  core::EngineOptions eo;
  eo.gpu_pci_bus_id = gpu_pci_bus_id;
  eo.rank = member.rank;
  eo.size = member.size;
  eo.comm_name = name;
  eo.spin_us = cfg.spin_us;
  eo.wait_helps = cfg.wait_helps;
  eo.inline_bytes = cfg.inline_bytes;
  eo.trace_entries = cfg.trace_entries;
  eo.trace_dir = cfg.trace_dir;
  eo.report_period = std::chrono::seconds(cfg.report_seconds);
  if (eo.spin_us < 0) {
    // Spinning pays when every rank of this host can have a core for its progress
    // thread (the caller's thread sleeps in Work::wait): 2 ranks on 2 cores, 4 KiB
    // all-reduce over shm: 4.3 us with 100 us of spin, 20-45 us without. With more
    // ranks than cores a spinning rank takes the core its peer needs to answer.
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    const int local = cfg.local_size.value_or(cfg.world_size.value_or(member.size));
    eo.spin_us = (cpus > 0 && local <= cpus) ? 100 : 0;
  }
  eo.master_addr = cfg.master_addr.empty() ? address_hint : cfg.master_addr;
  eo.auth_token = secret.token;
  eo.tls = core::tls_context(cfg);
  eo.comm_id = secret.comm_id;
  eo.connect_timeout = member.timeout;
  eo.transport_mode = cfg.transport;
  eo.settings = &cfg.settings;
  eo.topology = member.topology;
  // One endpoint per process, on the port of its rank on this host (the launcher's local
  // rank; else this communicator's, when its topology is known).
  if (cfg.metrics_port > 0)
    eo.metrics_port = cfg.metrics_port + cfg.local_rank.value_or(member.topology ? member.topology->layout().local_rank : 0);
  return eo;
}

}  // namespace

namespace {
/// Whether this process has an RDMA fabric to other hosts, as its UCX reports it (an rc,
/// dc or ud transport): auto mode then runs pairs on different hosts over ucx. Asked
/// once per library (a UCX probe costs a few milliseconds).
bool rdma_fabric(const std::string& ucx_library) {
#if BRAID_HAVE_UCX
  static std::mutex mu;
  static std::map<std::string, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(ucx_library);
  if (it == known.end()) {
    const auto st = transport::ucx::probe(ucx_library);
    it = known.emplace(ucx_library, st.available && st.rdma).first;
    BRAID_LOG(info, "UCX " << transport::ucx::describe(st) << (it->second ? ": pairs on different hosts use ucx" : ""));
  }
  return it->second;
#else
  (void)ucx_library;
  return false;
#endif
}
}  // namespace

Communicator::Impl::Impl(std::shared_ptr<Store> base, int r, int n, const CommOptions& options,
                         const std::string& address_hint, const std::string& given_token)
    : cfg(core::Config::global()), rank(r), size(n), base_store(std::move(base)) {
  BRAID_CHECK(base_store != nullptr, InvalidUsage, "Communicator: store is null");
  BRAID_CHECK(n >= 1, InvalidUsage, "Communicator: size must be at least 1, got " << n);
  BRAID_CHECK(r >= 0 && r < n, InvalidUsage, "Communicator: rank " << r << " is outside [0, " << n << ")");
  BRAID_CHECK(options.timeout.count() >= 0, InvalidUsage, "Communicator: negative timeout");
  BRAID_CHECK(options.chunk_bytes == 0 || options.chunk_bytes >= 4096, InvalidUsage,
              "CommOptions::chunk_bytes " << options.chunk_bytes << " is too small: use 0 (BRAID_CHUNK_BYTES) or >= 4096");
  name = options.name.empty() ? "braid" : options.name;
  if (options.chunk_bytes > 0) cfg.chunk_bytes = options.chunk_bytes;
  BRAID_CHECK(options.transport.empty() || options.transport == "auto" ||
                  transport::find_transport(options.transport) != nullptr,
              InvalidUsage,
              "CommOptions::transport '" << options.transport << "' is not a transport of this build: use auto or one of "
                                         << transport::transport_names());
  if (!options.transport.empty()) cfg.transport = options.transport;
  // The device, as NCCL: the given one, else the creating thread's current device (none
  // without a device runtime: then every buffer is host memory).
  BRAID_CHECK(options.device >= -1, InvalidUsage,
              "CommOptions::device " << options.device << " is not a device: use -1 (the current device) or >= 0");
  gpu::Runtime& rt = core::gpu_runtime();
  if (rt.device_count() > 0) {
    device = options.device >= 0 ? options.device : rt.current_device();
    BRAID_CHECK(device < rt.device_count(), InvalidUsage,
                "CommOptions::device " << device << " does not exist: the device runtime is " << rt.describe());
    // Before the ranks meet: at any rank's first device call, all of this process's count.
    seat = std::make_unique<core::DeviceSeat>(device);
    // Also before the ranks meet: braid's kernels are loaded into the device's context now,
    // when nothing of this process's braid work is in flight (Runtime::load_kernels).
    {
      gpu::RelaxedCapture relaxed(rt);
      rt.load_kernels(device);
    }
  }
  timeout = clamp_timeout(options.timeout.count() > 0 ? options.timeout : cfg.timeout);
  check_config(cfg);

  std::int64_t gen = 0;
  std::tie(store, gen) = claim_namespace(base_store, name, rank, size);
  root_store = base_store;
  root_prefix = namespace_key(name, size, gen);
  root_name = name;
  const core::JobSecret secret =
      core::share_secret(*store, rank, cfg.auth_token.empty() ? given_token : cfg.auth_token, timeout);
  std::string gpu, pci;
  if (device >= 0) {
    pci = rt.pci_bus_id(device);
    gpu = "GPU " + std::to_string(device) + (pci.empty() ? " (" + std::string(gpu::to_string(rt.backend())) + ")"
                                                         : ", PCI " + pci);
  }
  topology = std::make_shared<core::Topology>(
      store, rank, size, core::Topology::local_host_id(options.host_id.empty() ? cfg.host_id : options.host_id),
      timeout, size > 1 && cfg.transport == "auto" && !cfg.tls && rdma_fabric(cfg.ucx_library), gpu);
  // For shrink(): survivors of this host check by it that this rank's process is gone.
  if (size > 1) store->set("proc/" + std::to_string(rank), core::process_identity(topology->host_id()));
  const core::Membership member{rank, size, timeout, store, topology};
  core::EngineOptions eo = engine_options(cfg, member, name, secret, address_hint, pci);
  eo.emulated_device_memory = device >= 0 && rt.backend() == gpu::Backend::emulated;
  eo.serves_store = core::serves_store(*base_store);
  // The transports get no GPU (eo.gpu stays null): no collective path hands a connection
  // device memory now (the device path moves every transfer through pinned slots, and the
  // direct path that did is gone), so a GPU would only make shm allocate device rings and
  // open CUDA IPC mappings at connect that nothing uses. Device-memory connections come
  // with issue 33's next step (docs/gpu.md).
  engine = std::make_unique<core::Engine>(eo, store);
  tuner = std::make_unique<core::MeasuredTuner>(cfg, member, plans, *this);
  {
    const auto [intra, inter] = tuner->modelled_link_rates();
    engine->set_link_model(intra, inter);
  }
  compressor = std::make_unique<core::Compressor>(cfg, member, *tuner, plans, *this);
  if (device >= 0)
    staging = std::make_unique<core::DeviceStaging>(
        core::gpu_runtime(), device, "rank " + std::to_string(rank) + " of communicator '" + name + "'");
  BRAID_LOG(info, "communicator '" << name << "' rank " << rank << "/" << size << " ready (store namespace "
                                   << gen << ", timeout " << timeout.count() << " ms)");
}

Communicator::Impl::~Impl() {
  // Drain while the engine is still reachable (abort() from another thread may be
  // what unblocks this), then read whether anything failed, including during the drain.
  engine->drain();
  const bool failed = engine->failed();
  // Leave together: whoever hosts the store keeps it until every rank has left, so
  // that late ranks can still finish their set-up. Failed jobs do not wait long.
  try {
    if (failed && !hosts_store) {
      // The failure may have taken the store with it (its host stopped or died): count this
      // rank out on a thread of its own and wait for it a second at most, not the store's
      // I/O timeout.
      if (!within(store, [](Store& s) { s.add("exit", 1); }, std::chrono::seconds(1)))
        BRAID_LOG(warn, "communicator '" << name << "' leaving: the store did not answer within 1 s");
    } else {
      store->add("exit", 1);
    }
    // Of the communicators in this process that share the store (threads as ranks,
    // children), the last to go waits.
    if (hosts_store && hosted_server.use_count() <= 1) {
      const auto limit = std::chrono::steady_clock::now() +
                         (failed ? std::chrono::milliseconds(1000) : std::min(timeout, std::chrono::milliseconds(60000)));
      while (store->add("exit", 0) < size && std::chrono::steady_clock::now() < limit)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } catch (const std::exception& e) {
    BRAID_LOG(warn, "communicator '" << name << "' leaving: " << e.what());
  }
  engine.reset();  // stops the progress thread, closes connections
}

PlanRequest Communicator::Impl::request(Collective c, std::uint64_t count, std::size_t elem_size, ReduceOp op) const {
  PlanRequest req(c, size, count, elem_size, op);
  req.rank = rank;
  req.slice_bytes = cfg.chunk_bytes;
  return req;
}

namespace {
/// Set while a call on device buffers posts its operations on the device path
/// (Impl::device_call, BRAID_DEVICE_PATH=stream): Impl::post enqueues each one's program,
/// joined to t_program_stream, the caller's stream. Per thread: calls on other threads are
/// their own.
thread_local bool t_posting_program = false;
thread_local gpu::Stream t_program_stream = nullptr;
}  // namespace

Work Communicator::Impl::post(core::Posting p) {
  const char* what = p.what;
  BRAID_CHECK(p.timeout.count() >= 0, InvalidUsage, what << ": negative timeout");
  if (cfg.check_args && !p.internal) check_same_call(*p.plan, p.dtype, p.op, what, p.automatic);
  BRAID_CHECK(!engine->failed(), Aborted,
              what << " on rank " << rank << ": the communicator has failed earlier: " << engine->reason());
  core::Operation o;
  o.seq = next_seq++;
  o.plan = std::move(p.plan);
  o.input = p.in;
  o.output = p.out;
  o.dtype = p.dtype;
  o.op = p.op;
  o.scale = p.scale;
  o.timeout = p.timeout.count() > 0 ? clamp_timeout(p.timeout) : timeout;
  o.work = std::make_shared<detail::WorkState>();
  o.keepalive = std::move(p.keepalive);
  o.barrier = p.barrier;
  // Plain concatenation: this runs on every call, and a stream costs a microsecond.
  o.name.reserve(96);
  o.name.append(what).append(" #").append(std::to_string(o.seq)).append(" (");
  o.name.append(p.deferred ? "auto" : o.plan->name())
      .append(", ")
      .append(std::to_string(o.plan->request.count));
  o.deferred = std::move(p.deferred);
  o.feedback[0] = p.feedback[0];
  o.feedback[1] = p.feedback[1];
  o.codec_step = p.codec_step;
  const bool program = t_posting_program && !p.internal;  // the library's own calls (tuner trials) use host memory
  o.name.append(" x ").append(to_string(p.dtype)).append(", ").append(to_string(p.op)).append(") on rank ");
  o.name.append(std::to_string(rank)).append("/").append(std::to_string(size));
  Work w(o.work);
  if (p.state) *p.state = o.work;
  if (program) {
    // The whole program goes on the stream now; its plan is the one posted (device calls
    // are never deferred: Impl::collective). The engine gets the call once its slots and
    // words exist and before the program is enqueued: a free on another thread can hold up
    // the enqueue halfway, and the part already on the stream must find the engine moving
    // its messages, or the stream (and so the free) would wait forever.
    o.deferred.reset();
    const std::string op_name = o.name;
    const std::shared_ptr<const collectives::Plan> plan = o.plan;
    core::FlowCall call;
    call.input = o.input;
    call.output = o.output;
    call.dtype = o.dtype;
    call.op = o.op;
    call.scale = o.scale;
    call.feedback[0] = o.feedback[0];
    call.feedback[1] = o.feedback[1];
    call.codec_step = o.codec_step;
    call.name = &op_name;
    call.timeout = o.timeout;
    bool submitted = false;
    try {
      flow->enqueue(*plan, call, t_program_stream, [&](std::shared_ptr<core::FlowOp> f) {
        o.flow = std::move(f);
        submitted = true;
        engine->submit(std::move(o));
      });
    } catch (const Error& e) {
      // Part of it on the stream, or its peers left waiting for a call that timed out here
      // (pinned memory held by calls that did not finish): fail the communicator, so that
      // they hear why instead of timing out on a silent rank.
      if (submitted || e.code() == ErrorCode::Timeout) engine->abort(e.what());
      throw;
    }
    return w;
  }
  engine->submit(std::move(o));
  return w;
}

Work Communicator::Impl::post_task(std::function<void()> task, std::string what, std::shared_ptr<void> keepalive) {
  BRAID_CHECK(!engine->failed(), Aborted,
              what << " on rank " << rank << ": the communicator has failed earlier: " << engine->reason());
  core::Operation o;
  o.seq = next_seq++;
  o.task = std::move(task);
  o.timeout = timeout;
  o.work = std::make_shared<detail::WorkState>();
  o.keepalive = std::move(keepalive);
  o.name = what + " #" + std::to_string(o.seq) + " on rank " + std::to_string(rank) + "/" + std::to_string(size);
  Work w(o.work);
  engine->submit(std::move(o));
  return w;
}

void Communicator::Impl::check_same_call(const collectives::Plan& plan, DataType dtype, ReduceOp op,
                                         const char* what, bool automatic) {
  // Debug mode (BRAID_CHECK_ARGS): rank 0 compares every rank's call with its own and
  // publishes a verdict that all ranks act on, so that all fail together, naming the
  // rank that differs, instead of hanging in mismatched collectives.
  const std::uint64_t k = next_check++;
  std::ostringstream sig;
  sig << what << "(count=" << plan.request.count << ", type=" << to_string(dtype) << ", op=" << to_string(op);
  // Ranks that disagree about the root hang or run a different tree: part of the call.
  if (plan.request.collective == Collective::broadcast || plan.request.collective == Collective::reduce)
    sig << ", root=" << plan.request.root;
  // Every rank passes the same block sizes to these two (alltoallv's differ by rank).
  if ((plan.request.collective == Collective::allgatherv || plan.request.collective == Collective::reduce_scatter_v) &&
      plan.request.counts) {
    sig << ", counts=";
    for (const std::uint64_t x : *plan.request.counts) sig << x << ' ';
  }
  sig << ", algo=" << (automatic ? std::string_view("auto") : to_string(plan.request.algorithm)) << ")";
  const std::string base = "check/" + std::to_string(k) + "/";
  if (engine->failed()) {
    // Tell rank 0 instead of leaving it waiting for this rank's signature.
    store->set(base + std::to_string(rank), "nothing: rank " + std::to_string(rank) + " has failed (" +
                                                 engine->reason() + ")");
    return;  // post() reports the failure to the caller
  }
  store->set(base + std::to_string(rank), sig.str());
  auto get_or_explain = [&](const std::string& key, int who) {
    try {
      return store->get(key, timeout);
    } catch (const TimeoutError&) {
      throw Error(ErrorCode::Timeout, "BRAID_CHECK_ARGS on rank " + std::to_string(rank) + ": rank " +
                                          std::to_string(who) + " did not reach call #" + std::to_string(k) + " (" +
                                          sig.str() + ") within " + std::to_string(timeout.count()) + " ms");
    }
  };
  std::string verdict;
  if (rank == 0) {
    verdict = "ok";
    for (int r = 1; r < size && verdict == "ok"; ++r) {
      const std::string other = get_or_explain(base + std::to_string(r), r);
      if (other != sig.str())
        verdict = "call #" + std::to_string(k) + " differs between ranks: rank " + std::to_string(r) + " called " +
                  other + " but rank 0 called " + sig.str() +
                  "; every rank must issue the same collectives in the same order";
    }
    store->set(base + "verdict", verdict);
  } else {
    verdict = get_or_explain(base + "verdict", 0);
  }
  BRAID_CHECK(verdict == "ok", InvalidUsage, "BRAID_CHECK_ARGS on rank " << rank << ": " << verdict);
}

// ---------------------------------------------------------------------------------

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options)
    : impl_(std::make_unique<Impl>(std::move(store), rank, size, options)) {}

Communicator::Communicator(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

int Communicator::rank() const noexcept { return impl_->rank; }
int Communicator::size() const noexcept { return impl_->size; }

int Communicator::local_rank() const {
  return impl_->topology->layout().local_rank;
}

int Communicator::local_size() const {
  return impl_->topology->layout().local_size;
}

namespace {

/// Checks buffers against the collective's in-place convention (docs/api.md):
/// identical pointers mean in-place for allreduce, broadcast, reduce and alltoall;
/// allgather is in place when send == recv + rank*count; reduce_scatter when
/// recv == send + rank*count. Any other overlap is refused.
void check_layout(collectives::Collective c, const void* send, void* recv, std::uint64_t in_count,
                  std::uint64_t out_count, std::size_t es, std::uint64_t count, std::uint64_t own_block_at,
                  bool need_send, bool need_recv, bool same_layout, const char* what) {
  const std::uint64_t limit = (std::numeric_limits<std::size_t>::max() >> 2) / es;
  // `count` too: count * world may have wrapped around in the buffer sizes.
  BRAID_CHECK(in_count <= limit && out_count <= limit && count <= limit, InvalidUsage,
              what << ": " << std::max({in_count, out_count, count}) << " " << es
                   << "-byte elements overflow the address space");
  if (need_send && in_count > 0)
    BRAID_CHECK(send != nullptr, InvalidUsage, what << ": send buffer is null with " << in_count << " elements to send");
  if (need_recv && out_count > 0)
    BRAID_CHECK(recv != nullptr, InvalidUsage, what << ": recv buffer is null with " << out_count << " elements to receive");
  if (!send || !recv || !need_send || !need_recv || in_count == 0 || out_count == 0) return;
  const auto* s = static_cast<const std::byte*>(send);
  const auto* r = static_cast<const std::byte*>(recv);
  const std::size_t sb = in_count * es, rb = out_count * es;
  if (s + sb <= r || r + rb <= s) return;  // disjoint
  bool in_place = false;
  switch (c) {
    case collectives::Collective::allgather:
    case collectives::Collective::allgatherv:
    case collectives::Collective::gather: in_place = s == r + static_cast<std::size_t>(own_block_at) * es; break;
    case collectives::Collective::reduce_scatter:
    case collectives::Collective::reduce_scatter_v:
    case collectives::Collective::scatter: in_place = r == s + static_cast<std::size_t>(own_block_at) * es; break;
    case collectives::Collective::alltoallv:
      BRAID_CHECK(s != r || same_layout, InvalidUsage,
                  what << ": in place (send == recv) needs send_counts == recv_counts; use disjoint buffers");
      in_place = s == r;
      break;
    default: in_place = s == r; break;
  }
  BRAID_CHECK(in_place, InvalidUsage,
              what << ": send and recv buffers overlap without following the in-place convention (same pointer; "
                      "for allgather(v) and gather send == recv + the offset of this rank's block; for "
                      "reduce_scatter(_v) and scatter recv == send + that offset); "
                      "use disjoint buffers otherwise");
}

/// What every collective method hands Impl::collective from its arguments and the
/// options all collectives share; each method then adds what its options struct adds
/// (op, root, algorithm, deterministic).
core::CollectiveCall call_of(Collective c, const char* what, const void* send, void* recv, std::size_t count,
                             DataType dtype, const CollectiveOptions& options) {
  core::CollectiveCall call{c, what, send, recv, count, dtype};
  call.timeout = options.timeout;
  return call;
}

}  // namespace

Work Communicator::Impl::collective(const core::CollectiveCall& call) {
  const Collective c = call.collective;
  const char* what = call.what;
  const bool reduces = c == Collective::allreduce || c == Collective::reduce || c == Collective::reduce_scatter ||
                       c == Collective::reduce_scatter_v;
  check_dtype_op(call.dtype, reduces ? call.op : ReduceOp::sum, what);
  if (reduces && call.op == ReduceOp::premul_sum) check_premul_scale(call.dtype, call.scale, what);
  const bool rooted = c == Collective::broadcast || c == Collective::reduce || c == Collective::gather ||
                      c == Collective::scatter;
  if (rooted)
    BRAID_CHECK(call.root >= 0 && call.root < size, InvalidUsage,
                what << ": root " << call.root << " is outside [0, " << size << ")");
  BRAID_CHECK(static_cast<int>(call.algorithm) < kNumAlgorithms, InvalidUsage,
              what << ": unknown algorithm value " << static_cast<int>(call.algorithm));
  PlanRequest req = request(c, call.count, dtype_size(call.dtype), reduces ? call.op : ReduceOp::sum);
  // A device-path call pays per slice at the call (a copy, flags, a launch): device slices.
  if (t_posting_program) req.slice_bytes = cfg.device_chunk_bytes;
  req.root = call.root;
  req.deterministic = reduces && (call.deterministic || cfg.deterministic);
  req.counts = call.counts;  // the v-collectives' block sizes (null for the others)
  const auto counts = collectives::buffer_counts(req);
  // Broadcast and scatter read send only on the root; reduce and gather write recv only there.
  const bool need_send = !((c == Collective::broadcast || c == Collective::scatter) && rank != call.root);
  const bool need_recv = !((c == Collective::reduce || c == Collective::gather) && rank != call.root);
  std::uint64_t own_block_at = static_cast<std::uint64_t>(rank) * call.count;
  bool same_layout = true;
  if (collectives::is_v(c)) {
    // The size that decides inline running, and that names and meters the call: what this
    // rank holds at the larger end (the blocks themselves come from counts).
    req.count = std::max(counts.input, counts.output);
    if (c == Collective::alltoallv) {
      const auto n = static_cast<std::size_t>(size);
      same_layout = std::equal(call.counts->begin(), call.counts->begin() + static_cast<std::ptrdiff_t>(n),
                               call.counts->begin() + static_cast<std::ptrdiff_t>(n));
    } else {
      own_block_at = collectives::rank_blocks(req).at[static_cast<std::size_t>(rank)];
    }
  }
  check_layout(c, call.send, call.recv, counts.input, counts.output, req.elem_size, req.count, own_block_at, need_send,
               need_recv, same_layout, what);
  Algorithm algo = call.algorithm;
  if (algo == Algorithm::automatic && c == Collective::allreduce && cfg.algo != "auto") algo = *parse_algorithm(cfg.algo);
  // Rings and chains follow hosts, and hierarchical needs them (one store pass, once).
  if (size > 1) req.host_of = topology->host_of();
  core::MeasuredTuner::Pick pick;
  // A device-path call enqueues its program when it is issued: the model decides, at once.
  // The v-collectives have one algorithm each: nothing to choose or measure.
  if (collectives::is_v(c)) algo = collectives::algorithms_for(c).front();
  if (algo == Algorithm::automatic) pick = tuner->choose_algorithm(req, t_posting_program);
  req.algorithm = algo == Algorithm::automatic ? pick.algorithm : algo;
  core::Posting p;
  p.in = need_send ? call.send : nullptr;
  p.out = need_recv ? call.recv : nullptr;
  p.dtype = call.dtype;
  p.op = req.op;
  p.scale = call.scale;
  p.timeout = call.timeout;
  p.what = what;
  p.deferred = std::move(pick.deferred);
  p.automatic = algo == Algorithm::automatic;
  Work w;
  try {
    p.plan = plans.plan_for(req);
    w = post(std::move(p));
  } catch (const Error& e) {
    // The bucket's first call did not go out: neither will its trials.
    tuner->abandon_tuning(pick, e.what());
    throw;
  }
  tuner->measure(pick, req, call.dtype, call.timeout);
  return w;
}

core::CallBuffers Communicator::Impl::buffers_of(Collective c, const void* send, void* recv, std::size_t count,
                                                DataType dtype, int root,
                                                std::shared_ptr<const std::vector<std::uint64_t>> blocks) const {
  PlanRequest req(c, size, count, dtype_size(dtype), ReduceOp::sum);
  req.rank = rank;
  req.root = root;
  req.counts = std::move(blocks);
  const auto counts = collectives::buffer_counts(req);
  core::CallBuffers b{send, 0, recv, 0};
  if (__builtin_mul_overflow(counts.input, req.elem_size, &b.send_bytes) ||
      __builtin_mul_overflow(counts.output, req.elem_size, &b.recv_bytes))
    b.send_bytes = b.recv_bytes = 0;
  return b;
}

void Communicator::Impl::refuse_device_memory(const char* what) const {
  throw Error(ErrorCode::InvalidUsage, std::string(what) + ": memory = device, but this process has no device runtime (" +
                                           core::gpu_runtime().describe() + ")");
}

Work Communicator::Impl::device_call(const char* what, const core::CallBuffers& b, const CollectiveOptions& options,
                                     const std::function<Work(const void*, void*)>& host, core::Config::DevicePath path) {
  if (path == core::Config::DevicePath::stream) {
    // No copy, no gate, no host wait on the caller's stream: each operation the call posts
    // enqueues its program joined to options.stream (Impl::post, core::DeviceFlow).
    if (!flow)
      flow = std::make_shared<core::DeviceFlow>(core::gpu_runtime(), staging->device(),
                                                "rank " + std::to_string(rank) + " of communicator '" + name + "'",
                                                cfg.device_pinned_bytes);
    struct Flag {
      bool was_program = t_posting_program;
      gpu::Stream was_stream = t_program_stream;
      explicit Flag(gpu::Stream s) {
        t_posting_program = true;
        t_program_stream = s;
      }
      ~Flag() {
        t_posting_program = was_program;
        t_program_stream = was_stream;
      }
    } flag(options.stream);
    return host(b.send, b.recv);
  }
  auto post_gate = [&](std::shared_ptr<std::atomic<bool>> gate) {
    BRAID_CHECK(!engine->failed(), Aborted,
                what << " on rank " << rank << ": the communicator has failed earlier: " << engine->reason());
    core::Operation o;
    o.gate = std::move(gate);
    o.work = std::make_shared<detail::WorkState>();
    o.timeout = timeout;
    o.name = std::string(what) + " (device buffers: waiting for the stream to stage them) on rank " +
             std::to_string(rank) + "/" + std::to_string(size);
    engine->submit(std::move(o));
  };
  return staging->post(what, b, options.stream, post_gate, host, engine->waker(),
                       [this](const std::string& why) { engine->abort(why); });
}

Work Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                             const AllreduceOptions& options) {
  const auto buffers = [&] { return impl_->buffers_of(Collective::allreduce, send, recv, count, dtype, 0); };
  const auto spec = impl_->compressor->resolve_codec(options, count, dtype, op);
  const bool compressed = spec.kind != compression::CodecKind::none;
  // bf16/f16 with a codec go through f32 copies made by host tasks (Compressor), which only
  // the staged path can give them: the stream path stages such calls by itself.
  const bool half_codec = compressed && (dtype == DataType::bf16 || dtype == DataType::f16) &&
                          impl_->cfg.device_path == core::Config::DevicePath::stream;
  return impl_->device_or_host("allreduce", options, send, recv, buffers, [&](const void* s, void* r) {
    if (compressed)  // on the device path the codecs run on the GPU, and so do the residuals
      return impl_->compressor->allreduce(s, r, count, dtype, op, spec, options,
                                          t_posting_program ? impl_->staging->device() : -1);
    core::CollectiveCall call = call_of(Collective::allreduce, "allreduce", s, r, count, dtype, options);
    call.op = op;
    call.scale = options.scale;
    call.algorithm = options.algorithm;
    call.deterministic = options.deterministic;
    return impl_->collective(call);
  }, half_codec);
}

Work Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType dtype,
                             const BroadcastOptions& options) {
  const auto buffers = [&] { return impl_->buffers_of(Collective::broadcast, send, recv, count, dtype, options.root); };
  return impl_->device_or_host("broadcast", options, send, recv, buffers, [&](const void* s, void* r) {
    core::CollectiveCall call = call_of(Collective::broadcast, "broadcast", s, r, count, dtype, options);
    call.root = options.root;
    return impl_->collective(call);
  });
}

Work Communicator::reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                          const ReduceOptions& options) {
  const auto buffers = [&] { return impl_->buffers_of(Collective::reduce, send, recv, count, dtype, options.root); };
  return impl_->device_or_host("reduce", options, send, recv, buffers, [&](const void* s, void* r) {
    core::CollectiveCall call = call_of(Collective::reduce, "reduce", s, r, count, dtype, options);
    call.op = op;
    call.scale = options.scale;
    call.root = options.root;
    call.deterministic = options.deterministic;
    return impl_->collective(call);
  });
}

Work Communicator::allgather(const void* send, void* recv, std::size_t count, DataType dtype,
                             const AllgatherOptions& options) {
  const auto buffers = [&] { return impl_->buffers_of(Collective::allgather, send, recv, count, dtype, 0); };
  return impl_->device_or_host("allgather", options, send, recv, buffers, [&](const void* s, void* r) {
    return impl_->collective(call_of(Collective::allgather, "allgather", s, r, count, dtype, options));
  });
}

Work Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                                  const ReduceScatterOptions& options) {
  const auto buffers = [&] { return impl_->buffers_of(Collective::reduce_scatter, send, recv, count, dtype, 0); };
  return impl_->device_or_host("reduce_scatter", options, send, recv, buffers, [&](const void* s, void* r) {
    core::CollectiveCall call = call_of(Collective::reduce_scatter, "reduce_scatter", s, r, count, dtype, options);
    call.op = op;
    call.scale = options.scale;
    call.deterministic = options.deterministic;
    return impl_->collective(call);
  });
}

Work Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType dtype,
                            const AlltoallOptions& options) {
  const auto buffers = [&] { return impl_->buffers_of(Collective::alltoall, send, recv, count, dtype, 0); };
  return impl_->device_or_host("alltoall", options, send, recv, buffers, [&](const void* s, void* r) {
    return impl_->collective(call_of(Collective::alltoall, "alltoall", s, r, count, dtype, options));
  });
}

Work Communicator::gather(const void* send, void* recv, std::size_t count, DataType dtype,
                          const GatherOptions& options) {
  const auto buffers = [&] { return impl_->buffers_of(Collective::gather, send, recv, count, dtype, options.root); };
  return impl_->device_or_host("gather", options, send, recv, buffers, [&](const void* s, void* r) {
    core::CollectiveCall call = call_of(Collective::gather, "gather", s, r, count, dtype, options);
    call.root = options.root;
    return impl_->collective(call);
  });
}

Work Communicator::scatter(const void* send, void* recv, std::size_t count, DataType dtype,
                           const ScatterOptions& options) {
  const auto buffers = [&] { return impl_->buffers_of(Collective::scatter, send, recv, count, dtype, options.root); };
  return impl_->device_or_host("scatter", options, send, recv, buffers, [&](const void* s, void* r) {
    core::CollectiveCall call = call_of(Collective::scatter, "scatter", s, r, count, dtype, options);
    call.root = options.root;
    return impl_->collective(call);
  });
}

namespace {
/// The v-collectives' block sizes as a plan takes them: `parts` lists of size() counts
/// each, one after the other (alltoallv: what is sent, then what is received).
std::shared_ptr<const std::vector<std::uint64_t>> block_counts(
    std::initializer_list<const std::vector<std::size_t>*> parts, int size, const char* what) {
  auto v = std::make_shared<std::vector<std::uint64_t>>();
  for (const auto* p : parts) {
    BRAID_CHECK(p->size() == static_cast<std::size_t>(size), InvalidUsage,
                what << ": " << p->size() << " block counts for a communicator of " << size
                     << " ranks; pass one count per rank");
    std::uint64_t total = 0;
    for (const std::size_t x : *p)
      BRAID_CHECK(!__builtin_add_overflow(total, static_cast<std::uint64_t>(x), &total), InvalidUsage,
                  what << ": the block counts overflow");
    v->insert(v->end(), p->begin(), p->end());
  }
  return v;
}
}  // namespace

Work Communicator::allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DataType dtype,
                              const AllgatherOptions& options) {
  const auto blocks = block_counts({&counts}, impl_->size, "allgatherv");
  const auto buffers = [&] { return impl_->buffers_of(Collective::allgatherv, send, recv, 0, dtype, 0, blocks); };
  return impl_->device_or_host("allgatherv", options, send, recv, buffers, [&](const void* s, void* r) {
    core::CollectiveCall call = call_of(Collective::allgatherv, "allgatherv", s, r, 0, dtype, options);
    call.counts = blocks;
    return impl_->collective(call);
  });
}

Work Communicator::reduce_scatter_v(const void* send, void* recv, const std::vector<std::size_t>& counts,
                                    DataType dtype, ReduceOp op, const ReduceScatterOptions& options) {
  const auto blocks = block_counts({&counts}, impl_->size, "reduce_scatter_v");
  const auto buffers = [&] { return impl_->buffers_of(Collective::reduce_scatter_v, send, recv, 0, dtype, 0, blocks); };
  return impl_->device_or_host("reduce_scatter_v", options, send, recv, buffers, [&](const void* s, void* r) {
    core::CollectiveCall call = call_of(Collective::reduce_scatter_v, "reduce_scatter_v", s, r, 0, dtype, options);
    call.op = op;
    call.scale = options.scale;
    call.deterministic = options.deterministic;
    call.counts = blocks;
    return impl_->collective(call);
  });
}

Work Communicator::alltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                             const std::vector<std::size_t>& recv_counts, DataType dtype,
                             const AlltoallOptions& options) {
  const auto blocks = block_counts({&send_counts, &recv_counts}, impl_->size, "alltoallv");
  const auto me = static_cast<std::size_t>(impl_->rank);
  BRAID_CHECK(send_counts[me] == recv_counts[me], InvalidUsage,
              "alltoallv: rank " << me << " sends itself " << send_counts[me] << " elements but expects "
                                 << recv_counts[me] << " from itself; send_counts[rank] must equal recv_counts[rank]");
  const auto buffers = [&] { return impl_->buffers_of(Collective::alltoallv, send, recv, 0, dtype, 0, blocks); };
  return impl_->device_or_host("alltoallv", options, send, recv, buffers, [&](const void* s, void* r) {
    core::CollectiveCall call = call_of(Collective::alltoallv, "alltoallv", s, r, 0, dtype, options);
    call.counts = blocks;
    return impl_->collective(call);
  });
}

Work Communicator::barrier(const BarrierOptions& options) {
  auto buf = std::make_shared<std::array<std::int32_t, 2>>();
  PlanRequest req = impl_->request(Collective::allreduce, 1, 4, ReduceOp::sum);
  req.algorithm = Algorithm::ring;
  core::Posting p;
  p.plan = impl_->plans.plan_for(req);
  p.in = &(*buf)[0];
  p.out = &(*buf)[1];
  p.dtype = DataType::i32;
  p.timeout = options.timeout;
  p.what = "barrier";
  p.barrier = true;
  p.keepalive = std::move(buf);
  return impl_->post(std::move(p));
}

Work Communicator::Impl::p2p(bool is_send, const void* buf, std::size_t count, DataType dtype, int peer,
                             const P2POptions& options) {
  const char* what = is_send ? "send" : "recv";
  check_dtype_op(dtype, ReduceOp::sum, what);
  BRAID_CHECK(peer >= 0 && peer < size, InvalidUsage,
              what << ": peer " << peer << " is outside [0, " << size << ")");
  const std::size_t es = dtype_size(dtype);
  BRAID_CHECK(count <= (std::numeric_limits<std::size_t>::max() >> 2) / es, InvalidUsage,
              what << ": count " << count << " overflows the address space");
  BRAID_CHECK(count == 0 || buf != nullptr, InvalidUsage, what << ": buffer is null with count " << count);
  BRAID_CHECK(options.timeout.count() >= 0, InvalidUsage, what << ": negative timeout");
  BRAID_CHECK(!engine->failed(), Aborted,
              what << " on rank " << rank << ": the communicator has failed earlier: " << engine->reason());
  auto plan = std::make_shared<collectives::Plan>();
  plan->request.rank = rank;
  plan->request.world = size;
  plan->request.count = count;
  plan->request.elem_size = es;
  plan->phase_names = {is_send ? "send" : "recv"};
  const collectives::Region user{is_send ? collectives::Buffer::input : collectives::Buffer::output, 0, count};
  plan->add(is_send ? collectives::Step(collectives::StepKind::send, peer, user, {})
                    : collectives::Step(collectives::StepKind::recv, peer, {}, user));
  plan->seal();
  core::Operation o;
  o.seq = 0;
  o.plan = plan;
  o.input = is_send ? buf : nullptr;
  o.output = is_send ? nullptr : const_cast<void*>(buf);
  o.dtype = dtype;
  o.timeout = options.timeout.count() > 0 ? clamp_timeout(options.timeout) : timeout;
  o.work = std::make_shared<detail::WorkState>();
  o.p2p = true;
  // Messages carry the user tag (and a p2p marker) so that mismatched pairs are caught.
  o.tag_base = (1ull << 63) | (static_cast<std::uint64_t>(options.tag) << 24);
  o.p2p_seq = next_p2p++;
  // Appended, as the collectives' names are: an ostringstream's construction (its locale
  // facets) was a tenth of a 4 KiB send/recv exchange under perf.
  o.name.reserve(96);
  o.name.append(what).append(" #").append(std::to_string(o.p2p_seq)).append(" (").append(std::to_string(count));
  o.name.append(" x ").append(to_string(dtype)).append(", tag ").append(std::to_string(options.tag)).append(") ");
  o.name.append(is_send ? "to" : "from").append(" rank ").append(std::to_string(peer)).append(" on rank ");
  o.name.append(std::to_string(rank)).append("/").append(std::to_string(size));
  Work w(o.work);
  engine->submit(std::move(o));
  return w;
}

Work Communicator::Impl::post_p2p(bool is_send, void* buf, std::size_t bytes, int peer, std::uint32_t tag) {
  P2POptions o;
  o.tag = tag;
  return p2p(is_send, buf, bytes, DataType::u8, peer, o);
}

namespace {
/// Bytes of a point-to-point buffer (0 on overflow: the host path refuses the count).
std::size_t p2p_bytes(std::size_t count, DataType dtype) {
  std::size_t bytes = 0;
  return __builtin_mul_overflow(count, dtype_size(dtype), &bytes) ? 0 : bytes;
}
}  // namespace

Work Communicator::send(const void* buf, std::size_t count, DataType dtype, int peer, const P2POptions& options) {
  const auto buffers = [&] { return core::CallBuffers{buf, p2p_bytes(count, dtype), nullptr, 0}; };
  // Staged on every device path: point-to-point operations run beside each other (a
  // group) and are posted to the engine by p2p(), not as programs (docs/gpu.md).
  return impl_->device_or_host(
      "send", options, buf, nullptr, buffers,
      [&](const void* s, void*) { return impl_->p2p(true, s, count, dtype, peer, options); }, true);
}

Work Communicator::recv(void* buf, std::size_t count, DataType dtype, int peer, const P2POptions& options) {
  const auto buffers = [&] { return core::CallBuffers{nullptr, 0, buf, p2p_bytes(count, dtype)}; };
  // Staged like send: p2p() posts to the engine directly, which would write device memory
  // from the host, unordered with the stream.
  return impl_->device_or_host(
      "recv", options, nullptr, buf, buffers,
      [&](const void*, void* r) { return impl_->p2p(false, r, count, dtype, peer, options); }, true);
}

Communicator::LinkMeasurement Communicator::link_between_hosts() {
  const core::LinkFigures f = impl_->compressor->link_between_hosts();
  LinkMeasurement m;
  m.measured = f.a >= 0;
  m.rank_a = f.a;
  m.rank_b = f.b;
  m.latency_us = f.link.alpha_s * 1e6;
  m.bandwidth_gbps = f.link.Bps / 1e9;
  return m;
}

Communicator Communicator::split(int color, int key) { return impl_->split_impl(color, key); }

namespace core {
bool parse_split_record(const std::string& v, int* color, int* key) {
  const auto sp = v.find(' ');
  if (sp == std::string::npos) return false;
  std::int64_t c = 0, k = 0;
  if (!base::parse_int64(v.substr(0, sp), &c) || !base::parse_int64(v.substr(sp + 1), &k)) return false;
  if (c < 0 || c > std::numeric_limits<int>::max() || k < std::numeric_limits<int>::min() ||
      k > std::numeric_limits<int>::max())
    return false;
  *color = static_cast<int>(c);
  *key = static_cast<int>(k);
  return true;
}
}  // namespace core

Communicator Communicator::Impl::split_impl(int color, int key) {
  Impl& im = *this;
  BRAID_CHECK(color >= 0, InvalidUsage, "split: color must be >= 0, got " << color);
  BRAID_CHECK(!im.engine->failed(), Aborted, "split: the communicator has failed earlier: " << im.engine->reason());
  // Every rank publishes (color, key); each computes its group from all of them.
  // Like a collective, every rank must call split in the same order.
  const std::uint64_t k = im.next_split++;
  const std::string base = "split/" + std::to_string(k) + "/";
  im.store->set(base + std::to_string(im.rank), std::to_string(color) + " " + std::to_string(key));
  std::vector<std::tuple<int, int>> members;  // (key, old rank) of my color
  for (int r = 0; r < im.size; ++r) {
    const std::string v = im.store->get(base + std::to_string(r), im.timeout);
    int c = 0, kk = 0;
    BRAID_CHECK(core::parse_split_record(v, &c, &kk), Network,
                "split: rank " << r << "'s record in the store is malformed (" << v.size()
                               << " bytes, expected \"<color> <key>\"); is another program using this store?");
    if (c == color) members.emplace_back(kk, r);
  }
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (std::size_t i = 0; i < members.size(); ++i)
    if (std::get<1>(members[i]) == im.rank) new_rank = static_cast<int>(i);
  // The child is its parent's in everything but its members: the same deadline, slices,
  // host identity, transport and GPU (the parent's resolved device, not the splitting
  // thread's current one).
  const std::string sub = "split" + std::to_string(k);
  return im.make_child(sub, "." + sub + ".color" + std::to_string(color), new_rank, static_cast<int>(members.size()));
}

Communicator Communicator::Impl::make_child(const std::string& sub, const std::string& name_suffix, int child_rank,
                                            int child_size) const {
  CommOptions opt;
  opt.timeout = timeout;
  opt.name = name + name_suffix;
  opt.chunk_bytes = cfg.chunk_bytes;
  opt.host_id = topology->host_id();
  opt.transport = cfg.transport;
  opt.device = device;
  Communicator child(std::make_shared<PrefixStore>(sub, store), child_rank, child_size, opt);
  Impl& c = *child.impl_;
  // Where a newcomer finds it: its constructor set root_prefix to its namespace key
  // relative to its own base store, PrefixStore(sub, store).
  c.root_store = root_store;
  c.root_prefix = root_prefix + "/" + sub + "/" + c.root_prefix;
  c.root_name = root_name;
  // A store server this process hosts (the creator of a UniqueId) serves the child too:
  // `comm = comm.shrink()` destroys the parent, not the job's store.
  c.hosted_server = hosted_server;
  c.hosts_store = hosts_store;
  c.compressor->inherit_link(*compressor);  // the links between hosts are the parent's
  return child;
}

Communicator Communicator::shrink(const std::vector<int>& exclude) { return impl_->shrink_impl(exclude); }

Communicator Communicator::Impl::shrink_impl(const std::vector<int>& exclude) {
  for (int r : exclude)
    BRAID_CHECK(r >= 0 && r < size && r != rank, InvalidUsage,
                "shrink on rank " << rank << ": cannot exclude rank " << r
                                  << (r == rank ? " (itself: a rank that leaves does not call shrink)"
                                                : std::string(" (outside [0, ") + std::to_string(size) + "))"));
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t k = next_shrink++;
  // A rank of this host whose process is gone is known dead without waiting for the
  // timeout (a rank nobody blamed: two died at once, and the survivors blamed the first).
  const std::string host = topology->host_id();
  std::map<int, std::string> identities;
  const auto gone = [&](int r) {
    auto it = identities.find(r);
    if (it == identities.end()) {
      const std::string key = "proc/" + std::to_string(r);
      if (!store->check({key})) return false;
      it = identities.emplace(r, store->get(key, timeout)).first;
    }
    return core::process_gone(it->second, host);
  };
  const std::vector<int> members = core::agree_on_members(*store, k, rank, size, exclude, timeout, gone);
  const int new_rank =
      static_cast<int>(std::lower_bound(members.begin(), members.end(), rank) - members.begin());
  std::vector<int> left;
  for (int r = 0; r < size; ++r)
    if (!std::binary_search(members.begin(), members.end(), r)) left.push_back(r);
  BRAID_LOG(warn, "communicator '" << name << "' rank " << rank << ": shrinking " << size << " -> " << members.size()
                                   << " ranks (left out: " << (left.empty() ? "none" : core::format_ranks(left))
                                   << "), agreed in "
                                   << std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - t0)
                                          .count()
                                   << " ms; this rank is now " << new_rank);
  const std::string sub = "shrink" + std::to_string(k);
  Communicator child = make_child(sub, "." + sub, new_rank, static_cast<int>(members.size()));
  child.impl_->compressor->adopt_feedback(*compressor);
  return child;
}

namespace {
/// The store key under which a grow offers new rank `rank` its place: one per new rank, taken
/// (removed) by the newcomer that joins as that rank, so no later newcomer finds it stale.
std::string grow_offer_key(const std::string& root_name, int rank) {
  return "braid/grow/" + root_name + "/" + std::to_string(rank);
}
}  // namespace

Communicator Communicator::grow(int new_size) { return impl_->grow_impl(new_size); }

Communicator Communicator::Impl::grow_impl(int new_size) {
  BRAID_CHECK(new_size > size, InvalidUsage,
              "grow on rank " << rank << ": the new size " << new_size << " must exceed the current " << size);
  BRAID_CHECK(!engine->failed(), Aborted,
              "grow on rank " << rank << ": the communicator has failed (shrink it first): " << engine->reason());
  const std::uint64_t k = next_grow++;
  const std::string sub = "grow" + std::to_string(k), suffix = "." + sub, child_name = name + suffix;
  // The offers: where the grown communicator's namespace is, one for each newcomer's join().
  // Written by rank 0 before it joins (a newcomer waits for its own); a later grow replaces
  // one that no newcomer took.
  if (rank == 0)
    for (int r = size; r < new_size; ++r)
      root_store->set(grow_offer_key(root_name, r), std::to_string(size) + "\n" + std::to_string(new_size) + "\n" +
                                                        root_prefix + "/" + sub + "\n" + child_name);
  Communicator child = make_child(sub, suffix, rank, new_size);
  BRAID_LOG(warn, "communicator '" << name << "' rank " << rank << ": growing " << size << " -> " << new_size
                                   << " ranks ('" << child_name << "')");
  return child;
}

Communicator Communicator::join(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options) {
  BRAID_CHECK(store != nullptr, InvalidUsage, "join: store is null");
  const auto& cfg = core::Config::global();
  const auto timeout = options.timeout.count() > 0 ? options.timeout : cfg.timeout;
  const std::string root = options.name.empty() ? "braid" : options.name;
  BRAID_CHECK(rank >= 0 && rank < size, InvalidUsage, "join: rank " << rank << " is outside [0, " << size << ")");
  const std::string key = grow_offer_key(root, rank);
  const std::string offer = store->get(key, timeout);
  const std::vector<std::string> f = base::split(offer, '\n');
  std::int64_t old_size = 0, new_size = 0;
  BRAID_CHECK(f.size() == 4 && base::parse_int64(f[0], &old_size) && base::parse_int64(f[1], &new_size), Network,
              "join: the store's grow offer for '" << root << "' is malformed; is another program using this store?");
  BRAID_CHECK(size == new_size && rank >= old_size && rank < new_size, InvalidUsage,
              "join: communicator '" << root << "' grows from " << old_size << " to " << new_size
                                     << " ranks: a newcomer joins as one of ranks " << old_size << ".." << new_size - 1
                                     << " of " << new_size << ", not rank " << rank << " of " << size);
  // Taken: a second newcomer for this rank, or a later one, waits for the next grow's offer.
  BRAID_CHECK(store->remove(key), InvalidUsage,
              "join: another process took the offer of rank " << rank << " of '" << root << "' first");
  CommOptions opt = options;
  opt.name = f[3];
  opt.timeout = timeout;
  Communicator c(std::make_shared<PrefixStore>(f[2], store), rank, size, opt);
  c.impl_->root_store = store;
  c.impl_->root_prefix = f[2] + "/" + c.impl_->root_prefix;
  c.impl_->root_name = root;
  return c;
}

std::string Communicator::explain_allreduce(std::size_t count, DataType dtype, ReduceOp op, bool deterministic) const {
  Impl& im = *impl_;
  check_dtype_op(dtype, op, "explain_allreduce");
  PlanRequest req = im.request(Collective::allreduce, count, dtype_size(dtype), op);
  req.deterministic = deterministic || im.cfg.deterministic;
  const std::string bytes = collectives::format_bytes(static_cast<double>(count * req.elem_size));
  if (im.cfg.algo != "auto")
    return "allreduce " + bytes + ": BRAID_ALGO=" + im.cfg.algo + " forces " +
           std::string(to_string(*parse_algorithm(im.cfg.algo)));
  if (im.size == 1) return "allreduce " + bytes + " x 1 rank: ring (a local copy)";
  return im.tuner->explain(req);
}

// --- error feedback: public API ---

void Communicator::save_error_feedback(std::ostream& os) const { impl_->compressor->save_feedback(os, {}); }
void Communicator::restore_error_feedback(std::istream& is) { impl_->compressor->restore_feedback(is, {}); }
void Communicator::save_error_feedback(std::ostream& os, const std::string& key_prefix) const {
  impl_->compressor->save_feedback(os, key_prefix);
}
void Communicator::restore_error_feedback(std::istream& is, const std::string& key_prefix) {
  impl_->compressor->restore_feedback(is, key_prefix);
}
void Communicator::reset_error_feedback(const std::string& ef_key) { impl_->compressor->reset_feedback(ef_key); }
std::size_t Communicator::error_feedback_bytes() const { return impl_->compressor->feedback_bytes(); }

std::string Communicator::dump_trace() const {
  return impl_->engine->dump_trace("dump_trace()", std::chrono::seconds(10));
}

Metrics Communicator::metrics() const { return impl_->engine->metrics(); }

std::string Communicator::describe_topology() const {
  Impl& im = *impl_;
  const core::Layout& l = im.topology->layout();
  std::ostringstream os;
  os << "communicator '" << im.name << "': " << im.size << " ranks on " << l.hosts() << " host(s)\n";
  for (int h = 0; h < l.hosts(); ++h) {
    os << "  host " << h << " (" << l.host_names[static_cast<std::size_t>(h)] << "): ranks";
    for (int r : l.ranks_of_host[static_cast<std::size_t>(h)]) os << " " << r;
    os << "\n";
    for (int r : l.ranks_of_host[static_cast<std::size_t>(h)]) {
      const std::string g = im.topology->gpu_of(r);
      if (!g.empty()) os << "    rank " << r << " uses " << g << "\n";
    }
  }
  os << "  RDMA devices of rank " << im.rank << "'s host: " << rdma_status() << "\n";
  // This rank's host: its NICs, each one's PCI distance from this rank's GPU, and which
  // of this process's GPUs can map each other's memory.
  gpu::Runtime& rt = core::gpu_runtime();
  const std::string my_pci = im.device >= 0 ? rt.pci_bus_id(im.device) : "";
  os << "  hardware of rank " << im.rank << "'s host:\n" << core::describe_host_hardware(my_pci, "    ");
  if (rt.device_count() > 1) {
    os << "    GPU peer access (this process's devices):";
    for (int a = 0; a < rt.device_count(); ++a)
      for (int b = a + 1; b < rt.device_count(); ++b)
        os << " " << a << "<->" << b << "=" << (rt.can_access_peer(a, b) && rt.can_access_peer(b, a) ? "yes" : "no");
    os << "\n";
  }
  if (im.device >= 0) os << gpu::describe_nvlink(gpu::query_nvlink(im.cfg.nvml_library), "    ");
  // The engine's router: in auto mode it knows which transports could not be made here.
  const core::Router& router = im.engine->router();
  os << "transport per pair (BRAID_TRANSPORT=" << im.cfg.transport << "):\n";
  for (int a = 0; a < im.size; ++a) {
    os << "  rank " << a << ":";
    for (int b = 0; b < im.size; ++b) {
      if (a == b) continue;
      const bool same = l.host_of[static_cast<std::size_t>(a)] == l.host_of[static_cast<std::size_t>(b)];
      const bool rdma = !same && im.topology->has_rdma(a) && im.topology->has_rdma(b);
      os << " " << b << "=" << router.entries()[router.choose({a, b, same, rdma})]->name;
    }
    os << "\n";
  }
  return os.str();
}

void Communicator::abort() noexcept {
  if (impl_) impl_->engine->abort("abort() called on rank " + std::to_string(impl_->rank));
}

void Communicator::revoke() noexcept {
  if (!impl_) return;
  // First the record that this rank is alive and revoked (its peers will blame it when its
  // connections close): the survivors' shrink then waits for it rather than leaving it out.
  const std::string key = core::revoked_key(impl_->rank);
  (void)within(impl_->store, [key](Store& s) { s.set(key, "1"); }, std::chrono::seconds(1));
  impl_->engine->abort("revoke() called on rank " + std::to_string(impl_->rank));
}

bool Communicator::failed() const noexcept { return impl_ && impl_->engine->failed(); }

}  // namespace braid
