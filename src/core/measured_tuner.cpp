#include "core/measured_tuner.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "core/router.hpp"
#include "core/work_state.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <sstream>
#include <string_view>

namespace braid::core {

namespace {

using collectives::Collective;
using collectives::PlanRequest;

/// The cost model's link class of the transport `router` gives a pair (inside a host or
/// between hosts); tcp when the entry names a class the model does not know.
collectives::LinkClass link_class_of(const Router& router, bool same_host) {
  const char* name = router.entries()[router.choose({0, 1, same_host})]->link_class;
  for (int c = 0; c < collectives::kNumLinkClasses; ++c)
    if (std::string_view(name) == collectives::to_string(static_cast<collectives::LinkClass>(c)))
      return static_cast<collectives::LinkClass>(c);
  return collectives::LinkClass::tcp;
}

}  // namespace

MeasuredTuner::MeasuredTuner(const Config& cfg, Membership member, PlanCache& plans, Poster& poster)
    : cfg_(cfg), member_(std::move(member)), plans_(plans), poster_(poster) {}

MeasuredTuner::Pick MeasuredTuner::choose_algorithm(const PlanRequest& req, bool model_only) {
  Pick pick;
  // Collectives with a single plan need no tuning; all-gather and reduce-scatter (ring or
  // Bruck) take the model's choice, unmeasured (trials exist for the three below).
  const bool trials = req.collective == Collective::allreduce || req.collective == Collective::broadcast ||
                      req.collective == Collective::reduce;
  if (!trials && req.collective != Collective::allgather && req.collective != Collective::reduce_scatter)
    return pick;
  if (!trials && req.deterministic) return pick;  // one fixed-order plan whatever the algorithm
  pick.algorithm = Algorithm::ring;
  if (member_.size == 1) return pick;
  collectives::Tuner* t = &tuner_ref();
  bool first = false;
  std::shared_ptr<const collectives::Choice> model;
  try {
    model = t->choose(req.collective, req.count, req.elem_size, req.op, &first, req.root, req.deterministic);
  } catch (const Error& e) {
    BRAID_LOG(warn, "tuner could not price " << to_string(req.collective) << ": " << e.what() << "; using the default plan");
    pick.algorithm = Algorithm::automatic;
    return pick;
  }
  pick.algorithm = model->algorithm;
  if (!cfg_.tune_measure || model_only || !trials) {
    if (first) BRAID_LOG(info, "tuner: " << model->explanation);
    return pick;
  }
  std::unique_lock<std::mutex> lock(mu_);
  const TuneKey key = tune_key(req);
  std::shared_ptr<Tuning>* found = tunings_.find(key);
  const bool inserted = found == nullptr;
  if (inserted) found = tunings_.insert(key, std::make_shared<Tuning>());
  const std::shared_ptr<Tuning> held = *found;
  Tuning& tu = *held;
  if (inserted) {
    tu.model = model;
    // A trial is a block of calls spanning about 100 us by the model (1 to 16 calls):
    // single small calls are dominated by wake-ups and arrival skew. Rounds: enough for
    // about 8 ms of predicted time per candidate, 3 to 31. Above kMaxTrialBytes the
    // scratch buffer would cost too much memory and the trials too much time; there
    // bandwidth decides and the model ranks well.
    constexpr double kMaxTrialBytes = 64.0 * 1024 * 1024;
    const double bytes = static_cast<double>(req.count) * static_cast<double>(req.elem_size);
    const double predicted = std::max(model->seconds, 1e-7);
    const int block = static_cast<int>(std::clamp(std::ceil(100e-6 / predicted), 1.0, 16.0));
    const int rounds = static_cast<int>(std::clamp(std::ceil(8e-3 / (block * predicted)), 3.0, 31.0));
    const auto experiment =
        collectives::Experiment::plan(*model, bytes <= kMaxTrialBytes ? rounds : 0, 4.0, block);
    if (experiment.schedule.empty()) {
      tu.verdict = model->algorithm;
      tu.explanation = model->explanation;
      BRAID_LOG(info, "tuner: " << tu.explanation);
    } else {
      // This call runs the model's choice, as without measuring (so it fails, if it
      // fails, with its own error); the trials follow it.
      pick.then_measure = experiment;
      pick.tuning = held;
      return pick;
    }
  }
  if (tu.verdict) {
    pick.algorithm = *tu.verdict;
    return pick;
  }
  // The verdict comes from operations already issued: this call's plan is filled in
  // then (before it can start, since operations start in issue order). Its placeholder
  // plan, the model's, only names the call.
  pick.deferred = std::make_shared<std::shared_ptr<const collectives::Plan>>();
  tu.waiting.emplace_back(req, pick.deferred);
  return pick;
}

void MeasuredTuner::measure(const Pick& pick, const PlanRequest& req, DataType dtype,
                            std::chrono::milliseconds call_timeout) {
  if (!pick.then_measure) return;
  try {
    run_trials(req, dtype, *pick.then_measure, pick.tuning, call_timeout);
  } catch (const Error& e) {
    // Only when the communicator has failed meanwhile (post refuses then): the call
    // itself is out and its Work reports what happened.
    abandon_tuning(pick, e.what());
  }
}

void MeasuredTuner::run_trials(const PlanRequest& req, DataType dtype, const collectives::Experiment& e,
                               const std::shared_ptr<Tuning>& tu,
                               std::chrono::milliseconds call_timeout) {
  // The trials are calls of their own, in place on a zeroed scratch buffer of the
  // call's size: every rank issues them at the same point (the first call of this
  // bucket, which every rank issues in the same order), and the caller's data only
  // ever sees the chosen algorithm. Nothing here waits for peers: the times are read,
  // exchanged and judged by operations that run after the trials, in issue order.
  // Small trials run on this thread while peers keep pace, as the caller's own calls
  // of their size do (Engine::submit), so that they are timed on the same path.
  struct Run {
    std::vector<std::byte> scratch;
    std::vector<std::shared_ptr<detail::WorkState>> works;
    std::vector<double> seconds;
  };
  auto run = std::make_shared<Run>();
  // Sized once, before anything is queued: the exchange below holds its data pointer,
  // and the read task may run (on the engine thread) before this function returns.
  run->seconds.assign(e.schedule.size(), 0.0);
  const auto counts = collectives::buffer_counts(req);
  run->scratch.assign(std::max(counts.input, counts.output) * req.elem_size, std::byte{0});
  Posting trial;
  trial.in = run->scratch.data();
  trial.out = run->scratch.data();
  trial.dtype = dtype;
  trial.op = req.op;
  trial.timeout = call_timeout;
  trial.what = req.collective == Collective::allreduce   ? "allreduce (tuner trial)"
               : req.collective == Collective::broadcast ? "broadcast (tuner trial)"
                                                         : "reduce (tuner trial)";
  trial.keepalive = run;
  trial.internal = true;
  // works[2i], works[2i+1]: the first and last call of trial i.
  for (const Algorithm a : e.schedule) {
    PlanRequest r = req;
    r.algorithm = a;
    trial.plan = plans_.plan_for(r);
    for (int k = 0; k < e.block; ++k) {
      std::shared_ptr<detail::WorkState> state;
      trial.state = &state;
      poster_.post(trial);
      if (k == 0) run->works.push_back(state);
      if (k == e.block - 1) run->works.push_back(std::move(state));
    }
  }
  // Runs once every trial has completed (a non-concurrent task waits for everything
  // issued before it).
  poster_.post_task(
      [run, block = e.block] {
        // Every collective is stamped when admitted (engine.cpp), so `started` is set.
        for (std::size_t i = 0; i < run->seconds.size(); ++i) {
          const auto& first = run->works[2 * i];
          const auto& last = run->works[2 * i + 1];
          run->seconds[i] = std::chrono::duration<double>(last->ended - first->started).count() / block;
        }
      },
      "tuner: read trial times", run);
  // Per trial, the longest time over ranks, as a benchmark reports the slowest rank
  // (a block's span makes the arrival skew of its first call small).
  PlanRequest x = poster_.request(Collective::allreduce, run->seconds.size(), sizeof(double), ReduceOp::max);
  x.algorithm = Algorithm::ring;
  x.host_of = member_.topology->host_of();
  Posting exchange;
  exchange.plan = plans_.plan_for(x);
  exchange.in = run->seconds.data();
  exchange.out = run->seconds.data();
  exchange.dtype = DataType::f64;
  exchange.op = ReduceOp::max;
  exchange.timeout = call_timeout;
  exchange.what = "allreduce (tuner's exchange of trial times)";
  exchange.keepalive = run;
  exchange.internal = true;
  poster_.post(std::move(exchange));
  poster_.post_task(
      [this, run, e, tu] {
        const std::vector<double> agreed = e.medians(run->seconds);
        settle(*tu, e.verdict(agreed), tu->model->explanation + "; " + e.explain(agreed));
      },
      "tuner: verdict", run);
}

void MeasuredTuner::abandon_tuning(const Pick& pick, const std::string& why) {
  if (!pick.then_measure) return;
  Tuning& tu = *pick.tuning;
  settle(tu, tu.model->algorithm, tu.model->explanation + " (not measured: " + why + ")");
}

void MeasuredTuner::settle(Tuning& tu, Algorithm verdict, std::string explanation) {
  std::vector<std::pair<PlanRequest, DeferredPlan>> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tu.verdict) return;
    tu.verdict = verdict;
    tu.explanation = std::move(explanation);
    waiting.swap(tu.waiting);
  }
  BRAID_LOG(info, "tuner: " << tu.explanation);
  for (auto& [r, slot] : waiting) {
    r.algorithm = verdict;
    *slot = plans_.plan_for(r);
  }
}

