// Deterministic mode (PlanRequest::deterministic): every reduced element is computed as
// ((x0 op x1) op x2) ... op x(n-1), rank order, whatever the algorithm asked for and
// however ranks sit on hosts, so results are bitwise identical across algorithms,
// world layouts and runs (not just across ranks, which every plan guarantees). The
// verifier checks the exact shape of each element's reduction, not just its
// contributors.
//
// allreduce: direct reduce-scatter, then ring all-gather. Chunk c of the vector (n
// nearly equal chunks) belongs to rank c. Every rank sends chunk c of its input straight
// to rank c (in step k it sends to r+k and receives from r-k, like the pairwise
// alltoall); rank c receives the n-1 other contributions into scratch and folds them
// in rank order with local reduce steps (dst = a op b), slice by slice as they arrive,
// then the ring all-gather spreads the chunks. Per rank: 2(n-1)/n·N sent and received
// (the same as the ring), (n-1)/n·N reduced, but from n-1 peers at once: time ~
// 2(n-1)·α + 2(n-1)/n·N·β + (n-1)/n·N·γ, plus the connections to every peer (the
// ring needs two) and N bytes of scratch. The reduction itself runs after the data is
// in rather than overlapping each hop, and incast to each owner may cost more than the
// ring's neighbour traffic on real networks.
//
// reduce_scatter: the same direct exchange of blocks, each owner folding its block
// into its output; no all-gather. Per rank (n-1)·count sent, received and reduced:
// the ring's volume in one step of n-1 concurrent messages; count·n scratch.
//
// reduce: a chain in rank order 0 -> 1 -> ... -> n-1 (rank k adds its input to the
// partial sum of ranks 0..k-1 and forwards it), then rank n-1 sends the result to the
// root unless it is the root. Pipelined in slices like the chain reduce, with up to 4
// slices of scratch per rank; the extra hop costs α + N·β (N·β is hidden by the
// pipeline for large N): time ~ (n - 1 + S)·(α + N/S·(β + γ)).
//
// Plans report Algorithm::ring. broadcast, allgather and alltoall do not reduce and
// need no special mode.
#include "collectives/builder.hpp"

namespace braid::collectives {

namespace {

// Every rank sends block(j) of its input to rank j; this rank folds the n blocks it
// gets (its own included) in rank order into `owned`.
void direct_reduce_scatter(Builder& b, const std::function<Region(int)>& block, const Region& owned) {
  const PlanRequest& req = b.req();
  const int n = req.world, r = req.rank;
  const bool avg = req.op == ReduceOp::avg;
  if (n == 1) {
    b.copy(block(r), owned, b.phase("local copy"), avg);
    return;
  }
  const std::uint32_t ex = b.phase("direct reduce-scatter"), fold = b.phase("rank-order reduction");
  const std::uint64_t len = owned.count;
  const std::uint64_t base = b.scratch(static_cast<std::uint64_t>(n) * len);  // n-1 contributions + accumulator
  auto slot = [&](int j) { return Region{Buffer::scratch, base + static_cast<std::uint64_t>(j < r ? j : j - 1) * len, len}; };
  const Region acc{Buffer::scratch, base + static_cast<std::uint64_t>(n - 1) * len, len};
  const std::uint64_t slices = std::max(b.nslices(len), std::uint64_t{1});
  for (std::uint64_t k = 0; k < slices; ++k) {
    for (int off = 1; off < n; ++off) {
      const int to = (r + off) % n, from = (r + n - off) % n;
      const Region out = block(to);
      // The peer slices its block like this one: blocks differ in length by at most
      // one element, so slice counts can differ; send every slice by the last round.
      if (k + 1 < slices) b.send(to, b.slice_of(out, k), ex);
      else for (std::uint64_t q = k; q < b.nslices(out.count); ++q) b.send(to, b.slice_of(out, q), ex);
      b.recv(from, b.slice_of(slot(from), k), ex);
    }
    auto x = [&](int j) { return b.slice_of(j == r ? block(r) : slot(j), k); };
    for (int j = 1; j < n; ++j)
      b.reduce(j == 1 ? x(0) : b.slice_of(acc, k), x(j), b.slice_of(j == n - 1 ? owned : acc, k), fold,
               avg && j == n - 1);
  }
}

}  // namespace

void build_deterministic_allreduce(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const auto n = static_cast<std::uint64_t>(req.world);
  auto chunk = [&](Buffer buf, std::uint64_t c) {
    const std::uint64_t at = part_offset(req.count, n, c);
    return Region{buf, at, part_offset(req.count, n, c + 1) - at};
  };
  direct_reduce_scatter(
      b, [&](int c) { return chunk(Buffer::input, static_cast<std::uint64_t>(c)); },
      chunk(Buffer::output, static_cast<std::uint64_t>(req.rank)));
  const Ring ring = ring_from(req, topology_order(req).front());
  ring_allgather(
      b, ring, [&](std::uint64_t pos) { return chunk(Buffer::output, static_cast<std::uint64_t>(ring.ranks[pos])); },
      b.phase("all-gather"));
}

void build_deterministic_reduce_scatter(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const std::uint64_t c = req.count;
  direct_reduce_scatter(
      b, [&](int j) { return Region{Buffer::input, static_cast<std::uint64_t>(j) * c, c}; }, {Buffer::output, 0, c});
}

void build_deterministic_reduce(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const bool avg = req.op == ReduceOp::avg;
  const int n = req.world, v = req.rank, root = req.root;
  const Region in{Buffer::input, 0, req.count}, out{Buffer::output, 0, req.count};
  if (n == 1) {
    b.copy(in, out, b.phase("local copy"), avg);
    return;
  }
  const std::uint32_t chain = b.phase("rank-order chain"), last = b.phase("to the root");
  const std::uint64_t slices = b.nslices(req.count);
  const bool holds = v > 0 && !(v == n - 1 && root == n - 1);  // keeps partial sums in scratch
  const std::uint64_t pool = holds ? std::min<std::uint64_t>(slices, 4) : 0;
  const std::uint64_t base = b.scratch(pool * std::min(b.slice(), req.count));
  for (std::uint64_t k = 0; k < slices; ++k) {
    const Region mine = b.slice_of(in, k);
    if (v == 0) {
      b.send(1, mine, chain);
    } else {
      const Region sum = holds ? Region{Buffer::scratch, base + (k % pool) * b.slice(), mine.count} : b.slice_of(out, k);
      b.recv_reduce(v - 1, mine, sum, chain, avg && v == n - 1);
      if (v < n - 1) b.send(v + 1, sum, chain);
      else if (root != n - 1) b.send(root, sum, last);
    }
    if (v == root && v != n - 1) b.recv(n - 1, b.slice_of(out, k), last);
  }
}

}  // namespace braid::collectives
