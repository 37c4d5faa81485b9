// Builder: dependency derivation from regions, and the ring phases (see builder.hpp).
#include "collectives/builder.hpp"

#include <cstring>
#include <numeric>

namespace braid::collectives {

Builder::Builder(Plan& plan) : plan_(plan) {
  const PlanRequest& r = plan.request;
  slice_ = std::max<std::uint64_t>(1, r.slice_bytes / std::max<std::size_t>(1, r.elem_size));
  std::uint64_t mine = static_cast<std::uint64_t>(r.rank) * r.count;
  if (r.collective == Collective::allgatherv || r.collective == Collective::reduce_scatter_v)
    mine = rank_blocks(r).at[static_cast<std::size_t>(r.rank)];
  // In place, allgather's (and allgatherv's, and the gather root's) input is output[rank's
  // block]; reduce_scatter's (reduce_scatter_v's, the scatter root's) output is input[rank's
  // block]; the others alias element for element.
  if (r.collective == Collective::allgather || r.collective == Collective::allgatherv ||
      r.collective == Collective::gather)
    in_base_ = mine;
  if (r.collective == Collective::reduce_scatter || r.collective == Collective::reduce_scatter_v ||
      r.collective == Collective::scatter)
    out_base_ = mine;
  for (auto& s : spaces_) s.emplace(0, Seg{});
}

std::uint32_t Builder::phase(const char* name) {
  auto& names = plan_.phase_names;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (std::strcmp(names[i], name) == 0) return static_cast<std::uint32_t>(i);
  names.push_back(name);
  return static_cast<std::uint32_t>(names.size() - 1);
}

std::uint64_t Builder::scratch(std::uint64_t count) noexcept {
  const std::uint64_t at = plan_.scratch_count;
  plan_.scratch_count += count;
  return at;
}

std::uint64_t Builder::packed(std::uint64_t count) noexcept {
  const std::uint64_t f = std::max<std::uint64_t>(1, plan_.packed_frame);
  const std::uint64_t at = (plan_.packed_count + f - 1) / f * f;
  plan_.packed_count = at + count;
  return at;
}

Builder::Span Builder::span(const Region& r) const noexcept {
  switch (r.buf) {
    case Buffer::input: return {0, in_base_ + r.offset, in_base_ + r.offset + r.count};
    case Buffer::output: return {0, out_base_ + r.offset, out_base_ + r.offset + r.count};
    case Buffer::scratch: return {1, r.offset, r.offset + r.count};
    case Buffer::packed: return {2, r.offset, r.offset + r.count};
    case Buffer::feedback_worker: return {3, r.offset, r.offset + r.count};
    default: return {4, r.offset, r.offset + r.count};
  }
}

void Builder::split(Space& s, std::uint64_t at) {
  auto it = s.upper_bound(at);
  --it;  // the segment holding `at` (key 0 always exists)
  if (it->first != at) s.emplace_hint(std::next(it), at, it->second);
}

void Builder::hazards(const Region& r, bool write, std::vector<std::uint32_t>& deps) {
  const Span sp = span(r);
  Space& s = spaces_[sp.space];
  split(s, sp.begin);
  split(s, sp.end);
  for (auto it = s.find(sp.begin); it != s.end() && it->first < sp.end; ++it) {
    if (it->second.writer != kNoStep) deps.push_back(it->second.writer);
    if (write) deps.insert(deps.end(), it->second.readers.begin(), it->second.readers.end());
  }
}

void Builder::record(const Region& r, bool write, std::uint32_t step) {
  const Span sp = span(r);
  Space& s = spaces_[sp.space];
  for (auto it = s.find(sp.begin); it != s.end() && it->first < sp.end; ++it) {
    if (write) {
      it->second.writer = step;
      it->second.readers.clear();
    } else {
      it->second.readers.push_back(step);
    }
  }
}

std::uint32_t Builder::emit(const Step& s, std::initializer_list<const Region*> reads,
                            std::initializer_list<const Region*> writes, const std::vector<std::uint32_t>& after) {
  std::vector<std::uint32_t> deps(after);
  for (const Region* r : reads) hazards(*r, false, deps);
  for (const Region* w : writes) hazards(*w, true, deps);
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  const std::uint32_t i = plan_.add(s, deps);
  for (const Region* r : reads) record(*r, false, i);
  for (const Region* w : writes) record(*w, true, i);
  return i;
}

std::uint32_t Builder::send(int peer, const Region& src, std::uint32_t phase, const std::vector<std::uint32_t>& after) {
  if (src.count == 0) return kNoStep;
  return emit(Step(StepKind::send, peer, src, {}, false, phase), {&src}, {}, after);
}

std::uint32_t Builder::recv(int peer, const Region& dst, std::uint32_t phase, bool finalize,
                            const std::vector<std::uint32_t>& after) {
  if (dst.count == 0) return kNoStep;
  return emit(Step(StepKind::recv, peer, {}, dst, finalize, phase), {}, {&dst}, after);
}

std::uint32_t Builder::recv_reduce(int peer, const Region& src, const Region& dst, std::uint32_t phase, bool finalize,
                                   const std::vector<std::uint32_t>& after) {
  if (dst.count == 0) return kNoStep;
  return emit(Step(StepKind::recv_reduce, peer, src, dst, finalize, phase), {&src}, {&dst}, after);
}

std::uint32_t Builder::copy(const Region& src, const Region& dst, std::uint32_t phase, bool finalize) {
  if (dst.count == 0) return kNoStep;
  return emit(Step(StepKind::copy, -1, src, dst, finalize, phase), {&src}, {&dst}, {});
}

std::uint32_t Builder::reduce(const Region& a, const Region& b, const Region& dst, std::uint32_t phase, bool finalize) {
  if (dst.count == 0) return kNoStep;
  Step s(StepKind::reduce, -1, a, dst, finalize, phase);
  s.src2 = b;
  return emit(s, {&a, &b}, {&dst}, {});
}

std::uint32_t Builder::encode(const Region& src, const Region& residual, const Region& dst, std::uint8_t stream,
                              int stream_rank, std::uint64_t at, std::uint32_t phase) {
  if (src.count == 0) return kNoStep;
  Step s(StepKind::encode, -1, src, dst, false, phase);
  s.src2 = residual;
  s.stream = stream;
  s.stream_rank = stream_rank;
  s.at = at;
  // The residual (count 0: none) is read and rewritten: a write covers both hazards.
  return emit(s, {&src}, {&dst, &residual}, {});
}

std::uint32_t Builder::decode(const Region& src, const Region& dst, std::uint32_t phase, bool sum_start,
                              bool finalize) {
  if (dst.count == 0) return kNoStep;
  Step s(StepKind::decode, -1, src, dst, finalize, phase);
  s.sum_start = sum_start;
  return emit(s, {&src}, {&dst}, {});
}

std::uint32_t Builder::decode_add(const Region& src, const Region& dst, std::uint32_t phase, bool finalize) {
  if (dst.count == 0) return kNoStep;
  return emit(Step(StepKind::decode_add, -1, src, dst, finalize, phase), {&src, &dst}, {&dst}, {});
}

std::vector<int> topology_order(const PlanRequest& req) {
  std::vector<int> order(static_cast<std::size_t>(req.world));
  std::iota(order.begin(), order.end(), 0);
  const auto* host = req.host_of.get();
  if (host && host->size() == order.size())
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return (*host)[static_cast<std::size_t>(a)] < (*host)[static_cast<std::size_t>(b)];
    });
  return order;
}

