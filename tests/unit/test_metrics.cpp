// core::MetricsTable and the Prometheus text (the engine's counting and the HTTP endpoint
// are tested on real jobs in tests/python/test_trace.py).
#include "core/metrics.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace {

using braid::core::MetricsTable;
using namespace std::chrono_literals;

std::size_t occurrences(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(Metrics, CountsCallsBytesTimeAndErrorsPerKind) {
  MetricsTable t;
  braid::compression::CodecSpec none, int8;
  int8.kind = braid::compression::CodecKind::int8;
  auto& ring = t.series("allreduce", "ring", none);
  EXPECT_EQ(&t.series("allreduce", "ring", none), &ring);
  auto& compressed = t.series("allreduce", "two-phase", int8);
  EXPECT_NE(&compressed, &ring);
  t.count(ring, 4096, 4096, 1500ns, true);     // 2 us -> bucket 1
  t.count(ring, 4096, 4096, 1000ns, true);     // 1 us -> bucket 0
  t.count(ring, 4096, 4096, 3000000ns, true);  // 3000 us -> bucket 12 (<= 4096 us)
  t.count(ring, 0, 0, 0ns, false);
  t.count(compressed, 1 << 20, 1 << 18, 10ms, true);
  const braid::Metrics m = t.snapshot("c", 1, 4);
  ASSERT_EQ(m.operations.size(), 2u);
  const auto& r = m.operations[0];
  EXPECT_EQ(r.collective, "allreduce");
  EXPECT_EQ(r.algorithm, "ring");
  EXPECT_EQ(r.codec, "none");
  EXPECT_EQ(r.calls, 3u);
  EXPECT_EQ(r.errors, 1u);
  EXPECT_EQ(r.bytes, 3u * 4096);
  EXPECT_NEAR(r.seconds, 0.0030025, 1e-9);
  ASSERT_EQ(r.histogram.size(), static_cast<std::size_t>(braid::OperationMetrics::kBuckets));
  EXPECT_EQ(r.histogram[0], 1u);
  EXPECT_EQ(r.histogram[1], 1u);
  EXPECT_EQ(r.histogram[12], 1u);
  EXPECT_EQ(m.operations[1].codec, "int8");
  EXPECT_EQ(m.operations[1].wire_bytes, 1u << 18);
}

TEST(Metrics, AFullTableCountsTheRestAsOther) {
  MetricsTable t;
  braid::compression::CodecSpec none;
  static const char* names[MetricsTable::kMaxSeries + 10];
  static std::string storage[MetricsTable::kMaxSeries + 10];
  for (std::size_t i = 0; i < MetricsTable::kMaxSeries + 10; ++i) {
    storage[i] = "algo" + std::to_string(i);
    names[i] = storage[i].c_str();
    t.count(t.series("allreduce", names[i], none), 1, 1, 1us, true);
  }
  const braid::Metrics m = t.snapshot("c", 0, 2);
  ASSERT_EQ(m.operations.size(), MetricsTable::kMaxSeries);
  EXPECT_EQ(m.operations.back().algorithm, "other");
  EXPECT_EQ(m.operations.back().calls, 11u);
}

TEST(Metrics, PrometheusTextHasEachFamilyOnceAndCumulativeBuckets) {
  MetricsTable a, b;
  braid::compression::CodecSpec none;
  a.count(a.series("allreduce", "ring", none), 8, 8, 1500ns, true);
  a.count(a.series("allreduce", "ring", none), 8, 8, 500ns, true);
  b.count(b.series("send", "p2p", none), 8, 8, 1us, true);
  const std::string text = braid::core::prometheus_text({a.snapshot("w\"x", 0, 2), b.snapshot("y", 1, 2)});
  EXPECT_EQ(occurrences(text, "# TYPE braid_calls_total counter\n"), 1u) << text;
  EXPECT_EQ(occurrences(text, "# TYPE braid_seconds histogram\n"), 1u) << text;
  const std::string l = "comm=\"w\\\"x\",rank=\"0\",collective=\"allreduce\",algorithm=\"ring\",codec=\"none\"";
  EXPECT_NE(text.find("braid_calls_total{" + l + "} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("braid_seconds_bucket{" + l + ",le=\"1e-06\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("braid_seconds_bucket{" + l + ",le=\"2e-06\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("braid_seconds_bucket{" + l + ",le=\"+Inf\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("braid_seconds_count{" + l + "} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("braid_calls_total{comm=\"y\",rank=\"1\",collective=\"send\",algorithm=\"p2p\",codec=\"none\"} 1"),
            std::string::npos)
      << text;
}

}  // namespace
