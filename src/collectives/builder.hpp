// The toolkit plan builders share (internal to src/collectives).
//
// `Builder` appends steps to a plan and derives every dependency from the regions the
// steps touch: a step that reads a region waits for the last step that wrote it; one
// that writes waits for the last writer and for every step that read the region since
// (a send reads its src until the transport is done with it). Input and output are
// treated as aliased the way an in-place call aliases them (plan.hpp), which is exact
// in place and merely conservative out of place, so the one plan is correct for both.
// Builders therefore only have to emit steps in an order that is correct when run one
// after the other; the dependencies let the engine overlap everything else.
//
// Matching is by order (the n-th send from A to B meets the n-th receive B posts for
// A), so two ranks must emit the messages between them in the same order; each
// algorithm file says how it ensures that.
//
// Phases compose: ring all-reduce is ring_reduce_scatter() then ring_allgather(), the
// hierarchical all-reduce runs them over sub-rings, as UCC composes schedules.
#pragma once

#include "collectives/plan.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <vector>

namespace braid::collectives {

class Builder {
 public:
  /// Builds into `plan`, whose `request` says which collective (for the aliasing rules).
  explicit Builder(Plan& plan);

  const PlanRequest& req() const noexcept { return plan_.request; }
  Plan& plan() noexcept { return plan_; }
  int rank() const noexcept { return plan_.request.rank; }
  int world() const noexcept { return plan_.request.world; }

  /// Index of the phase called `name` (added on first use).
  std::uint32_t phase(const char* name);

  /// Elements per pipeline slice (PlanRequest::slice_bytes / elem_size, at least 1).
  std::uint64_t slice() const noexcept { return slice_; }
  /// Number of slices of a region of `count` elements.
  std::uint64_t nslices(std::uint64_t count) const noexcept { return (count + slice_ - 1) / slice_; }
  /// Slice k of region r.
  Region slice_of(const Region& r, std::uint64_t k) const noexcept {
    const std::uint64_t off = k * slice_;
    return Region{r.buf, r.offset + off, off >= r.count ? 0 : std::min(slice_, r.count - off)};
  }

  /// Reserves `count` elements of scratch; returns their offset.
  std::uint64_t scratch(std::uint64_t count) noexcept;
  /// Reserves `count` encoded values of the packed buffer, from a multiple of
  /// Plan::packed_frame (set it first); returns their offset.
  std::uint64_t packed(std::uint64_t count) noexcept;

  // Each appends one step (none, returning kNoStep, for an empty region: both ends of
  // a message see the same size, so both skip it) and returns its index. `after` adds
  // dependencies to the derived ones.
  std::uint32_t send(int peer, const Region& src, std::uint32_t phase, const std::vector<std::uint32_t>& after = {});
  std::uint32_t recv(int peer, const Region& dst, std::uint32_t phase, bool finalize = false,
                     const std::vector<std::uint32_t>& after = {});
  /// dst = src (op) message.
  std::uint32_t recv_reduce(int peer, const Region& src, const Region& dst, std::uint32_t phase, bool finalize = false,
                            const std::vector<std::uint32_t>& after = {});
  std::uint32_t copy(const Region& src, const Region& dst, std::uint32_t phase, bool finalize = false);
  /// dst = a (op) b.
  std::uint32_t reduce(const Region& a, const Region& b, const Region& dst, std::uint32_t phase, bool finalize = false);
  /// dst (packed) = encode(src [+ residual]); `residual` (src's size, in a feedback
  /// buffer) is updated; pass a region of count 0 for none. `stream` and `stream_rank`
  /// pick the RNG stream, `at` is src's global index.
  std::uint32_t encode(const Region& src, const Region& residual, const Region& dst, std::uint8_t stream,
                       int stream_rank, std::uint64_t at, std::uint32_t phase);
  /// dst = decode(src) (sum_start: +0.0f + decode(src)); finalize as for copy.
  std::uint32_t decode(const Region& src, const Region& dst, std::uint32_t phase, bool sum_start,
                       bool finalize = false);
  /// dst += decode(src).
  std::uint32_t decode_add(const Region& src, const Region& dst, std::uint32_t phase, bool finalize = false);

 private:
  struct Seg {
    std::uint32_t writer = kNoStep;
    std::vector<std::uint32_t> readers;
  };
  using Space = std::map<std::uint64_t, Seg>;  // segment from key to the next key
  struct Span {
    int space;
    std::uint64_t begin, end;
  };

