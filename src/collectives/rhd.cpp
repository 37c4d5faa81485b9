// Recursive halving-doubling all-reduce (Algorithm::rhd): Rabenseifner's algorithm,
// reduce-scatter by recursive halving then all-gather by recursive doubling, with
// MPICH's fold for world sizes that are not powers of two.
//
// Let p be the largest power of two <= n and rem = n - p. Fold: among the first 2·rem
// ranks, each even rank sends its whole input to the odd rank above it, which reduces
// it into its output, and sits out until the end; the other p ranks get new ranks 0..p-1
// (odd rank r -> r/2, rank r >= 2·rem -> r - rem). The vector is cut into p chunks.
//
// Reduce-scatter, for mask = p/2, p/4, ..., 1: a rank exchanges with new rank (v ^
// mask): of the chunks it still holds, the one whose bit `mask` is clear keeps the lower
// half and sends the upper half, the other the reverse; each reduces the half it keeps
// with the half it receives (dividing for avg at the last step). After log2 p steps new
// rank v holds chunk v fully reduced. All-gather replays the steps backwards, each rank
// sending what it holds and receiving what its partner holds. Finally each odd rank of
// the fold sends the whole result to the even rank below it. Every step is cut into
// slices, sent and reduced as they come, so a step's transfer and reduction overlap.
//
// Per rank (n = p): 2·(p-1)/p·N sent and received, (p-1)/p·N reduced, in 2·log2 p
// steps: time ~ 2·log2(p)·α + 2(p-1)/p·N·β + (p-1)/p·N·γ, the ring's bandwidth with
// log-depth latency, but partners far apart (mask p/2 first) cross hosts. Otherwise the
// 2·rem folded ranks add one N each way (and a reduction) before and after: + 2·α +
// 2N·β + N·γ on the critical path, while the even ranks of the fold move only N each
// way.
#include "collectives/builder.hpp"

namespace braid::collectives {

void build_rhd_allreduce(Builder& b) {
  const PlanRequest& req = b.req();
  if (req.count == 0) return;
  const bool avg = req.op == ReduceOp::avg;
  const int n = req.world, r = req.rank;
  const Region in{Buffer::input, 0, req.count}, out{Buffer::output, 0, req.count};
  if (n == 1) {
    b.copy(in, out, b.phase("local copy"), avg);
    return;
  }
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  const std::uint32_t fold = b.phase("fold"), halving = b.phase("recursive halving"),
                      doubling = b.phase("recursive doubling");
  auto sliced = [&](const Region& reg, auto&& f) {
    for (std::uint64_t k = 0; k < b.nslices(reg.count); ++k) f(b.slice_of(reg, k));
  };
  if (r < 2 * rem && r % 2 == 0) {  // folded away: hand over, wait for the result
    sliced(in, [&](const Region& s) { b.send(r + 1, s, fold); });
    sliced(out, [&](const Region& s) { b.recv(r + 1, s, fold); });
    return;
  }
  bool have_out = false;  // whether this rank's partial sums are in its output yet
  if (r < 2 * rem) {
    sliced(in, [&](const Region& s) { b.recv_reduce(r - 1, s, Region{Buffer::output, s.offset, s.count}, fold); });
    have_out = true;
  }
  const int v = r < 2 * rem ? r / 2 : r - rem;
  auto real = [&](int w) { return w < rem ? 2 * w + 1 : w + rem; };
  const auto P = static_cast<std::uint64_t>(p);
  auto chunks = [&](Buffer buf, std::uint64_t lo, std::uint64_t hi) {
    const std::uint64_t at = part_offset(req.count, P, lo);
    return Region{buf, at, part_offset(req.count, P, hi) - at};
  };
  struct Exchange {
    int peer;
    std::uint64_t keep_lo, keep_hi, give_lo, give_hi;
  };
  std::vector<Exchange> steps;
  std::uint64_t lo = 0, hi = P;
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    const std::uint64_t mid = (lo + hi) / 2;
    Exchange e{real(v ^ mask), lo, mid, mid, hi};
    if (v & mask) e = {e.peer, mid, hi, lo, mid};
    const bool last = mask == 1;
    const Region give = chunks(have_out ? Buffer::output : Buffer::input, e.give_lo, e.give_hi);
    const Region mine = chunks(have_out ? Buffer::output : Buffer::input, e.keep_lo, e.keep_hi);
    const Region into = chunks(Buffer::output, e.keep_lo, e.keep_hi);
    for (std::uint64_t k = 0; k < std::max(b.nslices(give.count), b.nslices(into.count)); ++k) {
      b.send(e.peer, b.slice_of(give, k), halving);
      b.recv_reduce(e.peer, b.slice_of(mine, k), b.slice_of(into, k), halving, avg && last);
    }
    have_out = true;
    lo = e.keep_lo;
    hi = e.keep_hi;
    steps.push_back(e);
  }
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const Region give = chunks(Buffer::output, it->keep_lo, it->keep_hi);
    const Region take = chunks(Buffer::output, it->give_lo, it->give_hi);
    for (std::uint64_t k = 0; k < std::max(b.nslices(give.count), b.nslices(take.count)); ++k) {
      b.send(it->peer, b.slice_of(give, k), doubling);
      b.recv(it->peer, b.slice_of(take, k), doubling);
    }
  }
  if (r < 2 * rem) sliced(out, [&](const Region& s) { b.send(r - 1, s, fold); });
}

}  // namespace braid::collectives
