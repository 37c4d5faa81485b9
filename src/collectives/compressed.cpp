// Compressed all-reduce as a plan (PlanRequest::codec; DESIGN.md §6, docs/codecs.md).
//
// The arithmetic is compression/reference.hpp's, step for step, so that every rank's
// result equals the single-process reference bit for bit:
//
// two-phase (every codec but topk), over a group of W ranks (position p) and n values:
//   E  encode: every shard s = shard_range(n, W, s) of this rank's values (+ the worker
//      residual) into a payload for its owner (this rank's own shard straight into its
//      receive slot); RNG stream (worker, p), keyed on global indexes
//   A  all-to-all: payload s to the rank at position s
//   O  owner: acc = +0 + decode(payload of position 0), acc += decode(payload r) for
//      r = 1 .. W-1 (f32, in position order), avg divides here (finalize), then
//      encode(acc + owner residual) into this rank's all-gather slot; stream (owner, p)
//   G  all-gather of the reduced payloads
//   D  decode every reduced payload into the output (the owner decodes its own bytes
//      too, so every rank holds the same bits)
//   Each value is quantised twice, whatever W is.
// sparse all-gather (topk): encode the whole bucket (+ worker residual), all-gather the
//   payloads, out = +0 + decode(payload 0), out += decode(payload r) in rank order; each
//   value is quantised once.
// hierarchical two-phase (several hosts with the same number L > 1 of ranks each, not
//   topk): an uncompressed ring reduce-scatter inside the host (hierarchical.cpp's
//   blocks), the two-phase algorithm above on this rank's block among the ranks with
//   the same local index on every host (one per host; only these bytes cross hosts),
//   then an uncompressed ring all-gather inside the host.
//
// Pipelining: each shard is cut into about kPieces pieces (a multiple of the codec's
// block, at least kMinPiece values), and the phases of consecutive pieces are emitted
// interleaved, E0 A0 | E1 A1 O0 G0 | E2 A2 O1 G1 D0 | ..., so that the encoding of one
// piece runs while the previous one is on the wire. Every rank emits its messages in
// that order, which is what matches them (builder.hpp). On the host the owner works one
// frame (compression/framed.hpp, ~8 Ki values) at a time: W decodes and an encode over a
// cache-sized accumulator. On a device (PlanRequest::on_device) it works the whole piece
// per step, since each step is one launch there: W + 1 launches a piece, not W + 1 a frame.
#include "collectives/builder.hpp"
#include "compression/framed.hpp"
#include "compression/reference.hpp"

#include <algorithm>

