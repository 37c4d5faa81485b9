// The symbolic verifier: runs every rank's plan in one process on symbolic data and
// proves that each output element ends up holding exactly one contribution from
// every rank (for reductions: finalized exactly once for avg).
//
// Each element is tracked as the set of ranks whose input it contains (a 64-bit
// mask, so worlds of up to 64 ranks). Transfers are split into a post and a
// completion event and interleaved in a seeded random order, with per-element
// read/write locks between post and completion: a step that writes an element
// another in-flight step reads or writes is reported as a race. It also reports
// deadlocks (no step can move), mismatched message sizes, undefined data being
// read, contributions counted twice, and messages left unreceived.
#pragma once

#include "collectives/plan.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace braid::collectives {

/// Outcome of one verification run.
struct VerifyResult {
  bool ok = false;
  std::string error;         ///< what went wrong, naming rank, step and element
  std::uint64_t messages = 0;  ///< messages exchanged in total
  std::uint64_t bytes = 0;     ///< elements exchanged in total (x elem_size = bytes)
};

/// Builds the plan of every rank for `base` (its `rank` is ignored) and verifies them
/// together. `in_place` aliases each rank's input and output buffers. `seed` picks
/// the interleaving.
/// `builder` makes each rank's plan (default build_plan; tests pass broken builders
/// to show the verifier catches them).
using PlanBuilder = std::function<std::shared_ptr<const Plan>(const PlanRequest&)>;
VerifyResult verify_plans(const PlanRequest& base, bool in_place, std::uint64_t seed,
                          const PlanBuilder& builder = build_plan);

}  // namespace braid::collectives
