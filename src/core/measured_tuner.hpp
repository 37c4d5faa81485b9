// The tuner as a communicator runs it (docs/cost-model.md): the cost model's choice of
// algorithm per size bucket (collectives::Tuner, made at the first automatic call) and,
// under BRAID_TUNE=measure, trials of the close candidates on this communicator whose
// times, agreed by every rank, give the bucket's verdict. The trials are operations of
// their own, issued through the communicator's Poster.
#pragma once

#include "base/lru_map.hpp"
#include "collectives/plan.hpp"
#include "collectives/tuner.hpp"
#include "core/comm_parts.hpp"
#include "core/config.hpp"
#include "core/plan_cache.hpp"

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace braid::core {

/// Chooses the algorithm of automatic calls. Thread-safe. `cfg`, `plans` and `poster`
/// belong to the communicator and outlive this object; the engine is stopped before it
/// goes (the trials' tasks refer to it).
class MeasuredTuner {
 public:
  MeasuredTuner(const Config& cfg, Membership member, PlanCache& plans, Poster& poster);
  MeasuredTuner(const MeasuredTuner&) = delete;
  MeasuredTuner& operator=(const MeasuredTuner&) = delete;

  /// One size bucket under measured tuning: the model's verdict, and once the trials
  /// have run, the verdict every rank agreed on; meanwhile the calls of the bucket
  /// waiting for it (their plans are filled in with the verdict).
  struct Tuning {
    std::shared_ptr<const collectives::Choice> model;
    std::optional<Algorithm> verdict;
    std::string explanation;
    std::vector<std::pair<collectives::PlanRequest, DeferredPlan>> waiting;
  };
  /// What an automatic call runs, and what to do after issuing it.
  struct Pick {
    Algorithm algorithm = Algorithm::automatic;
    DeferredPlan deferred;  ///< set: post with it; the verdict decides the plan
    std::optional<collectives::Experiment> then_measure;  ///< set: call measure() after posting
    std::shared_ptr<Tuning> tuning;
  };

  /// The algorithm of an automatic call. Under BRAID_TUNE=measure the first call of a
  /// size bucket runs the model's choice and is followed by the trials (measure());
  /// until their verdict is in, the bucket's calls are deferred.
  /// `model_only`: the model's choice, never deferred nor measured (device-path calls,
  /// whose programs are enqueued when they are issued, so their plan must be known then).
  Pick choose_algorithm(const collectives::PlanRequest& req, bool model_only = false);
  /// After the call of `pick` was posted: issues its trials, if it asked for them, on a
  /// scratch buffer, then an operation that reads their times, an all-reduce that
  /// exchanges them and one that takes the verdict and fills the waiting calls' plans;
  /// returns without waiting for any. Gives up the bucket when they cannot be issued.
  void measure(const Pick& pick, const collectives::PlanRequest& req, DataType dtype,
               std::chrono::milliseconds call_timeout);
  /// The call of `pick` was not posted, so its trials will not be either: the model's
  /// choice becomes the verdict and calls waiting for it get that plan.
  void abandon_tuning(const Pick& pick, const std::string& why);
  /// What calls of `req`'s bucket run and why: the recorded verdict when there is one,
  /// else a fresh pricing that leaves the tuner's cache alone (the cache decides for a
  /// whole bucket at its first call, which must be the same call on every rank, while
  /// this may be asked on one rank only).
  std::string explain(const collectives::PlanRequest& req);
  /// Bytes per second the cost model gives one direction of a link inside a host and
  /// between hosts (the link report shows them beside the measured rates); 0 when the
  /// model cannot be read (the first call then says why).
  std::pair<double, double> modelled_link_rates() const noexcept;
  /// The tuner, made on first use (every rank prices with the same topology and model).
  collectives::Tuner& tuner_ref();

 private:
  using TuneKey = std::tuple<int, std::size_t, int, bool, int, int>;
  TuneKey tune_key(const collectives::PlanRequest& req) const;
  collectives::CostModel cost_model() const;
  void run_trials(const collectives::PlanRequest& req, DataType dtype, const collectives::Experiment& e,
                  const std::shared_ptr<Tuning>& tu,
                  std::chrono::milliseconds call_timeout);
  /// Fixes a bucket's verdict (unless one is set), logs it and gives the calls waiting
  /// for it their plans.
  void settle(Tuning& t, Algorithm verdict, std::string explanation);

  /// Buckets remembered at most. Past it the least recently called one is forgotten when a
  /// new bucket comes, and measured again if it comes back, so a job with ever new shapes
  /// keeps flat memory (tests/soak). Eviction follows the calls' issue order only, which
  /// every rank shares, so every rank forgets the same bucket at the same call; a bucket
  /// forgotten while its trials run lives on (shared_ptr) until their verdict task.
  static constexpr std::size_t kMaxTunings = 256;

  const Config& cfg_;
  const Membership member_;
  PlanCache& plans_;
  Poster& poster_;
  std::mutex mu_;                              ///< guards tuner_ and tunings_
  std::unique_ptr<collectives::Tuner> tuner_;  ///< made by tuner_ref(); never replaced once set
  base::LruMap<TuneKey, std::shared_ptr<Tuning>> tunings_{kMaxTunings};
};

}  // namespace braid::core
