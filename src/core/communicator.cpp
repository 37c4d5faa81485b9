// braid::Communicator: argument checking, plan selection and caching, and the hand-off
// to the engine. Bootstrapping from the environment and UniqueIds is in bootstrap.cpp.
#include "core/communicator_impl.hpp"

#include "core/check.hpp"
#include "core/logging.hpp"

#include <braid/error.hpp>
#include <braid/info.hpp>

#include <unistd.h>

#include <array>

#include <cstdint>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

namespace braid {

namespace {

using collectives::Collective;
using collectives::PlanRequest;

std::uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

std::string hex(std::uint64_t v) {
  std::ostringstream os;
  os << std::hex << v;
  return os.str();
}

/// Host identity: BRAID_HOST_ID, else hostname + boot id (two containers on one
/// machine share a boot id but not a hostname; two machines never share both).
std::string host_identity(const core::Config& cfg) {
  if (!cfg.host_id.empty()) return cfg.host_id;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot;
}

void check_dtype_op(DataType dtype, ReduceOp op, const char* what) {
  BRAID_CHECK(static_cast<unsigned>(dtype) < static_cast<unsigned>(kNumDataTypes), InvalidUsage,
              what << ": unknown data type value " << static_cast<int>(dtype)
                   << " (use braid::DataType: f32 f64 f16 bf16 i8 u8 i32 i64)");
  BRAID_CHECK(static_cast<unsigned>(op) < static_cast<unsigned>(kNumReduceOps), InvalidUsage,
              what << ": unknown reduce op value " << static_cast<int>(op)
                   << " (use braid::ReduceOp: sum prod min max avg)");
}

void check_buffers(const void* send, void* recv, std::size_t count, DataType dtype, const char* what) {
  const std::size_t es = dtype_size(dtype);
  BRAID_CHECK(count <= (std::numeric_limits<std::size_t>::max() >> 2) / es, InvalidUsage,
              what << ": count " << count << " x " << es << "-byte elements overflows the address space");
  if (count == 0) return;
  BRAID_CHECK(send != nullptr, InvalidUsage, what << ": send buffer is null with count " << count);
  BRAID_CHECK(recv != nullptr, InvalidUsage, what << ": recv buffer is null with count " << count);
  const auto* s = static_cast<const std::byte*>(send);
  const auto* r = static_cast<const std::byte*>(recv);
  const std::size_t bytes = count * es;
  BRAID_CHECK(s == r || s + bytes <= r || r + bytes <= s, InvalidUsage,
              what << ": send and recv buffers overlap without being identical; pass the same pointer "
                      "for in-place operation or use disjoint buffers");
}

/// Timeouts beyond a year are treated as "a year": far enough for any job, and
/// deadline arithmetic cannot overflow.
std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds t) {
  return std::min<std::chrono::milliseconds>(t, std::chrono::hours(24 * 365));
}

[[noreturn]] void unsupported(const char* what) {
  throw Error(ErrorCode::Unsupported,
              std::string(what) + " is not implemented in braid " + version() +
                  " yet (this version implements allreduce and barrier on host memory)");
}

}  // namespace

