// Single-process reference of braid's compressed all-reduce (docs/codecs.md, "Compressed
// all-reduce"), over W simulated ranks. The communicator's multi-process implementation
// must match it element by element (bitwise, up to the sign of zero sums), so every
// arithmetic step here is the documented one, in the documented order:
//
// Two-phase (every codec but topk), step t, bucket of `count` f32 per rank:
//   1. Worker r, for each shard s (shard_range(count, W, s) = [b_s, e_s)):
//        payload[r][s] = encode(spec with seed = stream_seed(seed, r, 0), x_r[b_s..e_s) (+ worker
//                        residual), step t, offset b_s)        (residual updated in the same pass)
//   2. Owner s: acc = +0.0f; for r = 0 .. W-1: acc += decode(payload[r][s])  (f32, in rank order);
//        avg: acc = acc / float(W);
//        reduced[s] = encode(spec with seed = stream_seed(seed, s, 1), acc (+ owner residual),
//                            step t, offset b_s)
//   3. Every rank d, owner included: out_d[b_s..e_s) = decode(reduced[s]) for every s.
//   Each value is quantised twice (step 1 and step 2) whatever W is.
// topk (sparse all-gather): each rank r sends encode(topk, x_r (+ worker residual)) over the
//   whole bucket; every rank: out = +0.0f; for r = 0 .. W-1: out += sparse(payload[r]); avg:
//   out = out / float(W). Each value is quantised once (values travel as exact f32).
// Error feedback is used when a key is given: worker residuals over the whole bucket and,
// for two-phase, the owner residual over the owned shard, both in the rank's own store.
#pragma once

#include "compression/codec.hpp"
#include "compression/error_feedback.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace braid::compression {

/// Elements [begin, end) of one shard.
struct ShardRange {
  std::size_t begin = 0;  ///< First element.
  std::size_t end = 0;    ///< One past the last element.
  /// Number of elements.
  std::size_t size() const noexcept { return end - begin; }
};

/// The shard owned by `rank` of `world`: [floor(rank*count/world), floor((rank+1)*count/world)).
/// Shards tile [0, count) in rank order; sizes differ by at most one. world >= 1, 0 <= rank < world.
ShardRange shard_range(std::size_t count, int world, int rank) noexcept;

/// Phases of the two-phase all-reduce, for stream_spec().
enum class Phase : std::uint32_t {
  worker = 0,  ///< A rank encoding the shards of its own bucket.
  owner = 1    ///< The owner re-encoding its reduced shard.
};

/// `spec` with the seed the given rank and phase use: seed = kernels::stream_seed(spec.seed,
/// rank, phase). Only stochastic rounding reads it; the communicator must encode with this.
CodecSpec stream_spec(const CodecSpec& spec, int rank, Phase phase) noexcept;

/// One step of the reference.
struct ReferenceStep {
  CodecSpec spec;          ///< Concrete codec (not auto).
  bool average = false;    ///< ReduceOp::avg instead of sum.
  std::uint64_t step = 0;  ///< Training step (RNG counter).
  std::string key;         ///< Error-feedback bucket key; empty: no error feedback.
};

/// Runs the algorithm above. inputs[r] is rank r's bucket (all the same size); stores[r]
/// is rank r's residual store (required when step.key is non-empty, else ignored).
/// Returns each rank's output, computed separately per rank as the real ranks do.
std::vector<std::vector<float>> reference_allreduce(const ReferenceStep& step,
                                                    const std::vector<std::vector<float>>& inputs,
                                                    const std::vector<ErrorFeedbackStore*>& stores);

/// Bytes rank `rank` sends in one compressed all-reduce of `count` elements over `world`
/// ranks with direct (all-to-all / all-gather) exchanges: two-phase
///   sum_{s != rank} encoded_bytes(|shard s|) + (world-1) * encoded_bytes(|shard rank|);
/// topk: (world-1) * encoded_bytes(count).
std::size_t wire_bytes_per_rank(const CodecSpec& spec, std::size_t count, int world, int rank);

}  // namespace braid::compression
