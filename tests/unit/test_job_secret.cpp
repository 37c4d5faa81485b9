// share_secret (core/job_secret.hpp): how ranks agree on the communicator id and the
// job's token through the store, and that a token given with BRAID_AUTH_TOKEN never
// reaches the store, which has no authentication of its own.
#include "core/communicator_impl.hpp"
#include "core/compressor.hpp"
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

// The records other ranks read from the store, parsed strictly: what rank 0 writes is
// read back; anything its writer could not have written is refused (a garbled split
// record used to be read as color 0, key 0, and a codec rate as whatever strtod made of it).
TEST(StoreRecords, ParsersAcceptWhatRanksWriteAndNothingElse) {
  using braid::core::parse_meta;
  const auto made = parse_meta("1234abcd\ntoken 0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(made.has_value());
  EXPECT_EQ(made->comm_id, 0x1234abcdu);
  EXPECT_FALSE(made->given);
  EXPECT_EQ(made->token, "0123456789abcdef0123456789abcdef");
  EXPECT_TRUE(parse_meta("ff\ngiven").has_value() && parse_meta("ff\ngiven")->given);
  for (const char* bad : {"", "ff", "\ngiven", "xyz\ngiven", "ff\ntoken short", "ff\ntoken ",
                          "ff\ntoken 0123456789ABCDEF0123456789abcdef", "12345678901234567\ngiven", "ff\ngiven "})
    EXPECT_FALSE(parse_meta(bad).has_value()) << '"' << bad << '"';

  int color = -1, key = 0;
  EXPECT_TRUE(braid::core::parse_split_record("3 -7", &color, &key));
  EXPECT_EQ(color, 3);
  EXPECT_EQ(key, -7);
  for (const char* bad : {"", "3", "3 ", " 3 4", "-1 0", "3 x", "3 4 5", "99999999999 0", "3 99999999999"})
    EXPECT_FALSE(braid::core::parse_split_record(bad, &color, &key)) << '"' << bad << '"';

  std::vector<braid::compression::CodecRates> rates;
  std::string why;
  EXPECT_TRUE(braid::core::parse_codec_rates("int8 0x1.8p+30 0x1p+31\nfp16 1e9 2e9\n", &rates, &why)) << why;
  EXPECT_EQ(rates.size(), 2u);
  for (const char* bad : {"", "int8 1e9", "int8 nan 1e9", "int8 1e9 inf", "int8 -1 1e9", "int8 1e9x 1e9",
                          "nosuchcodec 1e9 1e9"}) {
    why.clear();
    EXPECT_FALSE(braid::core::parse_codec_rates(bad, &rates, &why)) << '"' << bad << '"';
    EXPECT_FALSE(why.empty());
  }

  // Rank 0's link figures (core/link_probe.hpp): written, read back exactly; anything else refused.
  braid::core::LinkFigures f, back;
  f.a = 0;
  f.b = 3;
  f.link.alpha_s = 37.5e-6;
  f.link.Bps = 117.3e6;
  ASSERT_TRUE(braid::core::parse_link_figures(braid::core::format_link_figures(f), 4, &back, &why)) << why;
  EXPECT_EQ(back.a, 0);
  EXPECT_EQ(back.b, 3);
  EXPECT_EQ(back.link.alpha_s, f.link.alpha_s);
  EXPECT_EQ(back.link.Bps, f.link.Bps);
  EXPECT_TRUE(braid::core::parse_link_figures("-1 -1 0x0p+0 0x0p+0", 4, &back, &why)) << why;  // one host
  for (const char* bad : {"", "0 3 1e-5", "0 3 1e-5 1e8 7", "0 4 1e-5 1e8", "-2 3 1e-5 1e8", "0 3 0 1e8",
                          "0 3 1e-5 -1e8", "0 3 nan 1e8", "0 3 1e-5 inf", "0 3 1e-5x 1e8", "x 3 1e-5 1e8"}) {
    why.clear();
    EXPECT_FALSE(braid::core::parse_link_figures(bad, 4, &back, &why)) << '"' << bad << '"';
    EXPECT_FALSE(why.empty());
  }
}
