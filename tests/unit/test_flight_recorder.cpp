// core::FlightRecorder and its dump (the engine's use of them is tested on real jobs in
// tests/python/test_trace.py, with braid_trace reading the files).
#include "core/flight_recorder.hpp"

#include <braid/error.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using braid::core::FlightRecorder;
using braid::core::TraceHeader;
using braid::core::TraceRecord;

void put(FlightRecorder& f, std::uint64_t seq) {
  braid::core::TraceEntry* e = f.next();
  ASSERT_NE(e, nullptr);
  e->seq = seq;
  e->set_call("allreduce #" + std::to_string(seq) + " (ring, 4 x f32, sum) on rank 0/2");
  e->algorithm = "ring";
  e->count = 4;
}

std::vector<std::uint64_t> seqs(const FlightRecorder& f) {
  std::vector<std::uint64_t> out;
  f.for_each([&](const TraceRecord& r) { out.push_back(r.seq); });
  return out;
}

TEST(FlightRecorder, KeepsTheLastOperationsOldestFirst) {
  FlightRecorder f(3);
  EXPECT_TRUE(seqs(f).empty());
  put(f, 1);
  put(f, 2);
  EXPECT_EQ(seqs(f), (std::vector<std::uint64_t>{1, 2}));
  put(f, 3);
  put(f, 4);
  put(f, 5);
  EXPECT_EQ(seqs(f), (std::vector<std::uint64_t>{3, 4, 5}));
  EXPECT_EQ(f.recorded(), 5u);
  EXPECT_EQ(f.capacity(), 3u);
}

TEST(FlightRecorder, CapacityZeroRecordsNothing) {
  FlightRecorder f(0);
  EXPECT_EQ(f.next(), nullptr);
  f.keep_ended(TraceRecord{});
  EXPECT_EQ(f.recorded(), 0u);
  EXPECT_TRUE(seqs(f).empty());
}

TEST(FlightRecorder, OperationsAFailureEndedComeAfterTheRingAndAreBounded) {
  FlightRecorder f(2);
  put(f, 1);
  for (std::uint64_t k = 0; k < FlightRecorder::kKeptEnded + 5; ++k) {
    TraceRecord r;
    r.state = TraceRecord::State::not_run;
    r.seq = 10 + k;
    f.keep_ended(std::move(r));
  }
  const auto got = seqs(f);
  ASSERT_EQ(got.size(), 1 + FlightRecorder::kKeptEnded);
  EXPECT_EQ(got[0], 1u);
  EXPECT_EQ(got[1], 10u);
  EXPECT_EQ(f.ended_not_kept(), 5u);
}

TEST(FlightRecorder, EntriesKeepTheCallAndRebuildTheName) {
  braid::core::TraceEntry e;
  e.set_call(std::string(500, 'x') + " #1");
  EXPECT_EQ(std::string(e.call).size(), braid::core::TraceEntry::kCallBytes - 1);
  EXPECT_EQ(std::string(e.call).substr(braid::core::TraceEntry::kCallBytes - 4), "...");
  e.set_call("broadcast (tuner trial) #9 (tree, 256 x f32, sum) on rank 0/3");
  e.seq = 9;
  e.algorithm = "tree";
  e.count = 256;
  EXPECT_EQ(e.name(), "broadcast (tuner trial) #9 (tree, 256 x f32, sum)");
  e.set_call("send #3 (64 x f64, tag 7) to rank 1 on rank 0/2");
  e.p2p_seq = 3;
  e.count = 64;
  e.dtype = braid::DataType::f64;
  e.root = 1;
  EXPECT_EQ(e.name(), "send #3 (64 x f64) to rank 1");
  e.set_call("tuner: verdict #12 on rank 0/2");
  e.task = true;
  e.seq = 12;
  EXPECT_EQ(e.name(), "tuner: verdict #12");
  braid::compression::CodecSpec c;
  c.kind = braid::compression::CodecKind::int8;
  c.block = 128;
  c.rounding = braid::compression::Rounding::stochastic;
  c.seed = 42;
  e.codec = c;
  EXPECT_EQ(braid::compression::name(e.codec.spec()), braid::compression::name(c));
}

TEST(FlightRecorder, DumpEscapesNamesAndGivesTheProgressOfUnfinishedOperations) {
  FlightRecorder f(4);
  put(f, 7);
  std::vector<TraceRecord> live(1);
  TraceRecord& r = live[0];
  r.state = TraceRecord::State::failed;
  r.seq = 8;
  r.name = "broadcast #8 (tree, 9 x f32, sum) on rank 0/2";
  r.root = 1;
  r.error = "a \"quoted\"\nreason\\";
  r.started = std::chrono::steady_clock::now();
  r.steps = 4;
  r.steps_done = 1;
  braid::core::PeerProgress p;
  p.rank = 1;
  p.recvs = 2;
  p.recvs_posted = 1;
  p.bytes_to_recv = 36;
  p.next_recv_step = 2;
  r.peers.push_back(p);
  TraceHeader h;
  h.rank = 0;
  h.size = 2;
  h.comm = "my comm";
  h.comm_id = 0xabc;
  h.reason = "timeout";
  const std::string j = braid::core::trace_json(h, f, live);
  EXPECT_NE(j.find("\"braid_trace\":1,\"rank\":0,\"size\":2,\"comm\":\"my comm\",\"comm_id\":\"0000000000000abc\""),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"state\":\"done\",\"seq\":7,\"call\":\"allreduce\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"state\":\"failed\",\"seq\":8,\"call\":\"broadcast\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"root\":1"), std::string::npos) << j;
  EXPECT_NE(j.find("\"error\":\"a \\\"quoted\\\"\\nreason\\\\\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"steps\":4,\"steps_done\":1,\"waiting_on\":[1]"), std::string::npos) << j;
  EXPECT_NE(j.find("\"bytes_to_recv\":36,\"bytes_received\":0,\"next_send_step\":-1,\"next_recv_step\":2"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"capacity\":4,\"recorded\":1"), std::string::npos) << j;
}

TEST(FlightRecorder, WritesOneFilePerRankAndCommunicatorAndNamesAPathItCannotWrite) {
  char tmpl[] = "/tmp/braid-trace-test.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/sub";  // made by write_trace
  TraceHeader h;
  h.rank = 3;
  h.comm = "a/b";
  h.comm_id = 1;
  const std::string path = braid::core::write_trace(dir, h, "{}\n");
  EXPECT_EQ(path, dir + "/braid_trace.a_b.0000000000000001.rank3.json");
  std::ifstream in(path);
  std::stringstream got;
  got << in.rdbuf();
  EXPECT_EQ(got.str(), "{}\n");
  std::remove(path.c_str());
  ::rmdir(dir.c_str());
  ::rmdir(tmpl);
  try {
    braid::core::write_trace("/proc/no-such-dir/x", h, "{}");
    FAIL() << "wrote into /proc";
  } catch (const braid::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/no-such-dir/x"), std::string::npos) << e.what();
  }
}

}  // namespace
