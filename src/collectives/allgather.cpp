// Ring all-gather: every rank ends with every rank's input, in rank order.
//
// Each rank first copies its input into its own block of the output (nothing to do in
// place, where the input is that block). Around the ring of ranks in topology order,
// in step s (0 <= s < n-1) position p sends the block it got in the previous step (its
// own at s = 0) to its right and receives the block of position p - s - 1 from its
// left. Blocks are cut into slices and pipelined like the ring all-reduce.
//
// Per rank: n-1 messages of `count` elements (times slices) sent and received, i.e.
// (n-1)/n of the output. Time ~ (n-1)·α + (n-1)·N·β, with N = count·elem bytes per
// rank: bandwidth-optimal, latency linear in n.
//
// allgatherv is the same ring over blocks of their own sizes (rank_blocks()): each hop
// carries the block it carries, an empty block no message at all.
#include "collectives/builder.hpp"

namespace braid::collectives {

void build_ring_allgather(Builder& b) {
  const PlanRequest& req = b.req();
  const BlockLayout blocks = rank_blocks(req);
  if (blocks.total == 0) return;
  const Ring ring = ring_from(req, topology_order(req).front());
  const auto me = static_cast<std::size_t>(req.rank);
  b.copy({Buffer::input, 0, blocks.count[me]}, blocks.region(Buffer::output, me), b.phase("local copy"));
  ring_allgather(
      b, ring, [&](std::uint64_t pos) { return blocks.region(Buffer::output, static_cast<std::size_t>(ring.ranks[pos])); },
      b.phase("all-gather"));
}

}  // namespace braid::collectives
