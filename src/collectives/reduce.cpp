// Reduce: the root ends with the reduction of every rank's input. Two plans:
//
// Pipelined chain (Algorithm::ring), for large messages: the broadcast chain run
// backwards. In topology order starting at the root, c(n-1) sends its input to
// c(n-2), which adds its own input and forwards, ..., down to the root, which reduces
// the last message into its output (and divides by n for avg). The message is cut
// into S slices that flow one behind the other; intermediate ranks keep partial sums
// in a pool of up to 4 slices of scratch, reused once the slice that used it has been
// forwarded. Per rank: N bytes received and reduced (not the last), N sent (not the
// root); time ~ (n - 2 + S)·(α + N/S·(β + γ)).
//
// Binomial tree (Algorithm::tree), for small messages: the broadcast tree run
// backwards. A rank reduces its children's partial sums into an accumulator (the
// root's output, else N bytes of scratch), smallest subtree first, then sends it to
// its parent. ceil(log2 n) rounds; per rank at most ceil(log2 n)·N received and
// reduced, N sent; time ~ ceil(log2 n)·(α + N·β + N·γ).
//
// Non-roots never touch their output (buffer_counts() gives them none).
#include "collectives/builder.hpp"

namespace braid::collectives {

void build_chain_reduce(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const bool avg = req.op == ReduceOp::avg;
  const Ring chain = ring_from(req, req.root);
  const int v = chain.pos, n = chain.size();
  const Region in{Buffer::input, 0, req.count}, out{Buffer::output, 0, req.count};
  const std::uint32_t ph = b.phase("chain");
  if (n == 1) {
    b.copy(in, out, b.phase("local copy"), avg);
    return;
  }
  const int from = v + 1 < n ? chain.ranks[static_cast<std::size_t>(v + 1)] : -1;
  const int to = v > 0 ? chain.ranks[static_cast<std::size_t>(v - 1)] : -1;
  const std::uint64_t slices = b.nslices(req.count);
  const std::uint64_t pool = (v > 0 && from >= 0) ? std::min<std::uint64_t>(slices, 4) : 0;
  const std::uint64_t base = b.scratch(pool * std::min(b.slice(), req.count));
  for (std::uint64_t k = 0; k < slices; ++k) {
    const Region mine = b.slice_of(in, k);
    if (from < 0) {  // the chain's start
      b.send(to, mine, ph);
    } else if (to < 0) {  // the root
      b.recv_reduce(from, mine, b.slice_of(out, k), ph, avg);
    } else {
      const Region partial{Buffer::scratch, base + (k % pool) * b.slice(), mine.count};
      b.recv_reduce(from, mine, partial, ph);
      b.send(to, partial, ph);
    }
  }
}

void build_binomial_reduce(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const bool avg = req.op == ReduceOp::avg;
  const Ring order = ring_from(req, req.root);
  const int v = order.pos, n = order.size();
  const Region in{Buffer::input, 0, req.count};
  const std::uint32_t ph = b.phase("binomial tree");
  if (n == 1) {
    b.copy(in, {Buffer::output, 0, req.count}, b.phase("local copy"), avg);
    return;
  }
  int low = 1;
  while (v ? !(v & low) : low < n) low <<= 1;
  std::vector<int> children;  // smallest subtree first: its sum is ready first
  for (int m = 1; m < low; m <<= 1)
    if (v + m < n) children.push_back(order.ranks[static_cast<std::size_t>(v + m)]);
  Region acc = in;
  if (v == 0) acc = {Buffer::output, 0, req.count};
  else if (!children.empty()) acc = {Buffer::scratch, b.scratch(req.count), req.count};
  for (std::size_t j = 0; j < children.size(); ++j)
    for (std::uint64_t k = 0; k < b.nslices(req.count); ++k)
      b.recv_reduce(children[j], b.slice_of(j == 0 ? in : acc, k), b.slice_of(acc, k), ph,
                    avg && v == 0 && j + 1 == children.size());
  if (v > 0)
    for (std::uint64_t k = 0; k < b.nslices(req.count); ++k)
      b.send(order.ranks[static_cast<std::size_t>(v & (v - 1))], b.slice_of(acc, k), ph);
}

}  // namespace braid::collectives
