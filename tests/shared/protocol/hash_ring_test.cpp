// Consistent hashing: stable across runs and orders, balanced, and adding or
// removing a share moves only the keys it gains or held.
#include "shared/protocol/hash_ring.hpp"

#include <gtest/gtest.h>

#include <map>

using namespace smockron;

TEST(HashRing, TheHashIsFixed) {
  // Every gatekeeper must send an identifier to the same master: these
  // values never change (a change would move every identifier at an upgrade).
  EXPECT_EQ(stable_hash(""), 0xf52a15e9a9b5e89bULL);
  EXPECT_EQ(stable_hash("alice"), 0xc5d1556d66774a5cULL);
  EXPECT_EQ(stable_hash("ip=74.11.99.155"), 0x8e35cba03b4105b3ULL);
}

TEST(HashRing, BalancedAndIndependentOfOrder) {
  const hash_ring a({"tcp://m1:10004", "tcp://m2:10004", "tcp://m3:10004"});
  const hash_ring b({"tcp://m3:10004", "tcp://m1:10004", "tcp://m2:10004"});
  std::map<std::size_t, int> counts;
  const std::vector<std::string> names_a = {"tcp://m1:10004", "tcp://m2:10004", "tcp://m3:10004"};
  const std::vector<std::string> names_b = {"tcp://m3:10004", "tcp://m1:10004", "tcp://m2:10004"};
  constexpr int n = 30'000;
  for (int i = 0; i < n; ++i) {
    const std::string key = "ip=10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256);
    ++counts[a.owner(key)];
    EXPECT_EQ(names_a[a.owner(key)], names_b[b.owner(key)]) << key;
  }
  for (const auto& [share, c] : counts) {
    EXPECT_GT(c, n / 3 * 0.85) << share;  // within 15% of an even split
    EXPECT_LT(c, n / 3 * 1.15) << share;
  }
}

TEST(HashRing, AddingOrRemovingAShareMovesOnlyItsKeys) {
  const std::vector<std::string> three = {"a", "b", "c"}, four = {"a", "b", "c", "d"};
  const hash_ring r3(three), r4(four);
  int moved = 0;
  constexpr int n = 20'000;
  for (int i = 0; i < n; ++i) {
    const std::string key = "user-" + std::to_string(i);
    const auto before = three[r3.owner(key)], after = four[r4.owner(key)];
    if (before != after) {
      ++moved;
      EXPECT_EQ(after, "d") << "a key moves only to the new share";
    }
  }
  EXPECT_GT(moved, n / 4 * 0.8);  // about a quarter: the new share's part
  EXPECT_LT(moved, n / 4 * 1.2);
  EXPECT_EQ(hash_ring({"only"}).owner("x"), 0u);
}
