// Broadcast: every rank ends with the root's input. Two plans:
//
// Pipelined chain (Algorithm::ring), for large messages. The ranks in topology order,
// starting at the root, form a chain root -> c1 -> c2 -> ... -> c(n-1). The message is
// cut into S slices; each rank receives slice k from its predecessor into its output
// and forwards it to its successor as soon as it is in, so all links carry slices at
// once. Per rank: N bytes received (not the root) and N sent (not the last); time ~
// (n - 2 + S)·(α + N/S·β), i.e. N·β + (n-2)·N/S·β + (n-2+S)·α: bandwidth-optimal
// once S >> n.
//
// Binomial tree (Algorithm::tree), for small messages. With v the rank's distance from
// the root in that order, v's parent is v with its lowest set bit cleared and its
// children are v + 2^j for 2^j below that bit (every 2^j < n for the root), served
// largest subtree first. ceil(log2 n) rounds; a rank sends N to each child (the root
// sends ceil(log2 n)·N) and receives N once; time ~ ceil(log2 n)·(α + N·β). Slices
// pipeline down the tree as well.
//
// The root copies its input to its output (nothing to do in place). Non-roots never
// read their input (buffer_counts() gives them none).
#include "collectives/builder.hpp"

namespace braid::collectives {

void build_chain_broadcast(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const Ring chain = ring_from(req, req.root);
  const int v = chain.pos, n = chain.size();
  const int prev = v > 0 ? chain.ranks[static_cast<std::size_t>(v - 1)] : -1;
  const int next = v + 1 < n ? chain.ranks[static_cast<std::size_t>(v + 1)] : -1;
  const Region in{Buffer::input, 0, req.count}, out{Buffer::output, 0, req.count};
  const std::uint32_t ph = b.phase("chain");
  if (v == 0) b.copy(in, out, b.phase("local copy"));
  for (std::uint64_t k = 0; k < b.nslices(req.count); ++k) {
    if (v > 0) b.recv(prev, b.slice_of(out, k), ph);
    if (next >= 0) b.send(next, b.slice_of(v == 0 ? in : out, k), ph);
  }
}

void build_binomial_broadcast(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const Ring order = ring_from(req, req.root);
  const int v = order.pos, n = order.size();
  const Region in{Buffer::input, 0, req.count}, out{Buffer::output, 0, req.count};
  const std::uint32_t ph = b.phase("binomial tree");
  int low = 1;  // v's lowest set bit; for the root, the first power of two >= n
  while (v ? !(v & low) : low < n) low <<= 1;
  std::vector<int> children;  // largest subtree first
  for (int m = low >> 1; m >= 1; m >>= 1)
    if (v + m < n) children.push_back(order.ranks[static_cast<std::size_t>(v + m)]);
  if (v == 0) b.copy(in, out, b.phase("local copy"));
  for (std::uint64_t k = 0; k < b.nslices(req.count); ++k) {
    if (v > 0) b.recv(order.ranks[static_cast<std::size_t>(v & (v - 1))], b.slice_of(out, k), ph);
    for (int c : children) b.send(c, b.slice_of(v == 0 ? in : out, k), ph);
  }
}

}  // namespace braid::collectives