  Span span(const Region& r) const noexcept;
  void split(Space& s, std::uint64_t at);
  void hazards(const Region& r, bool write, std::vector<std::uint32_t>& deps);
  void record(const Region& r, bool write, std::uint32_t step);
  std::uint32_t emit(const Step& s, std::initializer_list<const Region*> reads,
                     std::initializer_list<const Region*> writes, const std::vector<std::uint32_t>& after);

  Plan& plan_;
  std::uint64_t slice_ = 1;
  std::uint64_t in_base_ = 0, out_base_ = 0;  // offsets of input/output in the aliased space
  Space spaces_[5];  // 0: input/output, 1: scratch, 2: packed, 3-4: feedback residuals
};

/// A ring of ranks: ranks[i] sends to ranks[(i + 1) % size]; this rank is ranks[pos].
struct Ring {
  std::vector<int> ranks;
  int pos = 0;
  int size() const noexcept { return static_cast<int>(ranks.size()); }
};

/// Rank order for rings and chains: by host (when PlanRequest::host_of is given), then
/// by rank, so that a ring crosses between hosts as few times as possible.
std::vector<int> topology_order(const PlanRequest& req);
/// topology_order() rotated to start at `first`, as a Ring holding this rank.
Ring ring_from(const PlanRequest& req, int first);

/// The rings of a hierarchical plan: this host's ranks (in rank order) and the ranks
/// with this rank's local index on every host (in host order). False when
/// PlanRequest::host_of is missing or malformed, when hosts have different numbers of
/// ranks, or when there is one host or one rank per host (nothing to split).
bool host_rings(const PlanRequest& req, Ring& intra, Ring& inter);

/// Where block b of a phase lives (b indexes ring positions).
using BlockFn = std::function<Region(std::uint64_t b)>;

/// Ring reduce-scatter over the ring's m blocks (m = ring size), each cut into slices
/// and pipelined. Block b's chain runs from position b+1 around to b, so position p
/// ends with block p reduced over the ring's ranks in `owned` (finalized when
/// `finalize`). own(b): this rank's contribution to block b; partial(b): where it
/// accumulates block b on the way (b != p). Every rank sends and receives (m-1)/m of
/// the blocks' elements.
void ring_reduce_scatter(Builder& b, const Ring& ring, const BlockFn& own, const BlockFn& partial,
                         const Region& owned, std::uint32_t phase, bool finalize);

/// Ring all-gather: position p holds block p at at(p); afterwards every position holds
/// every block b at at(b). Every rank sends and receives (m-1) blocks.
void ring_allgather(Builder& b, const Ring& ring, const BlockFn& at, std::uint32_t phase);

// Collectives and algorithms, one file each.
void build_ring_allreduce(Builder& b);         // ring.cpp
void build_ring_allgather(Builder& b);         // allgather.cpp
void build_ring_reduce_scatter(Builder& b);    // reduce_scatter.cpp
void build_chain_broadcast(Builder& b);        // broadcast.cpp
void build_binomial_broadcast(Builder& b);     // broadcast.cpp
void build_chain_reduce(Builder& b);           // reduce.cpp
void build_binomial_reduce(Builder& b);        // reduce.cpp
void build_pairwise_alltoall(Builder& b);      // alltoall.cpp
void build_direct_gather(Builder& b);          // gather.cpp
void build_direct_scatter(Builder& b);         // gather.cpp
void build_bruck_allgather(Builder& b);        // bruck.cpp
void build_bruck_reduce_scatter(Builder& b);   // bruck.cpp
void build_tree_allreduce(Builder& b);         // tree.cpp
void build_rhd_allreduce(Builder& b);          // rhd.cpp
/// False (and nothing built) when the layout does not suit it: use the ring.
bool build_hierarchical_allreduce(Builder& b); // hierarchical.cpp
void build_deterministic_allreduce(Builder& b);       // deterministic.cpp
void build_deterministic_reduce_scatter(Builder& b);  // deterministic.cpp
void build_deterministic_reduce(Builder& b);          // deterministic.cpp
/// PlanRequest::codec set: two-phase, sparse all-gather (topk) or hierarchical two-phase.
void build_compressed_allreduce(Builder& b);          // compressed.cpp

}  // namespace braid::collectives