bool host_rings(const PlanRequest& req, Ring& intra, Ring& inter) {
  const auto* host_of = req.host_of.get();
  if (!host_of || host_of->size() != static_cast<std::size_t>(req.world)) return false;
  std::map<int, std::vector<int>> by_host;  // host -> ranks, ascending
  for (int r = 0; r < req.world; ++r) by_host[(*host_of)[static_cast<std::size_t>(r)]].push_back(r);
  const std::size_t L = by_host.begin()->second.size();
  for (const auto& [h, ranks] : by_host)
    if (ranks.size() != L) return false;
  if (by_host.size() == 1 || L == 1) return false;
  intra = Ring{};
  inter = Ring{};
  intra.ranks = by_host[(*host_of)[static_cast<std::size_t>(req.rank)]];
  intra.pos = static_cast<int>(std::find(intra.ranks.begin(), intra.ranks.end(), req.rank) - intra.ranks.begin());
  const auto l = static_cast<std::size_t>(intra.pos);
  for (const auto& [h, ranks] : by_host) {
    if (ranks[l] == req.rank) inter.pos = inter.size();
    inter.ranks.push_back(ranks[l]);
  }
  return true;
}

Ring ring_from(const PlanRequest& req, int first) {
  Ring ring;
  const auto order = topology_order(req);
  const auto start = static_cast<std::size_t>(std::find(order.begin(), order.end(), first) - order.begin());
  for (std::size_t i = 0; i < order.size(); ++i) ring.ranks.push_back(order[(start + i) % order.size()]);
  ring.pos = static_cast<int>(std::find(ring.ranks.begin(), ring.ranks.end(), req.rank) - ring.ranks.begin());
  return ring;
}

void ring_reduce_scatter(Builder& b, const Ring& ring, const BlockFn& own, const BlockFn& partial,
                         const Region& owned, std::uint32_t phase, bool finalize) {
  const std::uint64_t m = static_cast<std::uint64_t>(ring.size()), p = static_cast<std::uint64_t>(ring.pos);
  if (m == 1) {
    b.copy(own(p), owned, phase, finalize);
    return;
  }
  const int right = ring.ranks[(p + 1) % m], left = ring.ranks[(p + m - 1) % m];
  for (std::uint64_t s = 0; s + 1 < m; ++s) {
    const std::uint64_t sb = (p + 2 * m - 1 - s) % m;  // block sent: reduced here at step s-1
    const std::uint64_t rb = (p + 2 * m - 2 - s) % m;  // block received: p at the last step
    const Region from = s == 0 ? own(sb) : partial(sb);
    const Region into = rb == p ? owned : partial(rb);
    const Region mine = own(rb);
    const std::uint64_t ks = std::max(b.nslices(from.count), b.nslices(into.count));
    for (std::uint64_t k = 0; k < ks; ++k) {
      b.send(right, b.slice_of(from, k), phase);
      b.recv_reduce(left, b.slice_of(mine, k), b.slice_of(into, k), phase, finalize && rb == p);
    }
  }
}

void ring_allgather(Builder& b, const Ring& ring, const BlockFn& at, std::uint32_t phase) {
  const std::uint64_t m = static_cast<std::uint64_t>(ring.size()), p = static_cast<std::uint64_t>(ring.pos);
  if (m == 1) return;
  const int right = ring.ranks[(p + 1) % m], left = ring.ranks[(p + m - 1) % m];
  for (std::uint64_t s = 0; s + 1 < m; ++s) {
    const Region from = at((p + m - s) % m), into = at((p + 2 * m - 1 - s) % m);
    const std::uint64_t ks = std::max(b.nslices(from.count), b.nslices(into.count));
    for (std::uint64_t k = 0; k < ks; ++k) {
      b.send(right, b.slice_of(from, k), phase);
      b.recv(left, b.slice_of(into, k), phase);
    }
  }
}

}  // namespace braid::collectives
