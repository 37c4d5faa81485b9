// Ring reduce-scatter: rank r ends with block r (elements [r·count, (r+1)·count) of
// the input) reduced over all ranks.
//
// The first phase of the ring all-reduce, on n blocks of `count` elements: around the
// ring of ranks in topology order, block b's partial sum starts at the position after
// b's owner and travels n-1 hops, each rank adding its own input, until it reaches the
// owner, which reduces the last message straight into its output (and divides by n
// for avg). On the way a rank keeps partial sums in two scratch blocks used in turn:
// the block reduced in step s is sent on in step s+1, so step s+2 may reuse its
// buffer once that send is done. Blocks are sliced and pipelined.
//
// Per rank: (n-1)·count elements sent and received, (n-1)·count reduced; scratch
// 2·count elements (n > 2). Time ~ (n-1)·α + (n-1)·N·β + (n-1)·N·γ with N =
// count·elem bytes: bandwidth-optimal.
//
// reduce_scatter_v is the same ring over blocks of their own sizes (rank_blocks()); the
// two scratch slots hold the largest block.
#include "collectives/builder.hpp"

#include <algorithm>

namespace braid::collectives {

void build_ring_reduce_scatter(Builder& b) {
  const PlanRequest& req = b.req();
  const BlockLayout blocks = rank_blocks(req);
  if (blocks.total == 0) return;
  const Ring ring = ring_from(req, topology_order(req).front());
  const std::uint64_t m = static_cast<std::uint64_t>(ring.size());
  const std::uint64_t p = static_cast<std::uint64_t>(ring.pos);
  const std::uint64_t widest = *std::max_element(blocks.count.begin(), blocks.count.end());
  const std::uint64_t slots = m > 2 ? std::min<std::uint64_t>(2, m - 2) : 0;
  const std::uint64_t base = b.scratch(slots * widest);
  auto rank_at = [&](std::uint64_t pos) { return static_cast<std::size_t>(ring.ranks[pos]); };
  auto own = [&](std::uint64_t pos) { return blocks.region(Buffer::input, rank_at(pos)); };
  // Block `pos` is received (and reduced) in step (p - 2 - pos) mod m.
  auto partial = [&](std::uint64_t pos) {
    const std::uint64_t step = (p + 2 * m - 2 - pos) % m;
    return Region{Buffer::scratch, base + (step % 2) * widest, blocks.count[rank_at(pos)]};
  };
  ring_reduce_scatter(b, ring, own, partial, {Buffer::output, 0, blocks.count[static_cast<std::size_t>(req.rank)]},
                      b.phase("reduce-scatter"), req.op == ReduceOp::avg);
}

}  // namespace braid::collectives
