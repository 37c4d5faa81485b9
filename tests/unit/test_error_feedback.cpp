// ErrorFeedbackStore: creation, count checks, reset, save/restore (checkpoint format of
// docs/codecs.md) and its rejection of damaged checkpoints, and concurrent use.
#include "compression/error_feedback.hpp"

#include <braid/error.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using braid::compression::ErrorFeedbackStore;
using braid::compression::ResidualRole;

TEST(ErrorFeedbackStore, CreatesZeroBuffersAndChecksCounts) {
  ErrorFeedbackStore s;
  EXPECT_EQ(s.size(), 0u);
  float* w = s.residual("conv1", ResidualRole::worker, 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(w[i], 0.0f);
  w[3] = 2.5f;
  EXPECT_EQ(s.residual("conv1", ResidualRole::worker, 10), w) << "same key returns the same buffer";
  EXPECT_EQ(s.residual("conv1", ResidualRole::worker, 10)[3], 2.5f);
  float* o = s.residual("conv1", ResidualRole::owner, 3);  // roles are separate, own counts
  EXPECT_NE(o, w);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.bytes(), 13u * sizeof(float));
  EXPECT_TRUE(s.contains("conv1", ResidualRole::owner));
  EXPECT_FALSE(s.contains("conv2", ResidualRole::worker));
  try {
    s.residual("conv1", ResidualRole::worker, 11);
    ADD_FAILURE() << "count mismatch accepted";
  } catch (const braid::Error& e) {
    EXPECT_EQ(e.code(), braid::ErrorCode::InvalidUsage);
    const std::string m = e.what();
    EXPECT_NE(m.find("'conv1'"), std::string::npos) << m;
    EXPECT_NE(m.find("10"), std::string::npos) << m;
    EXPECT_NE(m.find("11"), std::string::npos) << m;
  }
  EXPECT_THROW(s.residual("", ResidualRole::worker, 1), braid::Error);
}

TEST(ErrorFeedbackStore, ResetForgetsKeys) {
  ErrorFeedbackStore s;
  s.residual("a", ResidualRole::worker, 4)[0] = 1.0f;
  s.residual("a", ResidualRole::owner, 2)[0] = 1.0f;
  s.residual("b", ResidualRole::worker, 4)[0] = 1.0f;
  s.reset("a");
  EXPECT_FALSE(s.contains("a", ResidualRole::worker));
  EXPECT_FALSE(s.contains("a", ResidualRole::owner));
  EXPECT_TRUE(s.contains("b", ResidualRole::worker));
  EXPECT_EQ(s.residual("a", ResidualRole::worker, 7)[0], 0.0f) << "after reset a key may change size";
  s.reset_all();
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.bytes(), 0u);
}

TEST(ErrorFeedbackStore, SaveRestoreRoundTrip) {
  ErrorFeedbackStore a;
  float* w = a.residual("layer.0.weight", ResidualRole::worker, 1000);
  for (int i = 0; i < 1000; ++i) w[i] = static_cast<float>(i) * 0.001f - 0.3f;
  w[7] = -0.0f;
  a.residual("layer.0.weight", ResidualRole::owner, 250)[249] = 42.0f;
  a.residual("empty", ResidualRole::worker, 0);
  std::stringstream ss;
  a.save(ss);
  const std::string blob = ss.str();
  EXPECT_EQ(blob.substr(0, 8), std::string("BRAIDEF\0", 8));

  ErrorFeedbackStore b;
  b.residual("stale", ResidualRole::worker, 3);
  std::istringstream in(blob);
  b.restore(in);
  EXPECT_FALSE(b.contains("stale", ResidualRole::worker)) << "restore replaces the contents";
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b.bytes(), a.bytes());
  const float* w2 = b.residual("layer.0.weight", ResidualRole::worker, 1000);
  EXPECT_EQ(0, std::memcmp(w, w2, 4000));
  EXPECT_EQ(b.residual("layer.0.weight", ResidualRole::owner, 250)[249], 42.0f);
  std::stringstream again;
  b.save(again);
  EXPECT_EQ(again.str(), blob) << "save(restore(x)) == x";
}

TEST(ErrorFeedbackStore, PrefixCheckpointHoldsOneOwnersKeysAndMovesToAnotherPrefix) {
  ErrorFeedbackStore a;
  a.residual("hookA/bucket-0", ResidualRole::worker, 5)[4] = 1.5f;
  a.residual("hookA/bucket-1", ResidualRole::owner, 3)[0] = -2.0f;
  a.residual("hookB/bucket-0", ResidualRole::worker, 5)[0] = 7.0f;
  std::stringstream ss;
  a.save(ss, "hookA/");

  ErrorFeedbackStore b;
  b.residual("other", ResidualRole::worker, 2)[1] = 9.0f;
  b.residual("hookC/stale", ResidualRole::worker, 4);
  std::istringstream in(ss.str());
  b.restore(in, "hookC/");
  EXPECT_EQ(b.size(), 3u) << "hookA's two residuals under hookC/, 'other' kept, hookC/stale replaced";
  EXPECT_FALSE(b.contains("hookC/stale", ResidualRole::worker));
  EXPECT_FALSE(b.contains("hookB/bucket-0", ResidualRole::worker)) << "only the prefix's keys were saved";
  EXPECT_EQ(b.residual("hookC/bucket-0", ResidualRole::worker, 5)[4], 1.5f);
  EXPECT_EQ(b.residual("hookC/bucket-1", ResidualRole::owner, 3)[0], -2.0f);
  EXPECT_EQ(b.residual("other", ResidualRole::worker, 2)[1], 9.0f);

  // Saved without a prefix, the keys come back as they were.
  std::stringstream all;
  b.save(all);
  ErrorFeedbackStore c;
  std::istringstream in2(all.str());
  c.restore(in2);
  EXPECT_TRUE(c.contains("hookC/bucket-0", ResidualRole::worker));

  ErrorFeedbackStore d;
  d.residual("p", ResidualRole::worker, 1);
  std::stringstream bad;
  EXPECT_THROW(d.save(bad, "p"), braid::Error) << "a key equal to the prefix has no name left";
}

