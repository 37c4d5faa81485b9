// Private state of braid::Communicator, shared by communicator.cpp and bootstrap.cpp.
// Impl is the façade's back end: it checks calls, builds their plan requests and posts
// operations to the engine. Everything else is a part with one job and its own lock:
// the engine (runs operations), core::PlanCache (plans by request), core::MeasuredTuner
// (the algorithm of automatic calls) and core::Compressor (compressed all-reduce and its
// state). The parts issue their own operations through core::Poster, which Impl
// implements.
#pragma once

#include <braid/communicator.hpp>

#include "collectives/plan.hpp"
#include "core/comm_parts.hpp"
#include "core/compressor.hpp"
#include "core/config.hpp"
#include "core/device_flow.hpp"
#include "core/device_staging.hpp"
#include "core/engine.hpp"
#include "core/measured_tuner.hpp"
#include "core/plan_cache.hpp"
#include "core/topology.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace braid {

namespace core {
/// One collective as the façade's methods hand it to Communicator::Impl::collective,
/// built from their arguments and their options struct.
struct CollectiveCall {
  collectives::Collective collective = collectives::Collective::allreduce;
  const char* what = "";  ///< the method's name, in errors and logs
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;                 ///< reducing collectives only
  double scale = 1.0;                          ///< premul_sum's factor
  /// The v-collectives' block sizes (collectives::PlanRequest::counts), checked.
  std::shared_ptr<const std::vector<std::uint64_t>> counts;
  int root = 0;                                ///< broadcast, reduce, gather, scatter
  Algorithm algorithm = Algorithm::automatic;  ///< what the caller asked for
  bool deterministic = false;
  std::chrono::milliseconds timeout{0};  ///< 0: the communicator's
};
}  // namespace core

struct Communicator::Impl final : core::Poster {
  // --- what this communicator is, fixed at construction ---
  core::Config cfg;  ///< the process's configuration with CommOptions applied
  std::string name;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  int device = -1;  ///< the GPU of device buffers (-1: no device runtime)
  std::shared_ptr<Store> base_store;  ///< what the caller gave (kept alive)
  std::shared_ptr<Store> store;       ///< this communicator's namespace in it
  /// Where a newcomer finds this communicator (grow/join): the store the job began with
  /// (a child's base_store is a PrefixStore over its parent's namespace), the key prefix of
  /// `store` in it, and the name the job began with.
  std::shared_ptr<Store> root_store;
  std::string root_prefix;
  std::string root_name;
  /// A store server this process hosts for the job (rank 0 from the environment,
  /// or the creator of a UniqueId); kept until every rank has left.
  std::shared_ptr<TcpStoreServer> hosted_server;  ///< shared with children (split, shrink, grow)
  bool hosts_store = false;
  /// Which host each rank is on (this rank's identity: CommOptions::host_id, BRAID_HOST_ID
  /// or hostname + boot id); asked by the engine's router, the tuner and compression.
  std::shared_ptr<core::Topology> topology;

  // --- its parts, each with one job and its own lock ---
  std::unique_ptr<core::Engine> engine;  ///< runs operations (progress thread, transports)
  core::PlanCache plans{cfg.plan_cache};
  std::unique_ptr<core::MeasuredTuner> tuner;    ///< the algorithm of automatic calls
  std::unique_ptr<core::Compressor> compressor;  ///< codecs, error feedback, compressed all-reduce
  /// Device buffers: staged through pinned memory, stream-ordered (null without a device runtime).
  std::unique_ptr<core::DeviceStaging> staging;
  /// This rank's place among the ranks of this process on its device (core::DeviceFlow).
  std::unique_ptr<core::DeviceSeat> seat;
  /// The device path's programs (core::DeviceFlow): made at the first device call.
  std::shared_ptr<core::DeviceFlow> flow;

  // --- calls so far: every rank counts alike, since every rank calls in the same order ---
  std::atomic<std::uint64_t> next_seq{1};
  std::atomic<std::uint64_t> next_p2p{1};
  std::atomic<std::uint64_t> next_split{0};
  std::atomic<std::uint64_t> next_shrink{0};
  std::atomic<std::uint64_t> next_grow{0};
  std::atomic<std::uint64_t> next_check{0};

