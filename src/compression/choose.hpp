// Resolving codec "auto": a small cost model that compresses only when it is faster.
//
// Model of one two-phase compressed all-reduce of n f32 values over W ranks on links of
// latency α (seconds per message) and bandwidth B (bytes/s), no overlap assumed (so it
// errs towards not compressing):
//   uncompressed: t0 = 2(W-1)·α + 2(W-1)/W * 4n / B                      (ring)
//   codec c:      tc = 2(W-1)·α + wire_bytes_per_rank(c) / B               (all-to-all + all-gather)
//                      + (n + n/W) * 4 / encode_rate(c)        worker shards + owner shard
//                      + 2n * 4 / decode_rate(c)                owner accumulate + all-gather decode
// where the rates are f32 bytes per second of the codec kernels on this host
// (measure_codec_rates, on buffers larger than the caches: the passes stream from
// memory in real use). `auto` picks the fastest candidate whose error_bound() is within
// the caller's budget, and only if it beats t0 by the margin (default 10%); else none.
// Compression cannot shorten the latency term, so latency-bound sizes stay uncompressed.
// Candidates never include codecs that need error feedback (sign1, topk).
//
// bf16/f16 buffers (elem_bytes 2): uncompressed moves 2 bytes per value, not 4, and a
// codec runs on an f32 copy (widened before, rounded back after; docs/codecs.md), so
//   t0 = 2(W-1)·α + 2(W-1)/W * 2n / B
//   tc = the codec's time above + n*4 / widen_rate + n*4 / narrow_rate
// with the conversions priced as the bf16 codec's decode and encode passes. The 16-bit
// codecs then never win (same bytes as uncompressed, more passes); int8 halves the bytes.
#pragma once

#include "compression/codec.hpp"

#include <cstddef>
#include <vector>

namespace braid::compression {

/// Measured kernel rates of one codec, in f32 (uncompressed) bytes per second.
struct CodecRates {
  CodecSpec spec;             ///< The codec.
  double encode_Bps = 0;      ///< encode() rate.
  double decode_Bps = 0;      ///< decode_accumulate() rate.
};

/// The codecs `auto` may choose from: bf16, fp16, fp8e4m3, int8, int4 (nearest rounding).
std::vector<CodecSpec> auto_candidates();

/// Times encode and decode_accumulate of every candidate on `count` values (default 4 Mi:
/// 16 MiB, beyond the caches, as the passes of a large all-reduce run; about 0.1 s in
/// all) on the calling thread; best of `reps`.
std::vector<CodecRates> measure_codec_rates(std::size_t count = std::size_t{1} << 22, int reps = 2);

/// The links the all-reduce runs over (the cost model's slowest link class).
struct LinkModel {
  double Bps = 0;      ///< Bandwidth, bytes per second (1 / β).
  double alpha_s = 0;  ///< Latency per message, seconds (α).
};

/// Predicted seconds of the compressed all-reduce with `rates.spec` (see the model above);
/// for 16-bit input, `widen` holds the rates its conversions to f32 and back are priced at.
double predicted_seconds(const CodecRates& rates, std::size_t count, int world, const LinkModel& link,
                         const CodecRates* widen = nullptr);

/// Predicted seconds of the uncompressed all-reduce of `count` values of `elem_bytes` each.
double predicted_seconds_uncompressed(std::size_t count, int world, const LinkModel& link,
                                      std::size_t elem_bytes = 4);

/// The codec for `auto`: the fastest candidate in `rates` with error_bound <= error_budget
/// that beats uncompressed by `margin` (0.10 = 10%); CodecKind::none otherwise, and for
/// world <= 1 or count 0. `elem_bytes`: 4 for f32 buffers, 2 for bf16/f16 (see above).
CodecSpec choose_auto(const std::vector<CodecRates>& rates, std::size_t count, int world, const LinkModel& link,
                      double error_budget, double margin = 0.10, std::size_t elem_bytes = 4);

}  // namespace braid::compression
