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
  /// the legacy default stream. Ignored for host buffers.
  void* stream = nullptr;
};

/// Options of an all-reduce.
struct AllreduceOptions : CollectiveOptions {
  /// Algorithm to use; `automatic` defers to BRAID_ALGO, then to the tuner.
  Algorithm algorithm = Algorithm::automatic;
  /// Codec name for compression inside the collective ("" = BRAID_CODEC, "none" = off).
  /// Compression arrives with the compression issue; any value other than "", "none"
  /// is refused with Unsupported today.
  std::string codec;
  /// Error-feedback bucket key for biased codecs (see docs/codecs.md once present).
  std::string ef_key;
  /// Fixed reduction order (rank 0, 1, ..., n-1) so that results are bitwise identical
  /// whatever the algorithm and layout; also on with BRAID_DETERMINISTIC. Costs
  /// latency (see docs/algorithms.md).
  bool deterministic = false;
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
};

/// Options of an all-gather.
struct AllgatherOptions : CollectiveOptions {};

/// Options of a reduce-scatter.
struct ReduceScatterOptions : CollectiveOptions {
  /// Fixed reduction order (see AllreduceOptions::deterministic).
  bool deterministic = false;
};

/// Options of an all-to-all.
struct AlltoallOptions : CollectiveOptions {};

/// Options of a point-to-point send or receive.
struct P2POptions : CollectiveOptions {
  /// User tag to tell apart concurrent messages between the same pair.
  std::uint32_t tag = 0;
};

/// Options of a barrier.
struct BarrierOptions : CollectiveOptions {};

}  // namespace braid
