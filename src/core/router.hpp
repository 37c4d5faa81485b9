// Which transport serves which pair: the registry's entries ranked by each entry's
// preference for the pair (transport/registry.hpp), or the one BRAID_TRANSPORT forces.
// Pure: the answer depends only on the mode and the pair's facts, so any rank can say
// what any pair uses (describe_topology(), the tuner's link classes).
#pragma once

#include "transport/registry.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace braid::core {

class Router {
 public:
  /// `mode`: "auto" or a registered transport's name; anything else is
  /// Error(InvalidUsage) listing the registered names.
  explicit Router(const std::string& mode);

  const std::string& mode() const noexcept { return mode_; }
  /// The entries a communicator instantiates: the forced one, or every registered one that
  /// auto mode may pick (TransportEntry::in_auto_mode).
  const std::vector<const transport::TransportEntry*>& entries() const noexcept { return entries_; }
  /// Auto mode: leaves out entries()[i], which cannot be made here (its library or device is
  /// absent); later choices never pick it.
  void drop(std::size_t i);
  /// Auto mode: leaves out every entry that no pair of `rank` can choose (its preference is
  /// <= 0 for a same-host pair and for an other-host pair, `rdma` being the rank's own
  /// fabric), so that a communicator does not make it; returns their names, for the log.
  std::vector<std::string> drop_unchoosable(int rank, bool rdma);
  /// The index into entries() of the transport for `pair`. Throws Error(Unsupported)
  /// naming the pair when no entry serves it (or the forced one cannot).
  std::size_t choose(const transport::PairFacts& pair) const;
  /// Why choose() picked what it did, for the INFO log ("shm (same host)").
  std::string explain(const transport::PairFacts& pair) const;

 private:
  std::string mode_;
  std::vector<const transport::TransportEntry*> entries_;
};

}  // namespace braid::core