  /// `address_hint`: where the bootstrap store lives, used as the master address when
  /// the configuration has none (from_unique_id), so TCP binds the interface that
  /// reaches it. `given_token`: the job's secret when the caller has one that reached
  /// every rank privately (a UniqueId's nonce) and BRAID_AUTH_TOKEN is unset: it is then
  /// the transports' token and never written to the store (core/job_secret.hpp).
  Impl(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options,
       const std::string& address_hint = {}, const std::string& given_token = {});
  ~Impl() override;

  // --- the façade's calls ---
  /// Checks the call, picks its algorithm (the tuner, for automatic) and posts its plan.
  Work collective(const core::CollectiveCall& call);
  /// The bytes of `send` and `recv` that collective `c` reads and writes on this rank
  /// (zero where it does not touch a buffer, or where the count overflows: the host
  /// path then refuses the call).
  core::CallBuffers buffers_of(collectives::Collective c, const void* send, void* recv, std::size_t count,
                               DataType dtype, int root,
                               std::shared_ptr<const std::vector<std::uint64_t>> blocks = nullptr) const;
  /// Runs host(send, recv) for host buffers; for device buffers (`buffers()` says how many
  /// bytes of each the call touches), runs it on pinned copies through `staging`, joined
  /// to options.stream (core/device_staging.hpp). Without a device runtime this is one
  /// test and a direct call: the host path pays nothing for the device path.
  template <class Buffers, class Host>
  Work device_or_host(const char* what, const CollectiveOptions& options, const void* send, void* recv,
                      const Buffers& buffers, const Host& host, bool staged_only = false) {
    if (!staging) {
      if (options.memory == MemoryKind::device) refuse_device_memory(what);
      return host(send, recv);
    }
    const core::CallBuffers b = buffers();
    if (!staging->on_device(what, b, options.memory, options.stream)) return host(send, recv);
    return device_call(what, b, options, host, staged_only ? core::Config::DevicePath::staged : cfg.device_path);
  }
  [[noreturn]] void refuse_device_memory(const char* what) const;
  /// The device path of device_or_host, by `path` (BRAID_DEVICE_PATH): stream, the call's
  /// operations enqueue their programs on the communicator's stream (core::DeviceFlow) as
  /// they are posted; direct, they run on the device buffers driven by the engine; staged,
  /// on pinned copies.
  Work device_call(const char* what, const core::CallBuffers& b, const CollectiveOptions& options,
                   const std::function<Work(const void*, void*)>& host, core::Config::DevicePath path);
  Work p2p(bool is_send, const void* buf, std::size_t count, DataType dtype, int peer, const P2POptions& options);
  /// Communicator::split (store-only, collective in call order).
  Communicator split_impl(int color, int key);
  Communicator shrink_impl(const std::vector<int>& exclude);
  Communicator grow_impl(int new_size);
  /// A child (split, shrink, grow) as `child_rank` of `child_size`, in namespace `sub` of
  /// this one's store: this one's options (deadline, slices, host identity, transport, its
  /// resolved GPU), named name + name_suffix, and its place for newcomers and hosted store.
  Communicator make_child(const std::string& sub, const std::string& name_suffix, int child_rank,
                          int child_size) const;

  // --- core::Poster: how the façade and the parts issue operations ---
  collectives::PlanRequest request(collectives::Collective c, std::uint64_t count, std::size_t elem_size,
                                   ReduceOp op) const override;
  Work post(core::Posting p) override;
  Work post_p2p(bool is_send, void* buf, std::size_t bytes, int peer, std::uint32_t tag) override;
  Work post_task(std::function<void()> task, std::string name, std::shared_ptr<void> keepalive) override;
  /// BRAID_CHECK_ARGS: every rank's call agrees with rank 0's, or all fail together.
  void check_same_call(const collectives::Plan& plan, DataType dtype, ReduceOp op, const char* what, bool automatic);
};

namespace core {
/// A rank's split record ("<color> <key>", decimal) as read from the store: untrusted.
bool parse_split_record(const std::string& v, int* color, int* key);
}  // namespace core

}  // namespace braid
