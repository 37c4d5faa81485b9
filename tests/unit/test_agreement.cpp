// The survivors' agreement on a shrunk communicator's members (core/agreement.hpp), with
// ranks as threads over one FileStore (each its own client, as processes would be): every
// caller gets the same members however the failure looked to it.
#include "core/agreement.hpp"
#include "test_support.hpp"

#include <braid/error.hpp>
#include <braid/store.hpp>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace braid;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Outcome {
  std::vector<int> members;
  std::string error;
  ErrorCode code = ErrorCode::Internal;
  long long ms = 0;
};

/// Runs agree_on_members on `callers` (each after its delay), every one with its own
/// client of the store at `path`.
std::vector<Outcome> agree(const std::string& path, int size, const std::vector<int>& callers,
                           const std::vector<std::vector<int>>& exclude, std::chrono::milliseconds timeout,
                           const std::vector<std::chrono::milliseconds>& delay = {}) {
  std::vector<Outcome> out(callers.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < callers.size(); ++i)
    threads.emplace_back([&, i] {
      if (i < delay.size()) std::this_thread::sleep_for(delay[i]);
      FileStore store(path);
      const auto t0 = Clock::now();
      try {
        out[i].members = core::agree_on_members(store, 0, callers[i], size, i < exclude.size() ? exclude[i] : std::vector<int>{},
                                                timeout);
      } catch (const Error& e) {
        out[i].error = e.what();
        out[i].code = e.code();
      }
      out[i].ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    });
  for (auto& t : threads) t.join();
  return out;
}

class Agreement : public ::testing::Test {
 protected:
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_ = braid::test::temp_path("agreement");
};

TEST_F(Agreement, EveryRankCallingKeepsEveryRank) {
  const auto out = agree(path_, 4, {0, 1, 2, 3}, {}, 10s);
  for (const auto& o : out) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.members, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_LT(o.ms, 5000);
  }
}

TEST_F(Agreement, ABlamedRankIsLeftOutWithoutWaitingForTheTimeout) {
  FileStore(path_).set("blamed/2", "rank 2 closed its connection");
  const auto out = agree(path_, 4, {0, 1, 3}, {}, 60s);
  for (const auto& o : out) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.members, (std::vector<int>{0, 1, 3}));
    EXPECT_LT(o.ms, 5000) << "the survivors waited for a rank a failure record blames";
  }
}

TEST_F(Agreement, ASilentRankIsLeftOutAtTheTimeout) {
  const auto out = agree(path_, 4, {0, 2, 3}, {}, 300ms);
  for (const auto& o : out) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.members, (std::vector<int>{0, 2, 3}));
    EXPECT_GE(o.ms, 250);
    EXPECT_LT(o.ms, 5000);
  }
}

// One caller was asked to leave rank 1 out, the others were not: rank 1 calls too, but the
// exclusion of any caller counts, and all agree.
TEST_F(Agreement, AnyCallersExclusionCountsForAll) {
  const auto out = agree(path_, 4, {0, 1, 2, 3}, {{1}, {}, {}, {}}, 10s, {0ms, 0ms, 0ms, 0ms});
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (i == 1) {
      // Rank 1 agrees that it is out, if the decision came after its own call: it is told.
      if (!out[i].error.empty()) {
        EXPECT_EQ(out[i].code, ErrorCode::Aborted) << out[i].error;
        EXPECT_NE(out[i].error.find("without rank 1"), std::string::npos) << out[i].error;
      }
      continue;
    }
    EXPECT_EQ(out[i].error, "");
    EXPECT_EQ(out[i].members, (std::vector<int>{0, 2, 3}));
  }
  EXPECT_FALSE(out[1].error.empty()) << "rank 1 was excluded by rank 0 but was told it is a member";
}

// A blamed rank that was alive after all and calls after the others agreed is told that
// they went on without it: no rank ever gets a different set.
TEST_F(Agreement, ALateCallerAfterTheDecisionIsToldItWasLeftOut) {
  FileStore(path_).set("blamed/3", "rank 3 has not reported");
  const auto out = agree(path_, 4, {0, 1, 2, 3}, {}, 10s, {0ms, 0ms, 0ms, 1500ms});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)].members, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(out[3].code, ErrorCode::Aborted) << out[3].error;
  EXPECT_NE(out[3].error.find("without rank 3"), std::string::npos) << out[3].error;
}

// A rank that revoked its communicator is blamed by its peers (its connections closed) but
// said it is alive: the others wait for it, however late it calls.
TEST_F(Agreement, ABlamedRankThatRevokedIsWaitedFor) {
  FileStore s(path_);
  s.set("blamed/3", "rank 3 closed its connection");
  s.set("revoked/3", "1");
  const auto out = agree(path_, 4, {0, 1, 2, 3}, {}, 10s, {0ms, 0ms, 0ms, 700ms});
  for (const auto& o : out) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.members, (std::vector<int>{0, 1, 2, 3}));
  }
}

// Two callers exclude each other: neither proposes an empty set (which would read as no
// decision); each is told it is out.
TEST_F(Agreement, ExclusionsThatLeaveNobodyAreRefused) {
  const auto out = agree(path_, 2, {0, 1}, {{1}, {0}}, 10s);
  for (const auto& o : out) {
    EXPECT_EQ(o.code, ErrorCode::Aborted) << o.error;
    EXPECT_FALSE(o.error.empty());
  }
}

TEST_F(Agreement, AStoreWithoutCompareSetIsUnsupported) {
  struct Plain : Store {
    FileStore s;
    explicit Plain(const std::string& p) : s(p) {}
    void set(const std::string& k, const std::string& v) override { s.set(k, v); }
    std::string get(const std::string& k, std::chrono::milliseconds t) override { return s.get(k, t); }
    std::int64_t add(const std::string& k, std::int64_t d) override { return s.add(k, d); }
    bool check(const std::vector<std::string>& k) override { return s.check(k); }
    void wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override { s.wait(k, t); }
    bool remove(const std::string& k) override { return s.remove(k); }
  } plain(path_);
  try {
    core::agree_on_members(plain, 0, 0, 1, {}, 1s);
    FAIL() << "agreed through a store without compare_set";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("compare_set"), std::string::npos) << e.what();
  }
}

TEST(RankLists, RoundTripAndRefuseWhatIsNotOne) {
  std::vector<int> v;
  EXPECT_TRUE(core::parse_ranks(core::format_ranks({0, 3, 7}), 8, &v));
  EXPECT_EQ(v, (std::vector<int>{0, 3, 7}));
  EXPECT_TRUE(core::parse_ranks("", 8, &v));
  EXPECT_TRUE(v.empty());
  for (const char* bad : {"1,", ",1", "1,,2", "8", "-1", "a", "1 2"}) EXPECT_FALSE(core::parse_ranks(bad, 8, &v)) << bad;
}

}  // namespace