Communicator::Impl::Impl(std::shared_ptr<Store> base, int r, int n, const CommOptions& options)
    : cfg(core::Config::global()), rank(r), size(n), base_store(std::move(base)) {
  BRAID_CHECK(base_store != nullptr, InvalidUsage, "Communicator: store is null");
  BRAID_CHECK(n >= 1, InvalidUsage, "Communicator: size must be at least 1, got " << n);
  BRAID_CHECK(r >= 0 && r < n, InvalidUsage, "Communicator: rank " << r << " is outside [0, " << n << ")");
  BRAID_CHECK(options.timeout.count() >= 0, InvalidUsage, "Communicator: negative timeout");
  name = options.name.empty() ? "braid" : options.name;
  BRAID_CHECK(options.chunk_bytes == 0 || options.chunk_bytes >= 4096, InvalidUsage,
              "CommOptions::chunk_bytes " << options.chunk_bytes << " is too small: use 0 (BRAID_CHUNK_BYTES) or >= 4096");
  if (options.chunk_bytes > 0) cfg.chunk_bytes = options.chunk_bytes;
  timeout = clamp_timeout(options.timeout.count() > 0 ? options.timeout : cfg.timeout);
  if (cfg.algo != "auto" && cfg.algo != "ring") {
    const auto a = parse_algorithm(cfg.algo);
    BRAID_CHECK(a.has_value(), InvalidUsage,
                "BRAID_ALGO='" << cfg.algo << "' is not an algorithm: use auto, ring, tree, rhd or hier");
  }
  BRAID_CHECK(cfg.codec == "none" || cfg.codec.empty(), Unsupported,
              "BRAID_CODEC='" << cfg.codec << "': compression is not implemented in this version; unset it");

  // The k-th communicator of this name and size that each rank creates on a store
  // gets namespace k: every rank counts its own creations, so all agree without
  // talking. Two different groups that share a store and a name would collide;
  // every rank claims its seat, so that is an error rather than a silent mix-up.
  const std::string family = name + "/" + std::to_string(size);
  const std::int64_t gen = base_store->add("braid/gen/" + family + "/" + std::to_string(rank), 1);
  store = std::make_shared<PrefixStore>("braid/" + family + "/" + std::to_string(gen), base_store);
  BRAID_CHECK(store->add("seat/" + std::to_string(rank), 1) == 1, InvalidUsage,
              "Communicator '" << name << "': rank " << rank << " of " << size
                               << " is already taken in this store; two groups share the store under one name. "
                                  "Give each group its own CommOptions::name or its own PrefixStore");

  // Rank 0 picks the job's secret and communicator id; everyone else reads them.
  std::string token = cfg.auth_token;
  std::uint64_t comm_id = 0;
  if (rank == 0) {
    comm_id = random_u64();
    if (token.empty()) token = hex(random_u64()) + hex(random_u64());
    store->set("meta", hex(comm_id) + "\n" + token);
  } else {
    const std::string meta = store->get("meta", timeout);
    const auto nl = meta.find('\n');
    BRAID_CHECK(nl != std::string::npos, Network, "malformed communicator metadata in the store");
    comm_id = std::stoull(meta.substr(0, nl), nullptr, 16);
    if (token.empty()) token = meta.substr(nl + 1);
  }
  store->set("host/" + std::to_string(rank), host_identity(cfg));

  core::EngineOptions eo;
  eo.rank = rank;
  eo.size = size;
  eo.comm_name = name;
  eo.spin_us = cfg.spin_us;
  if (eo.spin_us < 0) {
    // Spinning only pays when every rank of this host has cores to spare; with more
    // ranks than cores a spinning rank takes the core its peer needs to answer.
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    const int local = cfg.local_size.value_or(cfg.world_size.value_or(size));
    eo.spin_us = (cpus > 0 && 2L * local <= cpus) ? 50 : 0;
  }
  eo.sockets_per_peer = cfg.sockets_per_peer;
  eo.ifname = cfg.socket_ifname;
  eo.master_addr = cfg.master_addr;
  eo.socket_buffer = cfg.socket_buffer;
  eo.auth_token = token;
  eo.comm_id = comm_id;
  eo.connect_timeout = timeout;
  eo.transport_mode = cfg.transport;
  eo.host_id = host_identity(cfg);
  engine = std::make_unique<core::Engine>(eo, store);
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
    store->add("exit", 1);
    if (hosts_store) {
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

std::shared_ptr<const collectives::Plan> Communicator::Impl::plan_for(const PlanRequest& req) {
  const auto key = std::make_tuple(static_cast<int>(req.collective), static_cast<int>(req.algorithm), req.count,
                                   req.elem_size, static_cast<int>(req.op == ReduceOp::avg));
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  auto plan = collectives::build_plan(req);
  if (cfg.plan_cache > 0) {
    if (plans.size() >= cfg.plan_cache) {
      plans.erase(plan_order.front());
      plan_order.pop_front();
    }
    plans.emplace(key, plan);
    plan_order.push_back(key);
  }
  return plan;
}

Work Communicator::Impl::post(std::shared_ptr<const collectives::Plan> plan, const void* in, void* out,
                              DataType dtype, ReduceOp op, std::chrono::milliseconds call_timeout,
                              const char* what, std::shared_ptr<void> keepalive) {
  BRAID_CHECK(call_timeout.count() >= 0, InvalidUsage, what << ": negative timeout");
  if (cfg.check_args) check_same_call(*plan, dtype, op, what);
  BRAID_CHECK(!engine->failed(), Aborted,
              what << " on rank " << rank << ": the communicator has failed earlier: " << engine->reason());
  core::Operation o;
  o.seq = next_seq++;
  o.plan = std::move(plan);
  o.input = in;
  o.output = out;
  o.dtype = dtype;
  o.op = op;
  o.timeout = call_timeout.count() > 0 ? clamp_timeout(call_timeout) : timeout;
  o.work = std::make_shared<detail::WorkState>();
  o.keepalive = std::move(keepalive);
  std::ostringstream os;
  os << what << " #" << o.seq << " (" << to_string(o.plan->request.algorithm) << ", " << o.plan->request.count
     << " x " << to_string(dtype) << ", " << to_string(op) << ") on rank " << rank << "/" << size;
  o.name = os.str();
  Work w(o.work);
  engine->submit(std::move(o));
  return w;
}

void Communicator::Impl::check_same_call(const collectives::Plan& plan, DataType dtype, ReduceOp op,
                                         const char* what) {
  // Debug mode (BRAID_CHECK_ARGS): rank 0 compares every rank's call with its own and
  // publishes a verdict that all ranks act on, so that all fail together, naming the
  // rank that differs, instead of hanging in mismatched collectives.
  const std::uint64_t k = next_check++;
  std::ostringstream sig;
  sig << what << "(count=" << plan.request.count << ", type=" << to_string(dtype) << ", op=" << to_string(op)
      << ", algo=" << to_string(plan.request.algorithm) << ")";
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

std::pair<int, int> Communicator::Impl::compute_locality() const {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (locality) return *locality;
  }
  // Store reads happen outside the lock so that collectives issued meanwhile from
  // other threads are not held up.
  const std::string mine = host_identity(cfg);
  int local_rank = 0, local_size = 0;
  for (int r = 0; r < size; ++r) {
    const std::string h = r == rank ? mine : store->get("host/" + std::to_string(r), timeout);
    if (h == mine) {
      if (r < rank) ++local_rank;
      ++local_size;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  locality = std::make_pair(local_rank, local_size);
  return *locality;
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
  return impl_->compute_locality().first;
}

int Communicator::local_size() const {
  return impl_->compute_locality().second;
}

Work Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                             const AllreduceOptions& options) {
  check_dtype_op(dtype, op, "allreduce");
  check_buffers(send, recv, count, dtype, "allreduce");
  BRAID_CHECK(options.codec.empty() || options.codec == "none", Unsupported,
              "allreduce: codec '" << options.codec << "' requested, but compression is not implemented in this "
                                   << "version; pass an empty codec or \"none\"");
  BRAID_CHECK(options.algorithm <= Algorithm::hierarchical, InvalidUsage,
              "allreduce: unknown algorithm value " << static_cast<int>(options.algorithm));
  Algorithm algo = options.algorithm;
  if (algo == Algorithm::automatic && impl_->cfg.algo != "auto") algo = *parse_algorithm(impl_->cfg.algo);
  PlanRequest req;
  req.collective = Collective::allreduce;
  req.algorithm = algo;
  req.rank = impl_->rank;
  req.world = impl_->size;
  req.count = count;
  req.elem_size = dtype_size(dtype);
  req.op = op;
  req.slice_bytes = impl_->cfg.chunk_bytes;
  return impl_->post(impl_->plan_for(req), send, recv, dtype, op, options.timeout, "allreduce", nullptr);
}

Work Communicator::barrier(const BarrierOptions& options) {
  auto buf = std::make_shared<std::array<std::int32_t, 2>>();
  PlanRequest req;
  req.collective = Collective::allreduce;
  req.algorithm = Algorithm::ring;
  req.rank = impl_->rank;
  req.world = impl_->size;
  req.count = 1;
  req.elem_size = 4;
  req.op = ReduceOp::sum;
  req.slice_bytes = impl_->cfg.chunk_bytes;
  return impl_->post(impl_->plan_for(req), &(*buf)[0], &(*buf)[1], DataType::i32, ReduceOp::sum, options.timeout,
                     "barrier", buf);
}

Work Communicator::broadcast(const void*, void*, std::size_t, DataType, const BroadcastOptions&) {
  unsupported("broadcast");
}
Work Communicator::reduce(const void*, void*, std::size_t, DataType, ReduceOp, const ReduceOptions&) {
  unsupported("reduce");
}
Work Communicator::allgather(const void*, void*, std::size_t, DataType, const AllgatherOptions&) {
  unsupported("allgather");
}
Work Communicator::reduce_scatter(const void*, void*, std::size_t, DataType, ReduceOp, const ReduceScatterOptions&) {
  unsupported("reduce_scatter");
}
Work Communicator::alltoall(const void*, void*, std::size_t, DataType, const AlltoallOptions&) {
  unsupported("alltoall");
}
Work Communicator::send(const void*, std::size_t, DataType, int, const P2POptions&) { unsupported("send"); }
Work Communicator::recv(void*, std::size_t, DataType, int, const P2POptions&) { unsupported("recv"); }
Communicator Communicator::split(int, int) { unsupported("split"); }

void Communicator::abort() noexcept {
  if (impl_) impl_->engine->abort("abort() called on rank " + std::to_string(impl_->rank));
}

bool Communicator::failed() const noexcept { return impl_ && impl_->engine->failed(); }

}  // namespace braid
