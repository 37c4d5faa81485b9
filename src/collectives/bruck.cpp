// Log-latency all-gather and reduce-scatter for small messages: Bruck's all-gather and its
// transpose (Algorithm::rhd, plan name "bruck"; Bruck et al., "Efficient algorithms for
// all-to-all communications in multiport message-passing systems", 1997; MPICH's and Open
// MPI's allgather for small messages at any world size).
//
// All-gather: with d = 1, 2, 4, ... < n, rank r sends the blocks it has, absolute blocks
// r .. r+cnt-1 (mod n, cnt = min(d, n-d)), to rank r-d and receives blocks r+d .. r+d+cnt-1
// from rank r+d, straight into its output. After the step with distance d it holds blocks
// r .. r+2d-1, so ceil(log2 n) steps gather all n. A range that wraps past block n-1 goes as
// two messages, and since sender and receiver name the same absolute blocks, both split it
// at the same place.
//
// Reduce-scatter is the same exchange transposed and run backwards: every rank starts with
// its whole input as partial sums (one local copy into scratch), then for d from the largest
// down to 1 it sends its partial sums of blocks r+d .. r+d+cnt-1 to rank r+d and reduces
// rank r-d's partial sums of blocks r .. r+cnt-1 into its own. A block is sent only at the
// step of its offset's highest bit, after every step that reduced into it, and each rank's
// contribution reaches each block's owner once (the transpose of the all-gather's delivery
// tree); block r, never sent, ends as the full reduction, copied to the output (avg divided
// there).
//
// Per rank: ceil(log2 n) steps (up to two messages each), (n-1)·N bytes each way, as the
// ring; reduce-scatter adds n·N of scratch and a local copy of it. Time ~ ceil(log2 n)·α +
// (n-1)/n·N_total·β: fewer latencies than the ring's n-1, no pipelining, so the tuner
// prices both (the cost model) and takes this one for small messages.
#include "collectives/builder.hpp"

#include <vector>

namespace braid::collectives {

namespace {

// Absolute blocks start .. start+cnt-1 (mod n) of `buf` as up to two regions, in that order.
std::vector<Region> blocks(Buffer buf, std::uint64_t start, std::uint64_t cnt, std::uint64_t n, std::uint64_t c) {
  std::vector<Region> out;
  const std::uint64_t first = std::min(cnt, n - start);
  out.push_back({buf, start * c, first * c});
  if (first < cnt) out.push_back({buf, 0, (cnt - first) * c});
  return out;
}

}  // namespace

void build_bruck_allgather(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const std::uint64_t c = req.count, n = static_cast<std::uint64_t>(req.world), r = static_cast<std::uint64_t>(req.rank);
  b.copy({Buffer::input, 0, c}, {Buffer::output, r * c, c}, b.phase("local copy"));
  const std::uint32_t ph = b.phase("bruck all-gather");
  for (std::uint64_t d = 1; d < n; d *= 2) {
    const std::uint64_t cnt = std::min(d, n - d);
    const int to = static_cast<int>((r + n - d) % n), from = static_cast<int>((r + d) % n);
    for (const Region& g : blocks(Buffer::output, r, cnt, n, c)) b.send(to, g, ph);
    for (const Region& g : blocks(Buffer::output, (r + d) % n, cnt, n, c)) b.recv(from, g, ph);
  }
}

void build_bruck_reduce_scatter(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const std::uint64_t c = req.count, n = static_cast<std::uint64_t>(req.world), r = static_cast<std::uint64_t>(req.rank);
  const std::uint64_t acc = b.scratch(n * c);
  const std::uint32_t local = b.phase("local copy"), ph = b.phase("bruck reduce-scatter");
  b.copy({Buffer::input, 0, n * c}, {Buffer::scratch, acc, n * c}, local);
  std::uint64_t top = 1;
  while (top * 2 < n) top *= 2;
  for (std::uint64_t d = n > 1 ? top : 0; d >= 1; d /= 2) {
    const std::uint64_t cnt = std::min(d, n - d);
    const int to = static_cast<int>((r + d) % n), from = static_cast<int>((r + n - d) % n);
    for (Region g : blocks(Buffer::scratch, (r + d) % n, cnt, n, c)) {
      g.offset += acc;
      b.send(to, g, ph);
    }
    for (Region g : blocks(Buffer::scratch, r, cnt, n, c)) {
      g.offset += acc;
      b.recv_reduce(from, g, g, ph);
    }
  }
  b.copy({Buffer::scratch, acc + r * c, c}, {Buffer::output, 0, c}, local, req.op == ReduceOp::avg);
}

}  // namespace braid::collectives
