// base::LruMap: the bounded map behind the plan cache and the tuner's tables.
#include "base/lru_map.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using braid::base::LruMap;

TEST(LruMap, ForgetsTheLeastRecentlyUsedWhenFull) {
  LruMap<int, std::string> m(3);
  m.insert(1, "a");
  m.insert(2, "b");
  m.insert(3, "c");
  ASSERT_NE(m.find(1), nullptr);  // 1 is now the most recently used: 2 goes next
  m.insert(4, "d");
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.find(2), nullptr);
  ASSERT_NE(m.find(1), nullptr);
  EXPECT_EQ(*m.find(1), "a");
  EXPECT_EQ(*m.find(3), "c");
  EXPECT_EQ(*m.find(4), "d");
  m.insert(5, "e");  // order now 1, 3, 4: 1 goes
  EXPECT_EQ(m.find(1), nullptr);
}

TEST(LruMap, InsertingAKeyAgainReplacesItsValueWithoutEvicting) {
  LruMap<int, int> m(2);
  m.insert(1, 10);
  m.insert(2, 20);
  EXPECT_EQ(*m.insert(1, 11), 11);
  EXPECT_EQ(m.size(), 2u);
  m.insert(3, 30);  // 2 is the least recently used
  EXPECT_EQ(m.find(2), nullptr);
  EXPECT_EQ(*m.find(1), 11);
}

TEST(LruMap, CapacityZeroKeepsNothing) {
  LruMap<int, int> m(0);
  EXPECT_EQ(m.insert(1, 1), nullptr);
  EXPECT_EQ(m.find(1), nullptr);
  EXPECT_EQ(m.size(), 0u);
}

TEST(LruMap, TwoMapsFedTheSameCallsForgetTheSameKeys) {
  // What the tuner relies on: every rank issues the same calls, so every rank's table
  // evicts the same bucket at the same call.
  LruMap<int, int> a(16), b(16);
  unsigned x = 12345;
  for (int i = 0; i < 10000; ++i) {
    x = x * 1103515245u + 12345u;
    const int key = static_cast<int>((x >> 8) % 40);
    const bool in_a = a.find(key) != nullptr, in_b = b.find(key) != nullptr;
    ASSERT_EQ(in_a, in_b) << "call " << i;
    if (!in_a) {
      a.insert(key, i);
      b.insert(key, i);
    }
  }
}

}  // namespace
