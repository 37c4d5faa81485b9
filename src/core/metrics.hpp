// braid's counters: calls, bytes, time and errors per kind of operation of a communicator
// (braid::Metrics), kept by the engine and exported in Prometheus' text format.
//
// One writer, the engine's driving thread, which updates a series with relaxed atomic
// stores (no locked instruction: a 4 KiB all-reduce pays a few plain stores); any thread
// may take a snapshot. Series are made on first use in a fixed array, so a reader never
// sees one move. BRAID_METRICS_PORT serves every communicator of the process over HTTP on
// 127.0.0.1 (port + local rank), off by default.
#pragma once

#include "compression/codec.hpp"

#include <braid/metrics.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace braid::core {

/// Counters of one kind of operation.
struct MetricSeries {
  const char* collective = "";
  const char* algorithm = "";
  compression::CodecSpec codec;
  std::string codec_name;
  std::atomic<std::uint64_t> calls{0}, errors{0}, bytes{0}, wire_bytes{0}, nanos{0};
  std::array<std::atomic<std::uint64_t>, OperationMetrics::kBuckets> histogram{};
};

class MetricsTable {
 public:
  static constexpr std::size_t kMaxSeries = 128;
  MetricsTable();
  /// The series of this kind, made on first use (when the table is full, the last one,
  /// labelled "other"). Writer only.
  MetricSeries& series(const char* collective, const char* algorithm, const compression::CodecSpec& codec);
  /// Counts one completed (ok) or failed operation. Writer only.
  void count(MetricSeries& s, std::uint64_t bytes, std::uint64_t wire_bytes, std::chrono::nanoseconds took,
             bool ok) noexcept;
  /// Any thread.
  Metrics snapshot(const std::string& comm, int rank, int size) const;

 private:
  std::unique_ptr<MetricSeries[]> series_;
  std::atomic<std::size_t> count_{0};
  MetricSeries* last_ = nullptr;  ///< the previous call's: a loop of one kind finds it at once
};

/// Prometheus' text format of several communicators' snapshots (each family once).
std::string prometheus_text(const std::vector<Metrics>& all);

/// The process's HTTP endpoint (BRAID_METRICS_PORT): serves the snapshots of every added
/// source at /metrics (any path), started on the first add. `port` 0: nothing. Returns
/// a handle for remove_metrics_source (-1 when nothing was added). Thread-safe.
int add_metrics_source(int port, std::function<Metrics()> source);
void remove_metrics_source(int handle) noexcept;

}  // namespace braid::core
