// Shrink and continue (issue 39, docs/reliability.md "Shrink"): ranks are forked processes
// over a forced transport, bootstrapped through a store that outlives them (a TcpStoreServer
// in a process of its own, as braidrun hosts one); one or two of them fail in the middle of a
// collective. Every survivor gets its error, calls shrink(), and the next collective on the
// shrunk communicator is correct, with every survivor agreeing on the members and its new
// rank. The time from the failure to that first correct result is printed ("[shrink]") and
// bounded; nothing is left behind (threads, fds).
#include "fault_support.hpp"
#include "test_support.hpp"

#include <braid/braid.hpp>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace braid;
using namespace std::chrono_literals;
using braid::test::run_processes;
using Clock = std::chrono::steady_clock;
using namespace braid::test::faults;

namespace {

enum class Fault { kill, stop, revoke };

struct Case {
  std::string transport;
  Op op;
  Fault fault;
  int ranks;
  std::vector<int> victims;  // for revoke: the rank that revokes (it stays)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.transport << " " << c.ranks << " ranks"; }

const char* fault_label(Fault f) {
  switch (f) {
    case Fault::kill: return "killed";
    case Fault::stop: return "stopped";
    case Fault::revoke: return "revoked";
  }
  return "?";
}

void run_case(const Case& cs) {
  const int n = cs.ranks;
  const bool revoke = cs.fault == Fault::revoke;
  const std::set<int> victims(cs.victims.begin(), cs.victims.end());
  const int survivors = revoke ? n : n - static_cast<int>(victims.size());
  const auto deadline = cs.fault == Fault::stop ? 2000ms * braid::test::kTimeScale : 20000ms;
  // From the failure to the first correct result on the shrunk communicator: the error
  // (the transport's, or the deadline's for a stopped rank), the agreement, the new
  // communicator's set-up and one collective. Issue 39's goal is the timeout plus 1 s.
  const long long bound_us = cs.fault == Fault::stop ? deadline.count() * 1000LL + 4'000'000LL * braid::test::kTimeScale
                                                     : 5'000'000LL * braid::test::kTimeScale;
  // The launcher's store, outliving every rank, in a process of its own (forked before this
  // process has threads: ThreadSanitizer refuses threads in a child of a threaded process).
  braid::test::StoreProcess server;
  const std::uint16_t port = server.port;
  const int first_victim = *victims.begin();
  const auto st = run_processes(n, [&](int r) {
    const int threads0 = baseline_threads(), fds0 = open_fds();
    {
      auto store = std::make_shared<TcpStore>("127.0.0.1", port);
      CommOptions opt;
      opt.timeout = deadline;
      opt.transport = cs.transport;
      // Two emulated hosts of two ranks each: the shrunk communicator keeps them.
      if (cs.op == Op::hierarchical) opt.host_id = "shrink-host-" + std::to_string(r / 2);
      Communicator c(store, r, n, opt);
      Buffers b(std::size_t{1} << 20);  // 4 MiB
      run_op(c, cs.op, b, deadline, "grads");
      store->add("warm", 1);
      std::thread failer;
      const bool victim = victims.count(r) > 0;
      if (victim) {
        for (const auto until = Clock::now() + 30s * braid::test::kTimeScale;
             store->add("warm", 0) < n && Clock::now() < until;)
          std::this_thread::sleep_for(1ms);
        failer = std::thread([&] {
          std::this_thread::sleep_for(30ms);
          if (r == first_victim) store->set("failed_at", std::to_string(now_us()));
          if (cs.fault == Fault::kill) ::kill(::getpid(), SIGKILL);
          if (cs.fault == Fault::stop) {
            store->set("victim_pid/" + std::to_string(r), std::to_string(::getpid()));
            ::kill(::getpid(), SIGSTOP);
          }
          if (revoke) c.revoke();
        });
      }
      bool noticed = false;
      for (int it = 0; it < 2000 && !noticed; ++it) {
        try {
          run_op(c, cs.op, b, deadline, "grads");
        } catch (const Error& e) {
          noticed = true;
          if (revoke && !victim) {
            EXPECT_NE(std::string(e.what()).find("revoke"), std::string::npos)
                << "the error does not say the communicator was revoked: " << e.what();
          }
        }
      }
      if (failer.joinable()) failer.join();
      ASSERT_TRUE(noticed) << "rank " << r << " never noticed the failure";
      // The revoking rank comes to shrink last: it is alive (its record says so), so the
      // others wait for it although their errors blame it.
      if (revoke && victim) std::this_thread::sleep_for(300ms * braid::test::kTimeScale);
      Communicator s = c.shrink();
      // Every survivor agrees on the members: the survivors in their old order.
      int expect_rank = 0;
      float expect_sum = 0;
      for (int q = 0; q < n; ++q) {
        if (!revoke && victims.count(q)) continue;
        if (q < r) ++expect_rank;
        expect_sum += static_cast<float>(q + 1);
      }
      EXPECT_EQ(s.size(), survivors);
      EXPECT_EQ(s.rank(), expect_rank);
      EXPECT_FALSE(s.failed());
      EXPECT_TRUE(c.failed());
      // The first collective of the shrunk communicator is correct.
      std::vector<float> v(4096, static_cast<float>(r + 1));
      s.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
      const long long at = now_us();
      for (float f : v) ASSERT_EQ(f, expect_sum);
      const long long failed_at = std::stoll(store->get("failed_at", 10s));
      std::fprintf(stderr, "[shrink] %s %s at %d ranks, rank %d %s: rank %d -> %d of %d, first correct all-reduce %.1f ms "
                   "after the failure\n", cs.transport.c_str(), op_label(cs.op), n, first_victim,
                   fault_label(cs.fault), r, s.rank(), s.size(), (at - failed_at) / 1000.0);
      store->set("recovered/" + std::to_string(r), std::to_string((at - failed_at) / 1000.0));
      EXPECT_LT(at - failed_at, bound_us) << "recovery took too long";
      // The compressed all-reduce goes on under the same key: its residuals came along.
      if (cs.op == Op::codec) {
        AllreduceOptions o;
        o.codec = "int8";
        o.ef_key = "grads";
        std::fill(b.x.begin(), b.x.end(), 1.f);
        s.allreduce(b.x.data(), b.x.data(), b.x.size(), DataType::f32, ReduceOp::sum, o).wait();
        for (std::size_t i = 0; i < b.x.size(); i += 997)
          ASSERT_NEAR(b.x[i], static_cast<float>(survivors), 0.1f * survivors) << "at " << i;
        EXPECT_GT(s.error_feedback_bytes(), 0u);
      }
      // More calls of the failed kind, on the shrunk communicator.
      for (int it = 0; it < 3; ++it) run_op(s, cs.op, b, deadline, "grads");
      // Every survivor is done before any closes: a rank that closes while a peer still
      // waits for its last send's completion (over verbs, the receiver's acknowledgement)
      // fails that peer's call (seen once in six runs over the fake HCA under load).
      store->add("done", 1);
      for (const auto until = Clock::now() + 60s * braid::test::kTimeScale;
           store->add("done", 0) < survivors && Clock::now() < until;)
        std::this_thread::sleep_for(1ms);
      if (cs.fault == Fault::stop && expect_rank == 0) {
        for (int q = 0; q < n; ++q)
          if (!victims.count(q)) (void)store->get("recovered/" + std::to_string(q), 60s * braid::test::kTimeScale);
        for (int q : victims) ::kill(std::stoi(store->get("victim_pid/" + std::to_string(q), 10s)), SIGKILL);
      }
    }
    settle(threads0, fds0);
    EXPECT_EQ(threads(), threads0) << "threads left behind";
    EXPECT_EQ(open_fds(), fds0) << "fds left behind";
  }, std::chrono::seconds(120 * braid::test::kTimeScale));
  for (int r = 0; r < n; ++r) {
    const int s = st[static_cast<std::size_t>(r)];
    if (!revoke && victims.count(r)) {
      EXPECT_TRUE(WIFSIGNALED(s) && WTERMSIG(s) == SIGKILL) << "victim " << r << " was not killed as planned";
    } else {
      EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 0) << "rank " << r << " failed a check or hung (status " << s << ")";
    }
  }
}

std::vector<std::string> transports() {
  std::vector<std::string> out;
  for (const auto& t : braid::test::grid_transports())
    if (t != "auto") out.push_back(t);
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // Every transport: each operation killed, a rank stopped, 8 ranks with two killed.
  for (const auto& t : transports()) {
    for (Op op : {Op::ring, Op::tree, Op::rhd, Op::hierarchical, Op::broadcast, Op::sendrecv})
      out.push_back({t, op, Fault::kill, 4, {2}});
    out.push_back({t, Op::codec, Fault::kill, 4, {1}});
    out.push_back({t, Op::ring, Fault::stop, 4, {2}});
    out.push_back({t, Op::rhd, Fault::kill, 8, {3, 6}});
  }
  for (const std::string t : {"shm", "tcp"}) {
    out.push_back({t, Op::ring, Fault::kill, 4, {0}});          // rank 0: the store is not its to lose
    out.push_back({t, Op::ring, Fault::kill, 4, {1, 2}});       // two die together
    out.push_back({t, Op::ring, Fault::revoke, 4, {1}});
  }
  out.push_back({"tcp", Op::ring, Fault::kill, 16, {5, 11}});  // 16 ranks on the 2 cores
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string victims;
  for (int v : c.victims) victims += std::to_string(v);
  return c.transport + "_" + op_label(c.op) + "_" + std::to_string(c.ranks) + "ranks_" + fault_label(c.fault) + "_" + victims;
}

class Shrink : public ::testing::TestWithParam<Case> {};

TEST_P(Shrink, SurvivorsAgreeShrinkAndTheNextCollectiveIsCorrect) { run_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Faults, Shrink, ::testing::ValuesIn(cases()), case_name);

// Shrink, then grow back: rank 3 of 4 is killed, the three survivors shrink, and a
// replacement process joins as rank 3 of the grown communicator (ncclCommGrow's shape):
// the survivors call grow(4), the newcomer join(). The grown communicator's all-reduce is
// correct, and a second failure after the grow is survived the same way.
TEST(Grow, AReplacementJoinsTheSurvivors) {
  braid::test::StoreProcess server;
  const std::uint16_t port = server.port;
  constexpr int kRanks = 4, kVictim = 3, kNewcomer = 4;  // process 4 is the replacement
  const auto st = run_processes(kRanks + 1, [&](int p) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port);
    CommOptions opt;
    opt.timeout = 20s * braid::test::kTimeScale;
    opt.transport = "tcp";
    const auto check_sum = [](Communicator& c) {
      std::vector<float> v(1000, static_cast<float>(c.rank() + 1));
      c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
      const float want = static_cast<float>(c.size() * (c.size() + 1) / 2);
      for (float f : v) ASSERT_EQ(f, want);
    };
    if (p == kNewcomer) {
      Communicator c = Communicator::join(store, 3, 4, opt);
      EXPECT_EQ(c.rank(), 3);
      EXPECT_EQ(c.size(), 4);
      for (int it = 0; it < 4; ++it) check_sum(c);  // as many calls as the survivors make
      // The offer is taken: a later newcomer for rank 3 waits for the next grow's, and no
      // rank of the old communicator is offered.
      EXPECT_FALSE(store->check({"braid/grow/braid/3"}));
      CommOptions quick = opt;
      quick.timeout = 300ms;
      EXPECT_THROW(Communicator::join(store, 3, 4, quick), TimeoutError);
      EXPECT_THROW(Communicator::join(store, 1, 4, quick), TimeoutError);
      store->add("grown", 1);
      while (store->add("grown", 0) < kRanks) std::this_thread::sleep_for(1ms);  // nobody closes early
      return;
    }
    Communicator c(store, p, kRanks, opt);
    check_sum(c);
    store->add("warm", 1);
    if (p == kVictim) {
      while (store->add("warm", 0) < kRanks) std::this_thread::sleep_for(1ms);
      ::kill(::getpid(), SIGKILL);
    }
    std::vector<float> x(1 << 16, 1.f);
    try {
      for (int it = 0; it < 100000; ++it) c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum).wait();
      ADD_FAILURE() << "rank " << p << " never noticed rank 3's death";
    } catch (const Error&) {
    }
    Communicator s = c.shrink();
    ASSERT_EQ(s.size(), 3);
    check_sum(s);
    EXPECT_THROW(s.grow(3), Error);  // not larger
    Communicator g = s.grow(4);
    EXPECT_EQ(g.rank(), p);
    EXPECT_EQ(g.size(), 4);
    check_sum(g);
    for (int it = 0; it < 3; ++it) check_sum(g);
    store->add("grown", 1);
    while (store->add("grown", 0) < kRanks) std::this_thread::sleep_for(1ms);  // nobody closes early
  }, std::chrono::seconds(120 * braid::test::kTimeScale));
  for (int p = 0; p <= kRanks; ++p) {
    const int s = st[static_cast<std::size_t>(p)];
    if (p == kVictim)
      EXPECT_TRUE(WIFSIGNALED(s) && WTERMSIG(s) == SIGKILL);
    else
      EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 0) << "process " << p << " failed a check or hung (status " << s << ")";
  }
}

TEST(ShrinkArguments, AreCheckedBeforeAnythingMoves) {
  auto store = std::make_shared<FileStore>(braid::test::temp_path("shrink-args"));
  Communicator c(store, 0, 1);
  EXPECT_THROW(c.shrink({0}), Error);   // itself
  EXPECT_THROW(c.shrink({1}), Error);   // out of range
  EXPECT_THROW(c.shrink({-1}), Error);
  try {
    c.shrink({0});
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find("itself"), std::string::npos) << e.what();
  }
  Communicator one = c.shrink();  // nothing failed: the same one rank
  EXPECT_EQ(one.size(), 1);
  float v = 2.f;
  one.allreduce(&v, &v, 1, DataType::f32, ReduceOp::sum).wait();
  EXPECT_EQ(v, 2.f);
}

}  // namespace
