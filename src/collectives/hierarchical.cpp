// Hierarchical all-reduce (Algorithm::hierarchical) for L ranks on each of H hosts:
//
// 1. intra-host ring reduce-scatter: the host's ranks (in rank order) cut the vector
//    into L blocks; local rank l ends with block l reduced over its host;
// 2. inter-host ring all-reduce of block l among the H ranks with local rank l (one
//    per host, in host order): reduce-scatter then all-gather of block l's H chunks;
//    avg divides here, once;
// 3. intra-host ring all-gather of the L blocks.
// Every element crosses between hosts only inside step 2, as 1/L of the vector per
// rank, so the H·L ranks use all their network links at once, and the rings inside a
// host run over its fast links (shared memory, NVLink).
//
// Per rank, with N the vector's bytes: intra-host 2·(L-1)/L·N sent and received;
// inter-host 2·(H-1)/H·N/L. Time ~ 2(L-1)·α_intra + 2(L-1)/L·N·β_intra + 2(H-1)·α_inter
// + 2(H-1)/(H·L)·N·β_inter + (n-1)/n·N·γ.
//
// Needs PlanRequest::host_of. Falls back to the ring (and reports Algorithm::ring in
// the plan's request) when the host map is missing or malformed, when all ranks share
// one host or every host has one rank (the ring is then the same schedule), or when
// hosts have different numbers of ranks (blocks would not line up across hosts;
// NCCL also builds its trees and rings over uniform nodes).
#include "collectives/builder.hpp"

namespace braid::collectives {

bool build_hierarchical_allreduce(Builder& b) {
  const PlanRequest& req = b.req();
  Ring intra, inter;
  if (!host_rings(req, intra, inter)) return false;
  if (req.count == 0) return true;
  const auto L = static_cast<std::size_t>(intra.size()), H = static_cast<std::size_t>(inter.size());
  const auto l = static_cast<std::size_t>(intra.pos);
  auto block = [&](Buffer buf, std::uint64_t i) {
    const std::uint64_t at = part_offset(req.count, L, i);
    return Region{buf, at, part_offset(req.count, L, i + 1) - at};
  };
  const Region mine = block(Buffer::output, l);
  auto chunk = [&](std::uint64_t c) {
    const std::uint64_t at = part_offset(mine.count, H, c);
    return Region{Buffer::output, mine.offset + at, part_offset(mine.count, H, c + 1) - at};
  };
  auto out_block = [&](std::uint64_t i) { return block(Buffer::output, i); };
  ring_reduce_scatter(
      b, intra, [&](std::uint64_t i) { return block(Buffer::input, i); }, out_block, mine,
      b.phase("intra-host reduce-scatter"), false);
  ring_reduce_scatter(b, inter, chunk, chunk, chunk(static_cast<std::uint64_t>(inter.pos)),
                      b.phase("inter-host reduce-scatter"), req.op == ReduceOp::avg);
  ring_allgather(b, inter, chunk, b.phase("inter-host all-gather"));
  ring_allgather(b, intra, out_block, b.phase("intra-host all-gather"));
  return true;
}

}  // namespace braid::collectives
