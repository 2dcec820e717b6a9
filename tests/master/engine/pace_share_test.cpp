// Pace share (master/engine/pace_share.hpp): the effective number of
// gatekeepers holding a client, and the bounds of the table.
#include "master/engine/pace_share.hpp"

#include <gtest/gtest.h>

#include <string>

using smockron::master::pace_share;

namespace {
constexpr std::int64_t t = 1'000'000'000;  // the start of a window
constexpr std::int64_t w = pace_share::k_window_us;
}  // namespace

TEST(PaceShare, CountsTheGatekeepersThatSeeTheClient) {
  pace_share p;
  EXPECT_EQ(p.seen(0, "k", 1, t), 1.0);
  EXPECT_EQ(p.seen(0, "k", 2, t + 10), 2.0) << "two gatekeepers that see it alike";
  EXPECT_DOUBLE_EQ(p.seen(0, "k", 1, t + 20), 9.0 / 5) << "(2 + 1)^2 / (4 + 1)";
  EXPECT_EQ(p.seen(1, "k", 3, t + 20), 1.0) << "another domain's client";
  EXPECT_EQ(p.seen(0, "j", 2, t + 20), 1.0) << "another client";
}

// A client pinned to one gatekeeper with a little spill-over is paced near its rate there.
TEST(PaceShare, OneThatSeesMostOfTheClientCountsMost) {
  pace_share p;
  for (int i = 0; i < 9; ++i) p.seen(0, "k", 1, t);
  EXPECT_DOUBLE_EQ(p.seen(0, "k", 2, t), 100.0 / 82);  // 90% and 10%: 1.22
}

TEST(PaceShare, ACountCountsNothing) {
  pace_share p;
  EXPECT_EQ(p.count(0, "k", t), 1.0) << "a client not counted";
  p.seen(0, "k", 1, t);
  p.seen(0, "k", 2, t);
  EXPECT_EQ(p.count(0, "k", t), 2.0);
  EXPECT_EQ(p.count(0, "k", t), 2.0);
  EXPECT_EQ(p.clients(), 1u);
}

TEST(PaceShare, AWallClockSteppedBackStartsTheCountAfresh) {
  pace_share p;
  p.seen(0, "k", 1, t + 5 * w);
  p.seen(0, "k", 2, t + 5 * w);
  EXPECT_EQ(p.seen(0, "k", 1, t), 1.0);
}

TEST(PaceShare, TheCountsSlideWithTheWindow) {
  pace_share p;
  p.seen(0, "k", 1, t);
  EXPECT_EQ(p.seen(0, "k", 2, t), 2.0);
  // Half a window on: each's last window counts half, gatekeeper 1 one message more.
  EXPECT_DOUBLE_EQ(p.seen(0, "k", 1, t + w + w / 2), 4.0 / (1.5 * 1.5 + 0.5 * 0.5));
  // Two windows later gatekeeper 2, silent since, counts no more.
  EXPECT_EQ(p.seen(0, "k", 1, t + 3 * w), 1.0);
  EXPECT_EQ(p.clients(), 1u);
  p.sweep(t + 4 * w);
  EXPECT_EQ(p.clients(), 1u) << "its last window still counts";
  p.sweep(t + 5 * w);
  EXPECT_EQ(p.clients(), 0u);
}

// A gatekeeper gone (its last connection closed) counts no more at once,
// for every client it held; a client only it held is forgotten.
TEST(PaceShare, AGatekeeperForgottenCountsNoMore) {
  pace_share p;
  p.seen(0, "k", 1, t);
  p.seen(0, "k", 2, t);
  p.seen(0, "j", 2, t);
  p.seen(1, "k", 2, t);
  p.forget(2);
  EXPECT_EQ(p.clients(), 1u) << "j and the other domain's k were held by 2 alone";
  EXPECT_EQ(p.count(0, "k", t), 1.0);
  EXPECT_EQ(p.seen(0, "k", 3, t + 10), 2.0) << "the others still count";
  p.forget(99);  // one never seen: nothing changes
  EXPECT_EQ(p.count(0, "k", t + 10), 2.0);
}

TEST(PaceShare, TheTableIsBounded) {
  pace_share p;
  for (std::size_t i = 0; i < pace_share::k_max_clients; ++i) p.seen(0, "c" + std::to_string(i), 1, t);
  EXPECT_EQ(p.clients(), pace_share::k_max_clients);
  EXPECT_EQ(p.seen(0, "new", 1, t), 1.0);
  EXPECT_EQ(p.seen(0, "new", 2, t), 1.0) << "not counted: its gatekeepers pace at the rule's interval";
  EXPECT_EQ(p.seen(0, "c0", 2, t), 2.0) << "the clients counted still are";
  for (std::uint64_t g = 2; g < 200; ++g) p.seen(0, "c1", g, t);
  EXPECT_DOUBLE_EQ(p.seen(0, "c1", 2, t), 33.0 * 33 / (31 + 4)) << "32 gatekeepers at most";
  p.sweep(t + 2 * w);
  EXPECT_EQ(p.clients(), 0u);
  EXPECT_EQ(p.seen(0, "new", 1, t + 2 * w), 1.0);
  EXPECT_EQ(p.clients(), 1u);
}
