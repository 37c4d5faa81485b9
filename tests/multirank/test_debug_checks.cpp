// BRAID_CHECK_ARGS (debug mode). Kept in its own binary: the variable must be set
// before the process first reads its configuration, and forked children inherit the
// parent's parsed configuration, so no other test here may create a communicator first.
#include "test_support.hpp"

#include <braid/braid.hpp>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

using namespace braid;
using namespace std::chrono_literals;
using braid::test::run_processes;

namespace {
// BRAID_CHECK_ARGS: mismatched calls fail on every rank with InvalidUsage naming the
// rank that differs. The variable must be set before the process first reads its
// configuration, so this runs in fresh forked children.
TEST(DebugChecks, MismatchedCallsAreNamed) {
  const std::string path = braid::test::temp_path("check");
  const auto st = run_processes(3, [&](int r) {
    ::setenv("BRAID_CHECK_ARGS", "1", 1);
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 20s;
    Communicator c(store, r, 3, opt);
    std::vector<float> x(100, 1.f);
    c.allreduce(x.data(), x.data(), 100, DataType::f32, ReduceOp::sum).wait();  // all agree
    ASSERT_EQ(x[0], 3.f);
    try {
      c.allreduce(x.data(), x.data(), r == 2 ? 99 : 100, DataType::f32, ReduceOp::sum).wait();
      ADD_FAILURE() << "mismatch not detected";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
      EXPECT_NE(std::string(e.what()).find("rank 2 called allreduce(count=99"), std::string::npos) << e.what();
    }
  });
  std::remove(path.c_str());
  for (int s : st) EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 0);
}

// Automatic calls under the measuring tuner: the first call of a size queues trials,
// calls issued before the verdict are deferred on one rank and not on another (rank 1
// comes late), yet every rank signs them alike ("auto") and the check passes.
TEST(DebugChecks, AutomaticCallsPassWhileTheTunerMeasures) {
  const std::string path = braid::test::temp_path("check-auto");
  const auto st = run_processes(3, [&](int r) {
    ::setenv("BRAID_CHECK_ARGS", "1", 1);
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 30s;
    Communicator c(store, r, 3, opt);
    std::vector<std::vector<float>> xs(12, std::vector<float>(3000, static_cast<float>(r + 1)));
    std::vector<Work> works;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (r == 1 && i == 1) std::this_thread::sleep_for(300ms);  // others post into the trials
      works.push_back(c.allreduce(xs[i].data(), xs[i].data(), xs[i].size(), DataType::f32, ReduceOp::sum));
    }
    for (auto& w : works) w.wait();
    for (const auto& x : xs) ASSERT_EQ(x[0], 6.f);
  });
  std::remove(path.c_str());
  for (int s : st) EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 0);
}
}  // namespace
