// braid — per-call options. Every collective takes one of these structs; every
// field has a default that defers to the communicator's configuration. New fields
// are only ever added at the end, so aggregate initialisation in user code keeps
// compiling.
#pragma once

#include <braid/types.hpp>

#include <chrono>
#include <string>

namespace braid {

/// Options shared by every collective.
struct CollectiveOptions {
  /// Deadline for this call; zero means the communicator's (BRAID_TIMEOUT).
  std::chrono::milliseconds timeout{0};
  /// CUDA stream (cudaStream_t) the call joins for device buffers; nullptr means
  /// the legacy default stream. Ignored for host buffers. With device buffers the call
  /// is ordered after the work already on this stream, and work enqueued on it afterwards
  /// sees the result, without the host waiting (docs/gpu.md).
  void* stream = nullptr;
  /// Where the buffers live: `automatic` asks the runtime (one pointer query per buffer);
  /// `host` skips the query; `device` insists on device memory of the communicator's GPU. Host and device buffers may not be mixed in one
  /// call.
  MemoryKind memory = MemoryKind::automatic;
};

/// Options of an all-reduce.
struct AllreduceOptions : CollectiveOptions {
  /// Algorithm to use; `automatic` defers to BRAID_ALGO, then to the tuner.
  Algorithm algorithm = Algorithm::automatic;
  /// Codec for compression inside the collective (docs/codecs.md): "" = BRAID_CODEC,
  /// "none", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "int4", "sign1", "mxfp8", "mxfp4",
  /// "topk:RATIO" or "auto" (compress only when the cost model says it is faster, with
  /// codecs inside BRAID_CODEC_MAX_ERROR), with optional suffixes such as ":sr"
  /// (stochastic rounding) or ":block=128". Compressed all-reduce takes f32 buffers,
  /// or bf16/f16 ones (f32 inside, the result rounded once to their type; docs/codecs.md),
  /// and sum or avg; the result is bitwise identical on every rank.
  std::string codec;
  /// Error-feedback bucket key: the library keeps this bucket's residuals (what the
  /// codec left out) and adds them to the next call with the same key. Use one key per
  /// gradient bucket, with the same count every time. Empty: no error feedback.
  std::string ef_key;
  /// Allow sign1 and topk without error feedback (they do not converge in general
  /// without it, so they are refused unless `ef_key` is set or this is true).
  bool allow_biased = false;
  /// Fixed reduction order (rank 0, 1, ..., n-1) so that results are bitwise identical
  /// whatever the algorithm and layout; also on with BRAID_DETERMINISTIC. Costs
  /// latency (see docs/algorithms.md).
  bool deterministic = false;
  /// ReduceOp::premul_sum's factor: every rank multiplies its input by it before the sum
  /// (ignored by the other operations). Integer types need an integral value that fits
  /// the type.
  double scale = 1.0;
};

/// Options of a broadcast. `root` is the rank whose buffer is sent.
struct BroadcastOptions : CollectiveOptions {
  /// Rank that holds the data.
  int root = 0;
};

/// Options of a reduce. `root` is the rank that receives the result.
struct ReduceOptions : CollectiveOptions {
  /// Rank that receives the result.
  int root = 0;
  /// Fixed reduction order (see AllreduceOptions::deterministic).
  bool deterministic = false;
  /// ReduceOp::premul_sum's factor: every rank multiplies its input by it before the sum
  /// (ignored by the other operations). Integer types need an integral value that fits
  /// the type.
  double scale = 1.0;
};

/// Options of an all-gather.
struct AllgatherOptions : CollectiveOptions {};

/// Options of a reduce-scatter.
struct ReduceScatterOptions : CollectiveOptions {
  /// Fixed reduction order (see AllreduceOptions::deterministic).
  bool deterministic = false;
  /// ReduceOp::premul_sum's factor: every rank multiplies its input by it before the sum
  /// (ignored by the other operations). Integer types need an integral value that fits
  /// the type.
  double scale = 1.0;
};

/// Options of an all-to-all.
struct AlltoallOptions : CollectiveOptions {};

/// Options of a gather. `root` is the rank that receives every block.
struct GatherOptions : CollectiveOptions {
  /// Rank that receives the blocks.
  int root = 0;
};

/// Options of a scatter. `root` is the rank whose blocks are sent.
struct ScatterOptions : CollectiveOptions {
  /// Rank that holds the blocks.
  int root = 0;
};

/// Options of a point-to-point send or receive.
struct P2POptions : CollectiveOptions {
  /// User tag to tell apart concurrent messages between the same pair.
  std::uint32_t tag = 0;
};

/// Options of a barrier.
struct BarrierOptions : CollectiveOptions {};

}  // namespace braid
