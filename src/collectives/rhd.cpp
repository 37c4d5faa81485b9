// Recursive halving-doubling all-reduce (Algorithm::rhd): Rabenseifner's algorithm,
// reduce-scatter by recursive halving then all-gather by recursive doubling, with
// MPICH's fold for world sizes that are not powers of two.
//
// Let p be the largest power of two <= n and rem = n - p. Fold: among the first 2·rem
// ranks, each even rank sends its whole input to the odd rank above it, which reduces
// it into its output, and sits out until the end; the other p ranks get new ranks 0..p-1
// (odd rank r -> r/2, rank r >= 2·rem -> r - rem). The vector is cut into p chunks.
//
// Reduce-scatter, for mask = 1, 2, ..., p/2 (MPICH's order): a rank exchanges with
// new rank (v ^ mask): of the chunks it still holds, the one whose bit `mask` is clear
// keeps the lower half and sends the upper half, the other the reverse; each reduces
// the half it keeps with the half it receives (dividing for avg at the last step).
// After log2 p steps each new rank holds one chunk fully reduced. Nearest partners
// come first, so the biggest exchange (N/2) stays between neighbouring ranks, usually
// on one host, and only the small late ones cross hosts. All-gather replays the steps
// backwards, each rank sending what it holds and receiving what its partner holds.
// Finally each odd rank of the fold sends the whole result to the even rank below it.
//
// Pipelining across steps: every exchange is cut into slices, reduced as they come,
// and ordered so that what the next step needs arrives first. In reduce-scatter a rank
// receives first the quarter it will hand on in the next step, then the eighth it hands
// on after that, ..., its own chunk last; in all-gather it sends first what it has held
// longest (its chunk, then what came in step by step). Both ends derive the order from
// the receiving rank's number, so messages still match.
//
// Per rank (n = p): 2·(p-1)/p·N sent and received, (p-1)/p·N reduced, in 2·log2 p
// steps: time ~ 2·log2(p)·α + 2(p-1)/p·N·β + (p-1)/p·N·γ, the ring's bandwidth with
// log-depth latency. Otherwise the 2·rem folded ranks add one N each way (and a
// reduction) before and after: + 2·α + 2N·β + N·γ on the critical path, while the
// even ranks of the fold move only N each way.
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
  struct Range {
    std::uint64_t lo, hi;  // chunks
  };
  struct Level {
    int mask;
    Range keep, give;
  };
  // The halving steps of new rank w.
  auto levels = [&](int w) {
    std::vector<Level> lv;
    Range cur{0, P};
    for (int mask = 1; mask < p; mask *= 2) {
      const std::uint64_t mid = (cur.lo + cur.hi) / 2;
      const Range lower{cur.lo, mid}, upper{mid, cur.hi};
      lv.push_back(w & mask ? Level{mask, upper, lower} : Level{mask, lower, upper});
      cur = lv.back().keep;
    }
    return lv;
  };
  // The order in which w receives its kept half at halving step j: what it hands on
  // next first, its own chunk last.
  auto halving_order = [&](int w, std::size_t j) {
    const auto lv = levels(w);
    std::vector<Range> order;
    for (std::size_t i = j + 1; i < lv.size(); ++i) order.push_back(lv[i].give);
    order.push_back(lv.back().keep);
    return order;
  };
  // The order in which w sends what it holds at doubling step j (the replay of halving
  // step j): its own chunk first, then what it received in the doubling steps before.
  auto doubling_order = [&](int w, std::size_t j) {
    const auto lv = levels(w);
    std::vector<Range> order{lv.back().keep};
    for (std::size_t i = lv.size() - 1; i > j; --i) order.push_back(lv[i].give);
    return order;
  };
  auto slices_of = [&](Buffer buf, const std::vector<Range>& ranges) {
    std::vector<Region> slices;
    for (const Range& rg : ranges) {
      const std::uint64_t at = part_offset(req.count, P, rg.lo);
      const Region reg{buf, at, part_offset(req.count, P, rg.hi) - at};
      for (std::uint64_t k = 0; k < b.nslices(reg.count); ++k) slices.push_back(b.slice_of(reg, k));
    }
    return slices;
  };
  const auto mine = levels(v);
  for (std::size_t j = 0; j < mine.size(); ++j) {
    const int u = v ^ mine[j].mask;
    const bool last = j + 1 == mine.size();
    const Buffer from = have_out ? Buffer::output : Buffer::input;
    const auto give = slices_of(from, halving_order(u, j));
    const auto keep = slices_of(Buffer::output, halving_order(v, j));
    for (std::size_t k = 0; k < std::max(give.size(), keep.size()); ++k) {
      if (k < give.size()) b.send(real(u), give[k], halving);
      if (k < keep.size())
        b.recv_reduce(real(u), Region{from, keep[k].offset, keep[k].count}, keep[k], halving, avg && last);
    }
    have_out = true;
  }
  for (std::size_t j = mine.size(); j-- > 0;) {
    const int u = v ^ mine[j].mask;
    const auto give = slices_of(Buffer::output, doubling_order(v, j));
    const auto take = slices_of(Buffer::output, doubling_order(u, j));
    for (std::size_t k = 0; k < std::max(give.size(), take.size()); ++k) {
      if (k < give.size()) b.send(real(u), give[k], doubling);
      if (k < take.size()) b.recv(real(u), take[k], doubling);
    }
  }
  if (r < 2 * rem) sliced(out, [&](const Region& s) { b.send(r - 1, s, fold); });
}

}  // namespace braid::collectives
