// Private state of braid::Communicator, shared by communicator.cpp and bootstrap.cpp.
#pragma once

#include <braid/communicator.hpp>

#include "collectives/plan.hpp"
#include "collectives/tuner.hpp"
#include "compression/choose.hpp"
#include "compression/codec.hpp"
#include "compression/error_feedback.hpp"
#include "core/config.hpp"
#include "core/engine.hpp"
#include "core/plan_cache.hpp"
#include "core/topology.hpp"

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

namespace braid {

namespace core {
/// A plan slot filled after the operation was issued (the measuring tuner's verdict).
using DeferredPlan = std::shared_ptr<std::shared_ptr<const collectives::Plan>>;
/// How Communicator::Impl::post() treats an operation beyond its plan and buffers.
struct PostHints {
  DeferredPlan deferred;   ///< plan decided later (the measuring tuner's verdict)
  bool automatic = false;  ///< the caller asked for Algorithm::automatic: BRAID_CHECK_ARGS signs "auto"
  bool internal = false;   ///< the library's own call (tuner trials, exchange): not argument-checked
  /// Compressed plans: error-feedback residuals and the RNG's step (core::Operation).
  float* feedback[2] = {nullptr, nullptr};
  std::uint64_t codec_step = 0;
};
}  // namespace core

struct Communicator::Impl {
  core::Config cfg;
  std::string name;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<Store> base_store;  ///< what the caller gave (kept alive)
  std::shared_ptr<Store> store;       ///< this communicator's namespace in it
  std::unique_ptr<core::Engine> engine;
  std::atomic<std::uint64_t> next_seq{1};

  /// A store server this process hosts for the job (rank 0 from the environment,
  /// or the creator of a UniqueId); kept until every rank has left.
  std::unique_ptr<TcpStoreServer> hosted_server;
  bool hosts_store = false;

  mutable std::mutex mu;  ///< guards the tuner and the codec steps
  core::PlanCache plans{cfg.plan_cache};

  /// `address_hint`: where the bootstrap store lives, used as the master address when
  /// the configuration has none (from_unique_id), so TCP binds the interface that
  /// reaches it.
  Impl(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options,
       const std::string& address_hint = {});
  ~Impl();

  /// Which host each rank is on (this rank's identity: CommOptions::host_id, BRAID_HOST_ID
  /// or hostname + boot id); asked by the engine's router, the tuner and compression.
  std::shared_ptr<core::Topology> topology;
  std::atomic<std::uint64_t> next_p2p{1};
  std::atomic<std::uint64_t> next_split{0};

  /// The request every plan of this communicator starts from: this rank and world, the
  /// pipeline slice of the configuration, and the given collective, count, size and op.
  collectives::PlanRequest request(collectives::Collective c, std::uint64_t count, std::size_t elem_size,
                                   ReduceOp op) const;
  Work collective(collectives::Collective c, const void* send, void* recv, std::size_t count, DataType dtype,
                  ReduceOp op, int root, Algorithm algo, bool deterministic, std::chrono::milliseconds timeout,
                  const char* what);
  Work p2p(bool is_send, const void* buf, std::size_t count, DataType dtype, int peer, const P2POptions& options);
  /// Measured tuning (BRAID_TUNE=measure) of one tuner bucket: the model's verdict,
  /// and once the trials have run, the verdict every rank agreed on; meanwhile the
  /// calls of the bucket waiting for it (their plans are filled in with the verdict).
  using DeferredPlan = core::DeferredPlan;
  struct Tuning {
    std::shared_ptr<const collectives::Choice> model;
    std::optional<Algorithm> verdict;
    std::string explanation;
    std::vector<std::pair<collectives::PlanRequest, DeferredPlan>> waiting;
  };
  using TuneKey = std::tuple<int, std::size_t, int, bool, int, int>;
  std::mutex tune_mu;                 ///< guards `tunings`
  std::map<TuneKey, Tuning> tunings;  ///< node-based: Tuning references stay valid
  TuneKey tune_key(const collectives::PlanRequest& req) const;
  /// What an automatic call runs, and what to do after issuing it.
  struct Pick {
    Algorithm algorithm = Algorithm::automatic;
    DeferredPlan deferred;  ///< set: post with it; the verdict decides the plan
    std::optional<collectives::Experiment> then_measure;  ///< set: call measure() after posting
    Tuning* tuning = nullptr;
  };
  /// The algorithm of an automatic call. Under BRAID_TUNE=measure the first call of a
  /// size bucket runs the model's choice and is followed by the trials (measure());
  /// until their verdict is in, the bucket's calls are deferred.
  Pick choose_algorithm(const collectives::PlanRequest& req);
  /// Issues an experiment's trial calls on a scratch buffer, then an operation that
  /// reads their times, an all-reduce that exchanges them and one that takes the
  /// verdict and fills the waiting calls' plans; returns without waiting for any.
  void measure(const collectives::PlanRequest& req, DataType dtype, const collectives::Experiment& e, Tuning& t,
               std::chrono::milliseconds call_timeout);
  collectives::CostModel cost_model() const;
  std::unique_ptr<collectives::Tuner> tuner;  ///< made at the first automatic choice
  using PostHints = core::PostHints;
  Work post(std::shared_ptr<const collectives::Plan> plan, const void* in, void* out, DataType dtype,
            ReduceOp op, std::chrono::milliseconds timeout, const char* what, std::shared_ptr<void> keepalive,
            std::shared_ptr<detail::WorkState>* state = nullptr, PostHints hints = {});
  /// Gives up measuring a bucket (its first call or the trials could not be issued):
  /// the model's choice becomes the verdict and calls waiting for it get that plan.
  void abandon_tuning(Tuning& t, const std::string& why);
  /// Fixes a bucket's verdict (unless one is set), logs it and gives the calls waiting
  /// for it their plans.
  void settle(Tuning& t, Algorithm verdict, std::string explanation);
  void check_same_call(const collectives::Plan& plan, DataType dtype, ReduceOp op, const char* what, bool automatic);
  std::atomic<std::uint64_t> next_check{0};
  /// The tuner, made on first use (every rank prices with the same topology and model).
  collectives::Tuner& tuner_ref();

  // --- compression (compressed.cpp) ---
  compression::ErrorFeedbackStore error_feedback;
  std::map<std::string, std::uint64_t> codec_steps;  ///< per ef_key: calls so far (the RNG's step), under mu
  /// Compressed all-reduce (docs/codecs.md): validates everything, finds the residuals
  /// and posts the compressed plan (collectives/compressed.cpp).
  Work compressed_allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                            const compression::CodecSpec& spec, const AllreduceOptions& options);
  /// Resolves BRAID_CODEC / the per-call codec; `auto` is priced with the cost model.
  compression::CodecSpec resolve_codec(const AllreduceOptions& options, std::size_t count, DataType dtype,
                                       ReduceOp op);
  /// Codec rates for `auto`, measured by rank 0 and shared through the store.
  const std::vector<compression::CodecRates>& codec_rates();
  std::mutex codec_rates_mu;
  std::vector<compression::CodecRates> rates;
  std::set<int> logged_auto;  ///< size buckets whose auto choice was logged
  /// Codec auto: 1 when every rank is on one host (auto never compresses), 0 when not,
  /// -1 until the first automatic call looks (so later calls skip the tuner and locks).
  std::atomic<int> auto_one_host{-1};
  /// Communicator::split (store-only, collective in call order).
  Communicator split_impl(int color, int key);
  /// Queues a host task (see core::Operation::task) and returns its Work.
  Work post_task(std::function<void()> task, std::string name, std::shared_ptr<void> keepalive);
};

}  // namespace braid