namespace braid::collectives {

namespace {

using compression::CodecKind;
using compression::shard_range;

constexpr std::uint64_t kPieces = 16;
constexpr std::uint64_t kMinPiece = 64 * 1024;

Region sub(const Region& r, std::uint64_t at, std::uint64_t count) {
  return Region{r.buf, r.offset + at, at >= r.count ? 0 : std::min(count, r.count - at)};
}

// Two-phase all-reduce among `g` of the values x (global index of x's first value:
// `base`) into y (x's size; may be x itself). Avg divides at the owner (`finalize`).
void two_phase(Builder& b, const Ring& g, const Region& x, const Region& y, std::uint64_t base, bool finalize) {
  const PlanRequest& req = b.req();
  Plan& plan = b.plan();
  const auto W = static_cast<std::uint64_t>(g.size()), p = static_cast<std::uint64_t>(g.pos);
  const std::uint64_t n = x.count;
  if (n == 0) return;
  auto shard = [&](std::uint64_t s) { return shard_range(n, static_cast<int>(W), static_cast<int>(s)); };
  std::uint64_t max_shard = 0;
  for (std::uint64_t s = 0; s < W; ++s) max_shard = std::max<std::uint64_t>(max_shard, shard(s).size());
  const std::uint64_t unit = static_cast<std::uint64_t>(std::max(8, req.codec.block));
  std::uint64_t piece = std::max(kMinPiece, (max_shard + kPieces - 1) / kPieces);
  piece = (piece + unit - 1) / unit * unit;
  const std::uint64_t pieces = std::max<std::uint64_t>(1, (max_shard + piece - 1) / piece);
  const std::uint64_t frame = plan.packed_frame = compression::frame_values(req.codec, std::min(piece, max_shard));
  // Values [begin, begin + count) of piece c of shard s, relative to x.
  auto piece_of = [&](std::uint64_t s, std::uint64_t c) {
    const auto sr = shard(s);
    const std::uint64_t at = std::min<std::uint64_t>(sr.end, sr.begin + c * piece);
    return Region{x.buf, at, std::min<std::uint64_t>(sr.end, at + piece) - at};
  };
  // Packed slots per piece and position: outgoing (E -> A), incoming (A -> O; this
  // rank's own shard lands here directly) and reduced (O -> G -> D).
  std::vector<Region> out_slot(pieces * W), in_slot(pieces * W), red_slot(pieces * W);
  for (std::uint64_t c = 0; c < pieces; ++c)
    for (std::uint64_t s = 0; s < W; ++s) {
      const std::uint64_t k = c * W + s;
      const std::uint64_t len = piece_of(s, c).count;
      if (s != p) out_slot[k] = Region{Buffer::packed, b.packed(len), len};
      const std::uint64_t mine_len = piece_of(p, c).count;
      in_slot[k] = Region{Buffer::packed, b.packed(mine_len), mine_len};
      red_slot[k] = Region{Buffer::packed, b.packed(len), len};
    }
  const auto mine = shard(p);
  const std::uint64_t acc = b.scratch(mine.size());
  const bool fb = req.feedback;
  if (fb) {
    plan.feedback_count[0] = n;
    plan.feedback_count[1] = mine.size();
  }
  const std::uint32_t ph_e = b.phase("encode"), ph_a = b.phase("all-to-all"), ph_o = b.phase("owner sum"),
                      ph_g = b.phase("all-gather"), ph_d = b.phase("decode");
  const int pos = g.pos;
  for (std::uint64_t c = 0; c <= pieces + 1; ++c) {
    if (c < pieces) {
      for (std::uint64_t k = 1; k <= W; ++k) {  // own shard last: it is needed last
        const std::uint64_t s = (p + k) % W;
        const Region src = piece_of(s, c);
        const Region res = fb ? Region{Buffer::feedback_worker, src.offset, src.count} : Region{};
        const Region dst = s == p ? in_slot[c * W + p] : out_slot[c * W + s];
        b.encode(Region{x.buf, x.offset + src.offset, src.count}, res, dst, 0, pos, base + src.offset, ph_e);
      }
      for (std::uint64_t k = 1; k < W; ++k) {
        const std::uint64_t to = (p + k) % W, from = (p + W - k) % W;
        b.send(g.ranks[to], out_slot[c * W + to], ph_a);
        b.recv(g.ranks[from], in_slot[c * W + from], ph_a);
      }
    }
    if (c >= 1 && c <= pieces) {
      const std::uint64_t q = c - 1;
      const Region pr = piece_of(p, q);
      const std::uint64_t span = req.on_device ? std::max<std::uint64_t>(pr.count, 1) : frame;
      for (std::uint64_t f = 0; f < pr.count; f += span) {
        const std::uint64_t len = std::min(span, pr.count - f);
        const std::uint64_t rel = pr.offset - mine.begin + f;  // in the shard
        const Region a{Buffer::scratch, acc + rel, len};
        for (std::uint64_t r = 0; r < W; ++r) {
          const Region from = sub(in_slot[q * W + r], f, len);
          const bool last = r + 1 == W;
          if (r == 0)
            b.decode(from, a, ph_o, true, finalize && last);
          else
            b.decode_add(from, a, ph_o, finalize && last);
        }
        const Region res = fb ? Region{Buffer::feedback_owner, rel, len} : Region{};
        b.encode(a, res, sub(red_slot[q * W + p], f, len), 1, pos, base + pr.offset + f, ph_o);
      }
      for (std::uint64_t k = 1; k < W; ++k) {
        const std::uint64_t to = (p + k) % W, from = (p + W - k) % W;
        b.send(g.ranks[to], red_slot[q * W + p], ph_g);
        b.recv(g.ranks[from], red_slot[q * W + from], ph_g);
      }
    }
    if (c >= 2) {
      const std::uint64_t q = c - 2;
      for (std::uint64_t s = 0; s < W; ++s) {
        const Region pr = piece_of(s, q);
        b.decode(red_slot[q * W + s], Region{y.buf, y.offset + pr.offset, pr.count}, ph_d, false);
      }
    }
  }
}

// topk: every rank's sparse payload to every rank, summed in rank order.
void sparse_allgather(Builder& b) {
  const PlanRequest& req = b.req();
  Plan& plan = b.plan();
  const std::uint64_t n = req.count, W = static_cast<std::uint64_t>(req.world);
  const auto p = static_cast<std::uint64_t>(req.rank);
  if (n == 0) return;
  std::vector<Region> slot(W);
  for (std::uint64_t r = 0; r < W; ++r) slot[r] = Region{Buffer::packed, b.packed(n), n};
  if (req.feedback) plan.feedback_count[0] = n;
  const std::uint32_t ph_e = b.phase("encode"), ph_g = b.phase("all-gather"), ph_d = b.phase("sum");
  const Region res = req.feedback ? Region{Buffer::feedback_worker, 0, n} : Region{};
  b.encode(Region{Buffer::input, 0, n}, res, slot[p], 0, req.rank, 0, ph_e);
  for (std::uint64_t k = 1; k < W; ++k) {
    const std::uint64_t to = (p + k) % W, from = (p + W - k) % W;
    b.send(static_cast<int>(to), slot[p], ph_g);
    b.recv(static_cast<int>(from), slot[from], ph_g);
  }
  const bool avg = req.op == ReduceOp::avg;
  const Region out{Buffer::output, 0, n};
  for (std::uint64_t r = 0; r < W; ++r) {
    const bool last = r + 1 == W;
    if (r == 0)
      b.decode(slot[0], out, ph_d, true, avg && last);
    else
      b.decode_add(slot[r], out, ph_d, avg && last);
  }
}

}  // namespace

void build_compressed_allreduce(Builder& b) {
  Plan& plan = b.plan();
  const PlanRequest& req = b.req();
  const bool avg = req.op == ReduceOp::avg;
  if (req.codec.kind == CodecKind::topk) {
    plan.label = "sparse all-gather";
    plan.packed_frame = compression::frame_values(req.codec, req.count);
    sparse_allgather(b);
    return;
  }
  Ring intra, inter;
  if (host_rings(req, intra, inter)) {
    plan.label = "hierarchical two-phase";
    if (req.count == 0) return;
    const auto L = static_cast<std::uint64_t>(intra.size());
    auto block = [&](Buffer buf, std::uint64_t i) {
      const std::uint64_t at = part_offset(req.count, L, i);
      return Region{buf, at, part_offset(req.count, L, i + 1) - at};
    };
    const Region mine = block(Buffer::output, static_cast<std::uint64_t>(intra.pos));
    auto out_block = [&](std::uint64_t i) { return block(Buffer::output, i); };
    ring_reduce_scatter(
        b, intra, [&](std::uint64_t i) { return block(Buffer::input, i); }, out_block, mine,
        b.phase("intra-host reduce-scatter"), false);
    two_phase(b, inter, mine, mine, mine.offset, avg);
    ring_allgather(b, intra, out_block, b.phase("intra-host all-gather"));
    return;
  }
  plan.label = "two-phase";
  Ring all;
  for (int r = 0; r < req.world; ++r) all.ranks.push_back(r);
  all.pos = req.rank;
  two_phase(b, all, Region{Buffer::input, 0, req.count}, Region{Buffer::output, 0, req.count}, 0, avg);
}

}  // namespace braid::collectives
