// braid — Metrics: what a communicator has done since it was made, as counters and
// histograms (docs/observability.md).
#pragma once

#include <braid/export.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace braid {

/// One kind of operation of a communicator: a collective with one algorithm and codec
/// (tuner trials and the library's own calls included: they are traffic too), or sends,
/// or receives.
struct BRAID_API OperationMetrics {
  std::string collective;  ///< "allreduce", "broadcast", ..., "send", "recv"
  std::string algorithm;   ///< the plan's: "ring", "rhd", "two-phase", "p2p", ...
  std::string codec;       ///< "none", or the compression codec ("int8", ...)
  std::uint64_t calls = 0;       ///< completed
  std::uint64_t errors = 0;      ///< failed, timed out or aborted while running
  std::uint64_t bytes = 0;       ///< the callers' data: count x element size, summed
  std::uint64_t wire_bytes = 0;  ///< what this rank sent for them (compressed, for codecs)
  double seconds = 0;            ///< summed time from start to completion
  /// Calls by time: bucket k counts calls of at most 2^k microseconds (the last one: any
  /// longer), k = 0 .. kBuckets - 1.
  static constexpr int kBuckets = 28;
  std::vector<std::uint64_t> histogram;
};

/// A snapshot of a communicator's counters. Cheap to take; thread-safe.
struct BRAID_API Metrics {
  std::string comm;
  int rank = 0;
  int size = 1;
  std::vector<OperationMetrics> operations;
  /// The snapshot in Prometheus' text exposition format (version 0.0.4): families
  /// braid_calls_total, braid_errors_total, braid_bytes_total, braid_wire_bytes_total,
  /// braid_seconds (a histogram), labelled by comm, rank, collective, algorithm, codec.
  std::string prometheus() const;
};

}  // namespace braid
