// Transport choice per pair, from the registry.
#include "core/router.hpp"

#include <braid/error.hpp>

#include <algorithm>

namespace braid::core {

Router::Router(const std::string& mode) : mode_(mode) {
  if (mode_ == "auto") {
    for (const auto* e : transport::registry())
      if (e->in_auto_mode) entries_.push_back(e);
  } else if (const auto* e = transport::find_transport(mode_)) {
    entries_ = {e};
  } else {
    throw Error(ErrorCode::InvalidUsage, "BRAID_TRANSPORT='" + mode_ + "' is not a transport of this build: use auto or one of " +
                                             transport::transport_names());
  }
}

std::size_t Router::choose(const transport::PairFacts& pair) const {
  std::size_t best = entries_.size();
  int best_pref = mode_ == "auto" ? 1 : 0;  // forced: a preference of 0 is enough
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const int p = entries_[i]->preference(pair);
    if (p >= best_pref) {
      best = i;
      best_pref = p + 1;  // later entries must prefer the pair strictly more
    }
  }
  if (best == entries_.size()) {
    throw Error(ErrorCode::Unsupported,
                "no transport can connect rank " + std::to_string(pair.rank) + " and rank " +
                    std::to_string(pair.peer) + (pair.same_host ? " (same host)" : " (different hosts)") +
                    " with BRAID_TRANSPORT=" + mode_ + "; this build has " + transport::transport_names());
  }
  return best;
}

std::string Router::explain(const transport::PairFacts& pair) const {
  const auto* e = entries_[choose(pair)];
  std::string why = std::string(e->name) + (pair.same_host ? " (same host" : " (other host");
  if (!pair.same_host && pair.rdma) why += ", RDMA fabric at both ends";
  if (mode_ != "auto") why += ", BRAID_TRANSPORT=" + mode_;
  return why + ")";
}

void Router::drop(std::size_t i) {
  if (i < entries_.size()) entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
}

std::vector<std::string> Router::drop_unchoosable(int rank, bool rdma) {
  std::vector<std::string> dropped;
  if (mode_ != "auto") return dropped;
  for (std::size_t i = 0; i < entries_.size();) {
    const auto* e = entries_[i];
    if (std::max(e->preference({rank, -1, true, false}), e->preference({rank, -1, false, rdma})) > 0) {
      ++i;
      continue;
    }
    dropped.emplace_back(e->name);
    drop(i);
  }
  return dropped;
}

}  // namespace braid::core
