// The algorithm menu: one table of every (collective, algorithm) pair build_plan offers,
// with the builder, the name logs give the plan, and the closed-form α-β-γ cost where
// one exists. build_plan dispatches through it, algorithms_for() and the tuner's
// candidates derive from it, closed_form_seconds() reads its formulas, and the Python
// bindings export it (braid._C.algorithm_table(); tests/python check that the Algorithm
// enum and the .pyi stubs agree with it). Adding an algorithm = its builder file, one
// row here, its enum value (append-only, include/braid/types.hpp) and its name in
// base/types.cpp.
//
// Not in the table: automatic (resolved before building: the tuner, or
// rooted_default() for broadcast and reduce), the deterministic plans (one fixed order
// whatever the algorithm; deterministic.cpp) and the compressed all-reduce (the codec's
// schedule; compressed.cpp), which build_plan selects by the request's flags.
#pragma once

#include "collectives/cost.hpp"
#include "collectives/plan.hpp"

#include <vector>

namespace braid::collectives {

class Builder;

/// One algorithm of one collective.
struct AlgorithmRow {
  Collective collective;
  Algorithm algorithm;
  /// The plan's label when the enum's name is not what is built (Plan::label), or null.
  const char* label;
  const char* summary;  ///< one line, for docs and braid_info
  /// Appends the plan's steps. False (nothing built): the layout does not suit it;
  /// build_plan then builds the collective's first row instead.
  bool (*build)(Builder&);
  /// α-β-γ time for n ranks joined by `link` and N bytes (cost.hpp's size_bytes()), one
  /// message per step; null where the cost depends on more than that (hierarchical:
  /// closed_form_hierarchical) or is not written down.
  double (*closed_form)(double n, double N, const LinkCost& link, double gamma);
};

/// Every row, collective by collective, the default (bandwidth-optimal) one first.
const std::vector<AlgorithmRow>& algorithm_table();

/// The row of `algorithm` for `c`, or null when `c` does not offer it.
const AlgorithmRow* find_algorithm(Collective c, Algorithm algorithm) noexcept;

}  // namespace braid::collectives
