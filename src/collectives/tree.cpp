// Double binary tree all-reduce (Algorithm::tree), NCCL's construction (Sanders,
// Speck & Träff, "Two-tree algorithms for full bandwidth broadcast, reduction and
// scan", 2009; NCCL 2.4).
//
// Tree A is NCCL's in-order binary tree over ranks 0..n-1: a rank's lowest set bit b
// says its level; its parent is (r ^ b) | 2b (or r ^ b when that is out of range) and
// its children are r - b/2 and the largest r + b/2^j below n. Rank 0 is the root, with
// the single child 2^(ceil(log2 n) - 1). Tree B is A mirrored (r -> n-1-r) for even n
// or shifted by one (r -> r+1 mod n) for odd n, so that the leaves of one tree (half the
// ranks) are the inner nodes of the other: every rank does the heavy work in one tree
// only.
//
// Tree A carries the first half of the vector, tree B the second. In each tree the half
// is cut into S slices; slice k is reduced up the tree (a node adds its children's
// partial sums to its input, into its output, and sends the result to its parent; the
// root divides for avg), then broadcast down (a node receives the final slice from its
// parent and forwards it to its children). Slices follow each other, so with depth D
// the pipeline is full after about D slices.
//
// Message order: a pair of ranks can be linked in both trees, with one queue per
// direction carrying messages of both. Every message gets a time, the same for both
// ends: slice k leaves a node of height h (leaves 0) upwards at k + h, and leaves a node
// of depth d downwards at k + H + d (H the tree's height). Each rank emits its steps
// sorted by (time, up before down, tree, slice): a step's inputs always have earlier
// times, both ends of a queue see the same order, and no queue holds back a message
// behind one that becomes ready much later (ordering by slice alone would make tree A's
// pipeline wait for tree B's round trips).
//
// Per rank, with N the vector's bytes: an inner node of one tree (two children)
// receives N and sends N/2 up, receives N/2 and sends N down in it; as a leaf of the
// other tree it sends N/2 and receives N/2. So at most 2N sent and 2N received (ring:
// 2(n-1)/n·N), up to N reduced. With depth D ~ log2 n and S slices per half, time ~
// (2D + S)·α + 2N·β + 2D·(N/2S)·β + N·γ: log-depth latency for small N, about the
// ring's bandwidth for large N once S >> D.
#include "collectives/builder.hpp"

#include <tuple>

