// share_secret (core/job_secret.hpp): how ranks agree on the communicator id and the
// job's token through the store, and that a token given with BRAID_AUTH_TOKEN never
// reaches the store, which has no authentication of its own.
#include "core/job_secret.hpp"

#include "test_support.hpp"

#include <braid/error.hpp>
#include <braid/store.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

namespace {

using braid::core::share_secret;
using namespace std::chrono_literals;

std::shared_ptr<braid::Store> fresh_store() {
  return std::make_shared<braid::FileStore>(braid::test::temp_path("secret"));
}

braid::ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const braid::Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no error";
  return braid::ErrorCode::Internal;
}

TEST(JobSecret, RankZeroMakesTheTokenAndEveryRankReadsTheSame) {
  auto store = fresh_store();
  const auto a = share_secret(*store, 0, "", 5s);
  const auto b = share_secret(*store, 1, "", 5s);
  const auto c = share_secret(*store, 2, "", 5s);
  EXPECT_EQ(a.comm_id, b.comm_id);
  EXPECT_EQ(a.comm_id, c.comm_id);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.token, c.token);
  EXPECT_GE(a.token.size(), 32u);
}

TEST(JobSecret, AGivenTokenIsNeverWrittenToTheStore) {
  auto store = fresh_store();
  const std::string token = "s3cret-token-from-the-scheduler";
  const auto a = share_secret(*store, 0, token, 5s);
  const std::string meta = store->get("meta", 1s);
  EXPECT_EQ(meta.find(token), std::string::npos) << "the store holds the given token: " << meta;
  const auto b = share_secret(*store, 1, token, 5s);
  EXPECT_EQ(a.comm_id, b.comm_id);
  EXPECT_EQ(b.token, token);
}

TEST(JobSecret, RanksThatDisagreeOnTheGivenTokenAreToldHowToFixIt) {
  {
    auto store = fresh_store();
    share_secret(*store, 0, "given-on-rank-0", 5s);
    try {
      share_secret(*store, 1, "", 5s);
      ADD_FAILURE() << "accepted";
    } catch (const braid::Error& e) {
      EXPECT_EQ(e.code(), braid::ErrorCode::InvalidUsage);
      EXPECT_NE(std::string(e.what()).find("rank 0 was given BRAID_AUTH_TOKEN but rank 1 was not"), std::string::npos)
          << e.what();
    }
  }
  auto store = fresh_store();
  share_secret(*store, 0, "", 5s);
  EXPECT_EQ(code_of([&] { share_secret(*store, 3, "given-on-rank-3", 5s); }), braid::ErrorCode::InvalidUsage);
}

TEST(JobSecret, MalformedRecordsAreNetworkErrorsNotCrashes) {
  for (const std::string bad : {"", "zz\ntoken abc", "12345", "\ntoken abc", "1234\n", "1234\ntoken ",
                                "1234\nsomething else", "11112222333344445\ntoken x", "-1\ntoken x"}) {
    SCOPED_TRACE(bad);
    auto store = fresh_store();
    store->set("meta", bad);
    EXPECT_EQ(code_of([&] { share_secret(*store, 1, "", 1s); }), braid::ErrorCode::Network);
  }
}

}  // namespace
