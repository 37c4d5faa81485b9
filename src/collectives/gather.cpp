// Gather and scatter, direct (the root exchanges one message with every other rank), as
// NCCL 2.28's ncclGather/ncclScatter and MPI's linear algorithms do.
//
// Gather: every rank but the root sends its block to the root; the root receives rank j's
// block into block j of its output and copies its own (in place, its input is that block
// already: the copy is of the block onto itself). Scatter is the mirror: the root sends
// block j of its input to rank j, which receives it into its output; the root copies its
// own block (in place, its output is that block of its input).
//
// Per call: the root moves (n-1)·count elements in n-1 messages, every other rank count
// elements in one. Time ~ (n-1)·α + (n-1)·N·β at the root (its link is the bottleneck:
// no algorithm moves fewer bytes through it); every message is posted at once, and
// the engine overlaps them.
#include "collectives/builder.hpp"

namespace braid::collectives {

void build_direct_gather(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const std::uint64_t c = req.count;
  const int n = req.world, root = req.root;
  const std::uint32_t ph = b.phase("to the root");
  if (req.rank != root) {
    b.send(root, {Buffer::input, 0, c}, ph);
    return;
  }
  b.copy({Buffer::input, 0, c}, {Buffer::output, static_cast<std::uint64_t>(root) * c, c}, b.phase("local copy"));
  for (int j = 0; j < n; ++j)
    if (j != root) b.recv(j, {Buffer::output, static_cast<std::uint64_t>(j) * c, c}, ph);
}

void build_direct_scatter(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const std::uint64_t c = req.count;
  const int n = req.world, root = req.root;
  const std::uint32_t ph = b.phase("from the root");
  if (req.rank != root) {
    b.recv(root, {Buffer::output, 0, c}, ph);
    return;
  }
  for (int j = 0; j < n; ++j)
    if (j != root) b.send(j, {Buffer::input, static_cast<std::uint64_t>(j) * c, c}, ph);
  b.copy({Buffer::input, static_cast<std::uint64_t>(root) * c, c}, {Buffer::output, 0, c}, b.phase("local copy"));
}

}  // namespace braid::collectives
