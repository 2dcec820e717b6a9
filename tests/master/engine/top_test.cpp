// Who is limited now: the Space-Saving summary's guarantees, the two half
// minutes, and the bound on memory whatever the number of identifiers.
#include "master/engine/top.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

using namespace smockron::master;

namespace {
constexpr std::int64_t s = 1'000'000;
const std::int64_t t0 = 1'700'000'010 * s;  // a half minute's start
}  // namespace

TEST(SpaceSaving, CountsExactlyUnderItsCapacity) {
  space_saving ss(3);
  for (int i = 0; i < 5; ++i) ss.add("a");
  ss.add("b");
  ASSERT_EQ(ss.items().size(), 2u);
  EXPECT_EQ(ss.items()[0].count, 5u);
  EXPECT_EQ(ss.items()[0].error, 0u);
}

TEST(SpaceSaving, AHeavyHitterIsNeverLostAmongManyOthers) {
  // 10,000 identifiers limited once each, interleaved with one limited 1,000
  // times: with 20 counters the heavy one is kept, its count at least its
  // true count and at most count + error.
  space_saving ss(20);
  std::mt19937 rng(3);
  int heavy = 0;
  for (int i = 0; i < 10'000; ++i) {
    ss.add("id-" + std::to_string(i));
    if (rng() % 10 == 0) {
      ss.add("heavy");
      ++heavy;
    }
  }
  EXPECT_LE(ss.items().size(), 20u);
  const auto it = std::find_if(ss.items().begin(), ss.items().end(), [](const auto& i) { return i.key == "heavy"; });
  ASSERT_NE(it, ss.items().end());
  EXPECT_GE(it->count, static_cast<std::uint64_t>(heavy));
  EXPECT_LE(it->count - it->error, static_cast<std::uint64_t>(heavy));
}

TEST(TopLimited, TheLastMinuteInTwoHalves) {
  top_limited top(2, 10);
  for (int i = 0; i < 5; ++i) top.limited(0, "a", t0);
  for (int i = 0; i < 3; ++i) top.limited(0, "b", t0 + 31 * s);
  top.limited(1, "other", t0);
  auto list = top.top(0, 10, t0 + 31 * s);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].identifier, "a");
  EXPECT_EQ(list[0].limited, 5u);
  EXPECT_EQ(list[1].identifier, "b");
  EXPECT_EQ(top.top(0, 1, t0 + 31 * s).size(), 1u) << "at most n";
  // A half minute later "a"'s half is over; later still, nothing is recent.
  list = top.top(0, 10, t0 + 61 * s);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].identifier, "b");
  EXPECT_TRUE(top.top(0, 10, t0 + 91 * s).empty());
  EXPECT_TRUE(top.top(5, 10, t0).empty()) << "no such domain";
  top.reset(1);
  EXPECT_TRUE(top.top(0, 10, t0 + 31 * s).empty());
}