TEST(ErrorFeedbackStore, DamagedCheckpointsAreRefusedAndLeaveTheStoreAlone) {
  ErrorFeedbackStore a;
  a.residual("k", ResidualRole::worker, 16)[5] = 3.0f;
  std::stringstream ss;
  a.save(ss);
  const std::string blob = ss.str();
  auto refused = [&](const std::string& data, const char* what) {
    ErrorFeedbackStore b;
    b.residual("keep", ResidualRole::worker, 2)[1] = 9.0f;
    std::istringstream in(data);
    try {
      b.restore(in);
      ADD_FAILURE() << what << ": accepted";
    } catch (const braid::Error& e) {
      EXPECT_EQ(e.code(), braid::ErrorCode::InvalidUsage) << what;
    }
    EXPECT_EQ(b.size(), 1u) << what;
    EXPECT_EQ(b.residual("keep", ResidualRole::worker, 2)[1], 9.0f) << what;
  };
  refused("", "empty");
  refused("not a checkpoint at all", "bad magic");
  refused(blob.substr(0, blob.size() - 1), "truncated checksum");
  refused(blob.substr(0, 30), "truncated data");
  std::string flipped = blob;
  flipped[40] ^= 0x01;
  refused(flipped, "flipped data bit");
  std::string version = blob;
  version[8] = 3;
  refused(version, "future version");
}

// Version 2 carries the step counters that key stochastic rounding, so a restored run
// rounds with the same random numbers as an uninterrupted one.
TEST(ErrorFeedbackStore, StepCountersTravelWithTheCheckpoint) {
  ErrorFeedbackStore a;
  a.residual("hook/bucket-0", ResidualRole::worker, 2);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.next_step("hook/bucket-0"), static_cast<std::uint64_t>(i));
  EXPECT_EQ(a.next_step("hook/bucket-1"), 0u);
  EXPECT_EQ(a.next_step(""), 0u);
  EXPECT_EQ(a.next_step(""), 1u);
  a.reset("hook/bucket-0");
  EXPECT_EQ(a.next_step("hook/bucket-0"), 5u) << "reset forgets residuals, not the step";
  std::stringstream ss;
  a.save(ss, "hook/");

  ErrorFeedbackStore b;
  EXPECT_EQ(b.next_step("moved/bucket-0"), 0u);
  EXPECT_EQ(b.next_step("other"), 0u);
  EXPECT_EQ(b.next_step(""), 0u);
  std::istringstream in(ss.str());
  b.restore(in, "moved/");
  EXPECT_EQ(b.next_step("moved/bucket-0"), 6u);
  EXPECT_EQ(b.next_step("moved/bucket-1"), 1u) << "a key without residuals keeps its step too";
  EXPECT_EQ(b.next_step("other"), 1u) << "keys outside the prefix are left alone";
  EXPECT_EQ(b.next_step(""), 1u) << "the shared counter of calls without a key is not in a checkpoint";

  // A version 1 checkpoint (no counters): the counters under the prefix restart at 0.
  std::string v1("BRAIDEF\0", 8);
  v1 += std::string("\x01\0\0\0\0\0\0\0", 8);  // version 1, no entries
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : v1) h = (h ^ c) * 0x100000001b3ull;
  for (int i = 0; i < 8; ++i) v1.push_back(static_cast<char>(h >> (8 * i)));
  std::istringstream old(v1);
  b.restore(old, "moved/");
  EXPECT_EQ(b.next_step("moved/bucket-0"), 0u);
  EXPECT_EQ(b.next_step("other"), 2u);
}

TEST(ErrorFeedbackStore, ConcurrentUseOfDistinctKeys) {
  ErrorFeedbackStore s;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&s, t] {
      for (int i = 0; i < 200; ++i) {
        float* r = s.residual("t" + std::to_string(t) + "." + std::to_string(i % 20), ResidualRole::worker, 64);
        r[i % 64] += 1.0f;
        (void)s.bytes();
        if (i % 50 == 0) {
          std::stringstream ss;
          s.save(ss);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(s.size(), 80u);
  float total = 0;
  for (int t = 0; t < 4; ++t)
    for (int k = 0; k < 20; ++k) {
      const float* r = s.residual("t" + std::to_string(t) + "." + std::to_string(k), ResidualRole::worker, 64);
      for (int i = 0; i < 64; ++i) total += r[i];
    }
  EXPECT_EQ(total, 800.0f);
}

}  // namespace