namespace braid::collectives {

namespace {

struct Tree {
  std::vector<int> parent;                 // -1 for the root
  std::vector<std::vector<int>> children;  // smaller first
  std::vector<int> height, depth;
  int root = 0;
};

// NCCL's ncclGetBtree for rank r of n (root 0).
void btree(int n, int r, int& up, std::vector<int>& down) {
  down.clear();
  int bit = 1;
  while (bit < n && !(bit & r)) bit <<= 1;
  if (r == 0) {
    up = -1;
    if (n > 1) down.push_back(bit >> 1);
    return;
  }
  up = (r ^ bit) | (bit << 1);
  if (up >= n) up = r ^ bit;
  const int low = bit >> 1;
  if (low == 0) return;
  down.push_back(r - low);
  for (int l = low; l > 0; l >>= 1)
    if (r + l < n) {
      down.push_back(r + l);
      break;
    }
}

// Tree 0 is the btree; tree 1 its mirror (even n) or shift (odd n).
Tree make_tree(int n, int which) {
  Tree t;
  const auto N = static_cast<std::size_t>(n);
  t.parent.assign(N, -1);
  t.children.assign(N, {});
  auto to_btree = [&](int r) { return which == 0 ? r : n % 2 ? (r + n - 1) % n : n - 1 - r; };
  auto from_btree = [&](int x) { return which == 0 ? x : n % 2 ? (x + 1) % n : n - 1 - x; };
  std::vector<int> down;
  for (int r = 0; r < n; ++r) {
    int up;
    btree(n, to_btree(r), up, down);
    t.parent[static_cast<std::size_t>(r)] = up < 0 ? -1 : from_btree(up);
    if (up < 0) t.root = r;
  }
  // Children from the parent links (NCCL's down links agree with them), smaller rank
  // of the btree first.
  for (int x = 0; x < n; ++x) {
    const int r = from_btree(x);
    const int p = t.parent[static_cast<std::size_t>(r)];
    if (p >= 0) t.children[static_cast<std::size_t>(p)].push_back(r);
  }
  t.depth.assign(N, 0);
  t.height.assign(N, 0);
  // Depth by walking up; height by walking down from the root in reverse BFS order.
  std::vector<int> order{t.root};
  for (std::size_t i = 0; i < order.size(); ++i)
    for (int c : t.children[static_cast<std::size_t>(order[i])]) {
      t.depth[static_cast<std::size_t>(c)] = t.depth[static_cast<std::size_t>(order[i])] + 1;
      order.push_back(c);
    }
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    for (int c : t.children[static_cast<std::size_t>(*it)])
      t.height[static_cast<std::size_t>(*it)] =
          std::max(t.height[static_cast<std::size_t>(*it)], t.height[static_cast<std::size_t>(c)] + 1);
  return t;
}

struct Event {
  std::uint64_t time;
  int down;  // 0 reduce up, 1 broadcast down
  int tree;
  std::uint64_t slice;
  int order;  // among this rank's steps of the same (time, phase, tree, slice)
  StepKind kind;
  int peer;
  Region src, dst;
  bool finalize;
  auto key() const { return std::tie(time, down, tree, slice, order); }
};

}  // namespace

void build_tree_allreduce(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const bool avg = req.op == ReduceOp::avg;
  const int n = req.world, me = req.rank;
  if (n == 1) {
    b.copy({Buffer::input, 0, req.count}, {Buffer::output, 0, req.count}, b.phase("local copy"), avg);
    return;
  }
  const std::uint32_t phase_up = b.phase("tree reduce"), phase_down = b.phase("tree broadcast");
  std::vector<Event> ev;
  for (int t = 0; t < 2; ++t) {
    const Tree tree = make_tree(n, t);
    const auto m = static_cast<std::size_t>(me);
    const std::uint64_t at = part_offset(req.count, 2, static_cast<std::uint64_t>(t));
    const std::uint64_t len = part_offset(req.count, 2, static_cast<std::uint64_t>(t) + 1) - at;
    const Region in{Buffer::input, at, len}, out{Buffer::output, at, len};
    // Children whose partial sums come first (lower subtrees) are reduced first.
    auto kids = tree.children[m];
    std::stable_sort(kids.begin(), kids.end(), [&](int x, int y) {
      return tree.height[static_cast<std::size_t>(x)] < tree.height[static_cast<std::size_t>(y)];
    });
    const int parent = tree.parent[m];
    const auto H = static_cast<std::uint64_t>(tree.height[static_cast<std::size_t>(tree.root)]);
    const auto h = static_cast<std::uint64_t>(tree.height[m]), d = static_cast<std::uint64_t>(tree.depth[m]);
    // Partial sums go to scratch, one buffer per child, so that no receive-and-reduce
    // reduces in place (those need one of the engine's few staging buffers each, and
    // holding them across the two trees can deadlock). A buffer is a pool of H + 2
    // slices: slice k reuses slice k - (H + 2)'s place, whose last use (the send to
    // the parent at time k - H - 2 + h) is then earlier than slice k's first one.
    const std::uint64_t slices = b.nslices(len), pool = std::min<std::uint64_t>(slices, H + 2);
    std::vector<std::uint64_t> buf(kids.size());
    for (auto& x : buf) x = b.scratch(pool * std::min(b.slice(), len));
    for (std::uint64_t k = 0; k < slices; ++k) {
      const Region i = b.slice_of(in, k), o = b.slice_of(out, k);
      auto partial = [&](std::size_t j) { return Region{Buffer::scratch, buf[j] + (k % pool) * b.slice(), i.count}; };
      for (std::size_t j = 0; j < kids.size(); ++j)
        ev.push_back({k + static_cast<std::uint64_t>(tree.height[static_cast<std::size_t>(kids[j])]), 0, t, k,
                      static_cast<int>(j), StepKind::recv_reduce, kids[j], j == 0 ? i : partial(j - 1), partial(j),
                      avg && parent < 0 && j + 1 == kids.size()});
      const Region sum = kids.empty() ? i : partial(kids.size() - 1);
      if (parent >= 0) {
        ev.push_back({k + h, 0, t, k, 2, StepKind::send, parent, sum, {}, false});
        ev.push_back({k + H + d - 1, 1, t, k, 0, StepKind::recv, parent, {}, o, false});
      } else {
        ev.push_back({k + H, 1, t, k, 0, StepKind::copy, -1, sum, o, false});
      }
      for (std::size_t j = 0; j < kids.size(); ++j)
        ev.push_back({k + H + d, 1, t, k, 1 + static_cast<int>(j), StepKind::send, kids[j], o, {}, false});
    }
  }
  std::sort(ev.begin(), ev.end(), [](const Event& x, const Event& y) { return x.key() < y.key(); });
  for (const Event& e : ev) {
    const std::uint32_t ph = e.down ? phase_down : phase_up;
    switch (e.kind) {
      case StepKind::send: b.send(e.peer, e.src, ph); break;
      case StepKind::recv: b.recv(e.peer, e.dst, ph); break;
      case StepKind::copy: b.copy(e.src, e.dst, ph); break;
      default: b.recv_reduce(e.peer, e.src, e.dst, ph, e.finalize); break;
    }
  }
}

}  // namespace braid::collectives
