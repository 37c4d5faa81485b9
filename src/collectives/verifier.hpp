// The symbolic verifier: runs every rank's plan in one process on symbolic data and
// proves that each rank ends with what its collective promises (buffer_counts() and
// the in-place conventions of plan.hpp).
//
// Each element is tracked as
// - the set of ranks whose input it contains (a 64-bit mask, so worlds of up to 64),
// - the index it had in those inputs (reducing element i with element j != i is an
//   error, and data-movement collectives are checked element by element),
// - a hash of the expression that produced it, commutative but not associative
//   (a+b == b+a, (a+b)+c != a+(b+c)), so that the verifier proves results bitwise
//   identical on every rank, and in deterministic mode equal to the rank-order fold
//   ((x0 op x1) op x2) ... op x(n-1), and
// - whether avg's division was applied, and
// - how many times it was quantised (compressed plans: encode counts one; decode keeps
//   the count and the hash, an encode mixes into the hash the rank and RNG stream that
//   encoded it, so outputs decoded from different bytes differ).
//
// Transfers are split into a post and a completion event and interleaved in a seeded
// random order, with per-element read/write locks between post and completion: a step
// that writes an element another in-flight step reads or writes is reported as a
// race. The model follows the engine: FIFO per ordered pair of ranks, dependencies,
// local steps in plan order, a send completes only once the matching receive is
// posted (rendezvous, as over TCP, which never reads a payload before its receive is
// posted), a recv_reduce reads its src at completion, and an in-place recv_reduce
// (src overlapping dst) needs one of a few staging buffers from post to completion.
// It reports deadlocks (no step can move), mismatched message sizes, undefined data
// being read, contributions counted twice, elements of different indexes reduced
// together, writes to an input buffer, and messages left unreceived; for compressed
// plans also values quantised other than twice (once for topk), packed regions off the
// frame, and error-feedback residual elements not carried into exactly one encode per
// call (or carried for different elements).
#pragma once

#include "collectives/plan.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace braid::collectives {

/// Outcome of one verification run.
struct VerifyResult {
  bool ok = false;
  std::string error;           ///< what went wrong, naming rank, step and element
  std::uint64_t messages = 0;  ///< messages exchanged in total
  std::uint64_t bytes = 0;     ///< elements exchanged in total (x elem_size = bytes)
  std::vector<std::uint64_t> sent;      ///< elements each rank sent
  std::vector<std::uint64_t> received;  ///< elements each rank received
  std::vector<std::uint64_t> sends;     ///< messages each rank sent
  std::vector<std::uint64_t> reduced;   ///< elements each rank reduced (recv_reduce + reduce)
  std::vector<std::uint64_t> traffic;   ///< elements sent from rank a to rank b at [a * world + b]
};

/// How to run the plans.
struct VerifyOptions {
  /// Alias the buffers as plan.hpp's in-place conventions say.
  bool in_place = false;
  /// Picks the interleaving.
  std::uint64_t seed = 0;
  /// A send completes only once its matching receive has been posted (the engine over
  /// TCP). Off: a send may complete into an unbounded channel (eager, like shm slots).
  bool rendezvous = true;
  /// Staging buffers per rank for recv_reduce steps whose src overlaps dst (the
  /// engine's kMaxStaging); 0 = unlimited.
  std::size_t staging_slots = 8;
  /// Post every step that can be posted before completing any transfer, as the engine
  /// does (it posts all ready queue heads, then reaps): the order that holds staging
  /// buffers longest. Off: posts and completions interleave at random.
  bool post_first = false;
};

/// Makes the plan of one rank (default build_plan; tests pass broken builders to show
/// the verifier catches them).
using PlanBuilder = std::function<std::shared_ptr<const Plan>(const PlanRequest&)>;

/// Builds the plan of every rank for `base` (its `rank` is ignored) and verifies them
/// together.
VerifyResult verify_plans(const PlanRequest& base, const VerifyOptions& options,
                          const PlanBuilder& builder = build_plan);

/// Same, with default options but `in_place` and `seed`.
VerifyResult verify_plans(const PlanRequest& base, bool in_place, std::uint64_t seed,
                          const PlanBuilder& builder = build_plan);

}  // namespace braid::collectives
