// Ring all-reduce: reduce-scatter followed by all-gather around the ring of ranks
// 0 -> 1 -> ... -> n-1 -> 0 (Patarasuk & Yuan; the schedule NCCL and Gloo use).
//
// The vector is cut into n chunks (sizes differ by at most one element). In
// reduce-scatter step s (0 <= s < n-1) rank r sends chunk (r - s) to its right and
// receives chunk (r - s - 1) from its left, adding its own input to it; after n-1
// steps rank r holds chunk (r + 1) fully reduced. In all-gather step s it sends
// chunk (r + 1 - s) and receives chunk (r - s), so that after n-1 more steps every
// rank holds every reduced chunk. Every rank ends with the owner's bytes, so results
// are bitwise identical on all ranks.
//
// Each chunk is further cut into slices of at most `slice_bytes`; a slice moves on
// as soon as it has been reduced, so sending, receiving and reducing overlap
// (pipelining). Each rank sends and receives 2(n-1)/n of the vector in 2(n-1)
// steps: time ~ 2(n-1)·α + 2(n-1)/n·N·β + (n-1)/n·N·γ.
#include "collectives/plan.hpp"

#include <algorithm>

namespace braid::collectives {

void build_ring_allreduce(const PlanRequest& req, Plan& plan) {
  plan.phase_names = {"reduce-scatter", "all-gather", "local copy"};
  const std::uint64_t n = static_cast<std::uint64_t>(req.world);
  const std::uint64_t r = static_cast<std::uint64_t>(req.rank);
  const bool avg = req.op == ReduceOp::avg;
  if (req.count == 0) return;
  if (n == 1) {
    Step s;
    s.kind = StepKind::copy;
    s.src = {Buffer::input, 0, req.count};
    s.dst = {Buffer::output, 0, req.count};
    s.finalize = avg;
    s.phase = 2;
    plan.add(s);
    return;
  }
  const int right = static_cast<int>((r + 1) % n);
  const int left = static_cast<int>((r + n - 1) % n);
  const std::uint64_t slice = std::max<std::uint64_t>(1, req.slice_bytes / std::max<std::size_t>(1, req.elem_size));

  auto chunk_begin = [&](std::uint64_t c) { return part_offset(req.count, n, c); };
  auto chunk_len = [&](std::uint64_t c) { return chunk_begin(c + 1) - chunk_begin(c); };
  auto nslices = [&](std::uint64_t c) { return (chunk_len(c) + slice - 1) / slice; };
  auto region = [&](Buffer b, std::uint64_t c, std::uint64_t k) {
    const std::uint64_t off = k * slice;
    return Region{b, chunk_begin(c) + off, std::min(slice, chunk_len(c) - off)};
  };

  // Index of the last step that wrote (reduced/received) or sent each slice of each
  // chunk, to chain dependencies.
  std::vector<std::vector<std::uint32_t>> written(n), sent(n);
  for (std::uint64_t c = 0; c < n; ++c) {
    written[c].assign(nslices(c), kNoStep);
    sent[c].assign(nslices(c), kNoStep);
  }

  // Reduce-scatter.
  for (std::uint64_t s = 0; s + 1 < n; ++s) {
    const std::uint64_t sc = (r + n - s) % n;
    const std::uint64_t rc = (r + 2 * n - s - 1) % n;
    const std::uint64_t ks = std::max(nslices(sc), nslices(rc));
    for (std::uint64_t k = 0; k < ks; ++k) {
      if (k < nslices(sc)) {
        Step st;
        st.kind = StepKind::send;
        st.peer = right;
        st.src = region(s == 0 ? Buffer::input : Buffer::output, sc, k);
        st.phase = 0;
        sent[sc][k] = plan.add(st, {written[sc][k]});
      }
      if (k < nslices(rc)) {
        Step st;
        st.kind = StepKind::recv_reduce;
        st.peer = left;
        st.src = region(Buffer::input, rc, k);
        st.dst = region(Buffer::output, rc, k);
        st.finalize = avg && s + 2 == n;
        st.phase = 0;
        written[rc][k] = plan.add(st, {sent[rc][k]});
      }
    }
  }
  // All-gather.
  for (std::uint64_t s = 0; s + 1 < n; ++s) {
    const std::uint64_t sc = (r + 1 + n - s) % n;
    const std::uint64_t rc = (r + n - s) % n;
    const std::uint64_t ks = std::max(nslices(sc), nslices(rc));
    for (std::uint64_t k = 0; k < ks; ++k) {
      if (k < nslices(sc)) {
        Step st;
        st.kind = StepKind::send;
        st.peer = right;
        st.src = region(Buffer::output, sc, k);
        st.phase = 1;
        sent[sc][k] = plan.add(st, {written[sc][k]});
      }
      if (k < nslices(rc)) {
        Step st;
        st.kind = StepKind::recv;
        st.peer = left;
        st.dst = region(Buffer::output, rc, k);
        st.phase = 1;
        // Must not overwrite a slice this rank is still sending (in-place buffers).
        written[rc][k] = plan.add(st, {sent[rc][k]});
      }
    }
  }
}

}  // namespace braid::collectives