MeasuredTuner::TuneKey MeasuredTuner::tune_key(const PlanRequest& req) const {
  const int bucket =
      collectives::Tuner::size_bucket(collectives::size_bytes(req.collective, req.count, req.elem_size, member_.size));
  return {static_cast<int>(req.collective), req.elem_size, static_cast<int>(req.op), req.deterministic, bucket,
          req.collective == Collective::allreduce ? 0 : req.root};
}

std::string MeasuredTuner::explain(const PlanRequest& req) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto* found = tunings_.find(tune_key(req))) {
      const Tuning& tu = **found;
      if (tu.verdict) return tu.explanation;
      return tu.model->explanation + " (BRAID_TUNE=measure: trials queued, no verdict yet)";
    }
  }
  const auto choice = tuner_ref().price(req.collective, req.count, req.elem_size, req.op, req.root, req.deterministic);
  if (!cfg_.tune_measure) return choice.explanation;
  return choice.explanation + " (BRAID_TUNE=measure: no call of this size yet)";
}

collectives::Tuner& MeasuredTuner::tuner_ref() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tuner_) return *tuner_;
  }
  // Made outside the lock (the model may be read from a file; a throw, such as an
  // unreadable BRAID_COST_MODEL, leaves it to the next call). Every rank prices with the
  // same topology (from the store) and the same model (defaults, or BRAID_COST_MODEL),
  // so every rank makes the same choice.
  collectives::Topology topo;
  topo.host_of = member_.topology->layout().host_of;
  // The link classes of the transports the router gives a pair inside a host and
  // between hosts.
  const Router router(cfg_.transport);
  topo.intra = link_class_of(router, true);
  topo.inter = link_class_of(router, false);
  collectives::TuneOptions to;
  to.slice_bytes = cfg_.chunk_bytes;
  auto made = std::make_unique<collectives::Tuner>(member_.size, std::move(topo), cost_model(), to);
  std::lock_guard<std::mutex> lock(mu_);
  if (!tuner_) tuner_ = std::move(made);
  return *tuner_;
}

std::pair<double, double> MeasuredTuner::modelled_link_rates() const noexcept {
  try {
    const collectives::CostModel m = cost_model();
    const Router router(cfg_.transport);
    auto rate = [&](bool same_host) {
      const double beta = m[link_class_of(router, same_host)].beta;
      return beta > 0 ? 1.0 / beta : 0.0;
    };
    return {rate(true), rate(false)};
  } catch (const std::exception&) {
    return {0.0, 0.0};
  }
}

collectives::CostModel MeasuredTuner::cost_model() const {
  if (cfg_.cost_model.empty()) return collectives::CostModel::defaults();
  std::ifstream f(cfg_.cost_model);
  BRAID_CHECK(f.good(), InvalidUsage,
              "BRAID_COST_MODEL='" << cfg_.cost_model << "' cannot be read; give a file written by "
                                      "collectives::serialize (docs/cost-model.md) or unset it");
  std::stringstream ss;
  ss << f.rdbuf();
  return collectives::deserialize(ss.str());
}

}  // namespace braid::core
