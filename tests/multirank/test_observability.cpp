// The flight recorder, metrics and link report inside real jobs (forked ranks over the
// default transports), with other threads asking for dumps and snapshots while the engine
// runs: the paths ThreadSanitizer (scripts/tsan.sh) and ASan must see. braid_trace's
// verdicts on such dumps are tested in tests/python/test_trace.py and tests/cluster.
//
// Every test sets BRAID_TRACE_* in its forked children before they first read the
// configuration; the parent never makes a communicator (it would parse it first).
#include "test_support.hpp"

#include <braid/braid.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace braid;
using namespace std::chrono_literals;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The dump files in `dir` (names only).
std::vector<std::string> dumps_in(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("braid_trace.", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".json") out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

void remove_dir(const std::string& dir) {
  for (const auto& f : dumps_in(dir)) std::remove((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
}

// Collectives small (inline on the caller) and large (engine thread, link report) while a
// second thread asks for dumps and metrics as fast as it can; reports every second.
TEST(Observability, DumpsMetricsAndReportsWhileCollectivesRun) {
  const std::string path = braid::test::temp_path("obs-store");
  const std::string dir = braid::test::temp_path("obs-trace");
  braid::test::run_processes_ok(3, [&](int r) {
    ::setenv("BRAID_TRACE_DIR", dir.c_str(), 1);
    ::setenv("BRAID_REPORT_SECONDS", "1", 1);
    ::setenv("BRAID_TRACE_ENTRIES", "64", 1);
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 60s;
    Communicator c(store, r, 3, opt);
    std::atomic<bool> stop{false};
    std::atomic<int> dumps{0};
    std::thread asker([&] {
      while (!stop.load()) {
        const std::string d = c.dump_trace();
        if (d.find("\"braid_trace\":1") != std::string::npos) ++dumps;
        const Metrics m = c.metrics();
        if (m.prometheus().empty()) ADD_FAILURE() << "empty Prometheus text";
        std::this_thread::sleep_for(1ms);
      }
    });
    std::vector<float> small(1024, 1.f), large(1 << 18, 1.f);
    for (int i = 0; i < 300; ++i) {
      c.allreduce(small.data(), small.data(), small.size(), DataType::f32, ReduceOp::sum, {}).wait();
      if (i % 20 == 0) c.allreduce(large.data(), large.data(), large.size(), DataType::f32, ReduceOp::sum).wait();
    }
    std::this_thread::sleep_for(1100ms);  // a report is due
    c.allreduce(large.data(), large.data(), large.size(), DataType::f32, ReduceOp::sum).wait();
    stop = true;
    asker.join();
    EXPECT_GT(dumps.load(), 0);
    const Metrics m = c.metrics();
    std::uint64_t calls = 0;
    for (const auto& o : m.operations)
      if (o.collective == "allreduce" && o.codec == "none") calls += o.calls;
    EXPECT_GE(calls, 300u + 16u);  // tuner trials count too
    const std::string d = c.dump_trace();
    EXPECT_NE(d.find("\"capacity\":64"), std::string::npos) << d.substr(0, 400);
    EXPECT_NE(d.find("\"links\":[{\"peer\":"), std::string::npos) << d.substr(0, 600);
  });
  const auto files = dumps_in(dir);
  EXPECT_EQ(files.size(), 3u);
  for (const auto& f : files) {
    const std::string j = read_file(dir + "/" + f);
    EXPECT_NE(j.find("\"MBps\":"), std::string::npos) << f;
  }
  remove_dir(dir);
  std::remove(path.c_str());
}

// A rank that never comes: the others time out and each writes a dump that shows the
// collective failed, where it stood, and whom it waited on.
TEST(Observability, ATimeoutWritesADumpNamingThePeerWaitedOn) {
  const std::string path = braid::test::temp_path("obs-timeout-store");
  const std::string dir = braid::test::temp_path("obs-timeout-trace");
  braid::test::run_processes_ok(2, [&](int r) {
    ::setenv("BRAID_TRACE_DIR", dir.c_str(), 1);
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 30s;
    Communicator c(store, r, 2, opt);
    std::vector<float> x(1 << 16, 1.f);
    c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum).wait();
    if (r == 1) {
      std::this_thread::sleep_for(4s);  // not calling: rank 0 times out meanwhile
      return;
    }
    AllreduceOptions o;
    o.timeout = 1500ms;
    EXPECT_THROW(c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum, o).wait(), Error);
  });
  const auto files = dumps_in(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].find(".rank0.json"), std::string::npos) << files[0];
  const std::string j = read_file(dir + "/" + files[0]);
  EXPECT_NE(j.find("\"failed\":true"), std::string::npos) << j.substr(0, 600);
  EXPECT_NE(j.find("\"state\":\"failed\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"waiting_on\":[1]"), std::string::npos) << j;
  EXPECT_NE(j.find("timed out"), std::string::npos) << j;
  remove_dir(dir);
  std::remove(path.c_str());
}

}  // namespace
