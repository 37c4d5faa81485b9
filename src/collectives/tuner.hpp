// The tuner: picks the algorithm of a collective by pricing, with the cost model
// (cost.hpp), every algorithm build_plan accepts for the request, and taking the
// cheapest. Algorithms that build_plan rejects (Error: Unsupported, or any other
// braid::Error for that algorithm) are not candidates, so the tuner covers new
// algorithms as soon as build_plan offers them. Ties go to the earlier algorithm of
// the Algorithm enum (ring first).
//
// Every rank must choose the same algorithm: give every rank the same Topology and
// the same CostModel (calibrate on one rank and share it, see serialize()), and the
// choice, a pure function of those and the call, is the same everywhere.
#pragma once

#include "base/lru_map.hpp"
#include "collectives/cost.hpp"
#include "collectives/plan.hpp"

#include <braid/types.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace braid::collectives {

/// Request details beyond (collective, count, elem_size, op, world).
struct TuneOptions {
  std::size_t slice_bytes = 512 * 1024;  ///< the engine's pipeline slice (BRAID_CHUNK_BYTES)
  int root = 0;                          ///< broadcast / reduce root
  bool deterministic = false;            ///< price the deterministic-mode plans
};

/// One algorithm and its predicted time.
struct Candidate {
  Algorithm algorithm = Algorithm::ring;
  double seconds = 0;
  const char* name = nullptr;  ///< the plan's name (Plan::name(): "deterministic" where it applies)
};

/// The tuner's verdict.
struct Choice {
  Algorithm algorithm = Algorithm::ring;  ///< the cheapest candidate
  double seconds = 0;                     ///< its predicted time
  const char* name = "ring";              ///< its plan's name
  std::vector<Candidate> candidates;      ///< every algorithm priced, in enum order
  /// One line for the log: "allreduce 4 MiB x 8 ranks on 2 hosts: ring 1.23 ms,
  /// tree 2.10 ms, rhd 1.40 ms -> ring".
  std::string explanation;
};

/// Prices every algorithm (Algorithm::automatic excluded) that build_plan accepts for
/// this call and returns the cheapest. Uncached. Throws the first algorithm's error
/// when build_plan accepts none (e.g. a collective with no plan yet).
Choice choose(Collective collective, std::uint64_t count, std::size_t elem_size, ReduceOp op, int world,
              const Topology& topo, const CostModel& model, const TuneOptions& options = {});

/// The one-line explanation of `choice` (choose() fills Choice::explanation with it).
std::string explain(Collective collective, double bytes, int world, int hosts, const Choice& choice);

/// "4 MiB", "512 B", "1.5 GiB".
std::string format_bytes(double bytes);
/// "1.23 ms", "45.6 us", "2.00 s".
std::string format_seconds(double seconds);

/// Measured tuning of one size bucket (BRAID_TUNE=measure): the model narrows the
/// algorithms down to the plausible ones, trial calls at the bucket's first call run
/// each of them in turn, and the ranks then agree on the fastest measured one. The model alone
/// ranks algorithms well across orders of magnitude but not between close candidates
/// on a loaded or oversubscribed host (docs/cost-model.md, "Measured tuning"). This is
/// the pure part: the schedule and the verdict; the communicator times the calls and
/// exchanges the times.
struct Experiment {
  /// Algorithms tried, in enum order: those predicted within `within` times the best.
  std::vector<Algorithm> candidates;
  /// Trial i runs schedule[i]: `rounds` rounds, every candidate once per round, each
  /// round's order rotated by one so no candidate always follows the same.
  std::vector<Algorithm> schedule;
  /// Calls per trial: a trial's time is that of `block` consecutive calls (issued
  /// together, as a training step issues its buckets) divided by `block`, so that
  /// small calls are timed over a span long enough to average out wake-ups and skew.
  int block = 1;

  /// Empty schedule when one candidate remains (nothing to measure).
  static Experiment plan(const Choice& model, int rounds, double within, int block = 1);
  /// Median time of each candidate (index as `candidates`) from the time of every
  /// scheduled call (`seconds[i]` for schedule[i]; size must match).
  std::vector<double> medians(const std::vector<double>& seconds) const;
  /// The fastest candidate by `agreed` (one time per candidate, identical on every
  /// rank); ties go to the earlier candidate.
  Algorithm verdict(const std::vector<double>& agreed) const;
  /// "measured ring 5.1 ms, tree 4.02 ms, rhd 3.69 ms -> rhd".
  std::string explain(const std::vector<double>& agreed) const;
};

/// A tuner for one communicator: fixed world, topology and model, and a cache of
/// choices per (collective, elem_size, op, deterministic, size bucket), since training
/// repeats the same sizes. A bucket is a quarter of an octave of bytes (sizes below
/// 64 bytes are their own bucket); the first call of a bucket is priced and decides
/// for the whole bucket. Thread-safe: calls may come from any thread (they serialize
/// on an internal mutex; a miss costs one simulation per candidate algorithm).
class Tuner {
 public:
  Tuner(int world, Topology topo, CostModel model, TuneOptions options = {});

  /// The cached choice for this call, pricing it on a miss. `*first` (when given) is
  /// set true when this call priced a new bucket: the caller logs
  /// `choice->explanation` once then (BRAID_DEBUG=INFO).
  std::shared_ptr<const Choice> choose(Collective collective, std::uint64_t count, std::size_t elem_size, ReduceOp op,
                                       bool* first = nullptr, int root = 0, bool deterministic = false);

  /// What choose() prices on a miss, without consulting or filling the cache (to
  /// explain a size without deciding its bucket).
  Choice price(Collective collective, std::uint64_t count, std::size_t elem_size, ReduceOp op, int root = 0,
               bool deterministic = false) const;

  /// Bucket of a size in bytes (see the class comment).
  static int size_bucket(double bytes) noexcept;

  int world() const noexcept { return world_; }
  const Topology& topology() const noexcept { return topo_; }
  const CostModel& model() const noexcept { return model_; }
  /// Distinct buckets priced so far.
  std::size_t cached() const;

 private:
  int world_;
  Topology topo_;
  CostModel model_;
  TuneOptions options_;
  mutable std::mutex mu_;
  /// Buckets priced at most: past it the least recently used is priced again when it
  /// comes back (a pricing is a pure function of the call, so this only costs time),
  /// so a job with ever new shapes keeps flat memory (tests/soak).
  static constexpr std::size_t kMaxCached = 256;
  base::LruMap<std::tuple<int, std::size_t, int, bool, int>, std::shared_ptr<const Choice>> cache_{kMaxCached};
};

}  // namespace braid::collectives
