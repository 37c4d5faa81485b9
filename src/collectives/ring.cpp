// Ring all-reduce: reduce-scatter followed by all-gather around a ring of ranks
// (Patarasuk & Yuan; the schedule NCCL and Gloo use), composed from the ring phases of
// builder.cpp.
//
// The ring is the ranks in topology order (by host when the host map is known, then by
// rank), so it crosses between hosts as few times as possible. The vector is cut into
// n chunks (sizes differ by at most one element); position p of the ring owns chunk p.
// In reduce-scatter step s (0 <= s < n-1) position p sends chunk (p - 1 - s) to its
// right and receives chunk (p - 2 - s) from its left, adding its own input to it; after
// n-1 steps it holds chunk p fully reduced (for avg, divided by n there, once). In
// all-gather step s it sends chunk (p - s) and receives chunk (p - s - 1), so that
// after n-1 more steps every rank holds every reduced chunk. Every rank ends with the
// owner's bytes, so results are bitwise identical on all ranks.
//
// Each chunk is further cut into slices of at most `slice_bytes`; a slice moves on as
// soon as it has been reduced, so sending, receiving and reducing overlap
// (pipelining). Messages between two neighbours are emitted in (phase, step, slice)
// order by both ends. Each rank sends and receives 2(n-1)/n of the vector in 2(n-1)
// steps: time ~ 2(n-1)·α + 2(n-1)/n·N·β + (n-1)/n·N·γ.
#include "collectives/builder.hpp"

namespace braid::collectives {

void build_ring_allreduce(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const Ring ring = ring_from(req, topology_order(req).front());
  const auto n = static_cast<std::uint64_t>(ring.size());
  auto chunk = [&](Buffer buf, std::uint64_t c) {
    const std::uint64_t at = part_offset(req.count, n, c);
    return Region{buf, at, part_offset(req.count, n, c + 1) - at};
  };
  const auto p = static_cast<std::uint64_t>(ring.pos);
  ring_reduce_scatter(
      b, ring, [&](std::uint64_t c) { return chunk(Buffer::input, c); },
      [&](std::uint64_t c) { return chunk(Buffer::output, c); }, chunk(Buffer::output, p), b.phase("reduce-scatter"),
      req.op == ReduceOp::avg);
  ring_allgather(b, ring, [&](std::uint64_t c) { return chunk(Buffer::output, c); }, b.phase("all-gather"));
}

}  // namespace braid::collectives
