// The gate: decisions, pacing, bounds and control-memory behaviour with
// injected wall time (microseconds), no sleeping.
#include "proxy/gate.hpp"

#include <gtest/gtest.h>

using namespace smockron::proxy;

namespace {
constexpr std::int64_t ms = 1000;
const std::int64_t t0 = 1'700'000'000'000 * ms;
gate_limits limits(std::int64_t max_delay_ms = 5000, std::int64_t max_held = 100) {
  return {max_delay_ms * ms, max_held};
}
}  // namespace

TEST(Gate, UnknownIdentifierIsAccepted) {
  gate g;
  EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::accept);
}

TEST(Gate, DelayUntilHoldsThenExpires) {
  gate g;
  g.update(0, "a", t0 + 300 * ms, 100 * ms, t0);
  const auto d = g.decide(0, "a", t0, limits());
  ASSERT_EQ(d.v, verdict::delay);
  EXPECT_EQ(d.release_us, t0 + 300 * ms);
  EXPECT_EQ(g.held(), 1);
  g.release_held();
  EXPECT_EQ(g.held(), 0);
  EXPECT_EQ(g.decide(1, "a", t0, limits()).v, verdict::accept);  // other domain
  EXPECT_EQ(g.decide(0, "b", t0, limits()).v, verdict::accept);  // other identifier
  // Once the reserved slots have passed, requests go straight through.
  EXPECT_EQ(g.decide(0, "a", t0 + 401 * ms, limits()).v, verdict::accept);
}

TEST(Gate, HeldRequestsOfOneIdentifierArePacedOneIntervalApart) {
  gate g;
  g.update(0, "a", t0 + 100 * ms, 50 * ms, t0);
  std::vector<std::int64_t> releases;
  for (int i = 0; i < 4; ++i) releases.push_back(g.decide(0, "a", t0, limits()).release_us);
  EXPECT_EQ(releases, (std::vector<std::int64_t>{t0 + 100 * ms, t0 + 150 * ms, t0 + 200 * ms, t0 + 250 * ms}));
}

TEST(Gate, WithoutIntervalFrameTheMasterTimeIsUsedAsIs) {
  gate g;
  g.update(0, "a", t0 + 100 * ms, 0, t0);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).release_us, t0 + 100 * ms);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).release_us, t0 + 100 * ms);
}

TEST(Gate, DelaysOnlyMoveForward) {
  gate g;
  g.update(0, "a", t0 + 500 * ms, 0, t0);
  g.update(0, "a", t0 + 200 * ms, 0, t0);  // a stale or reordered message
  EXPECT_EQ(g.decide(0, "a", t0, limits()).release_us, t0 + 500 * ms);
  g.update(0, "a", t0 + 900 * ms, 0, t0);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).release_us, t0 + 900 * ms);
}

TEST(Gate, TooLongADelayIsRejectedWithRetryAfterRoundedUp) {
  gate g;
  g.update(0, "a", t0 + 6'200 * ms, 0, t0);
  const auto d = g.decide(0, "a", t0, limits(5000));
  ASSERT_EQ(d.v, verdict::reject);
  EXPECT_EQ(d.reason, reject_reason::delay_too_long);
  EXPECT_EQ(d.retry_after_s, 7);
  EXPECT_EQ(g.held(), 0);
  g.update(0, "b", t0 + 10 * ms, 0, t0);
  EXPECT_EQ(g.decide(0, "b", t0, limits(5)).retry_after_s, 1);  // at least one second
}

TEST(Gate, MaxHeldRejectsBeyondTheCap) {
  gate g;
  g.update(0, "a", t0 + 100 * ms, 1 * ms, t0);
  EXPECT_EQ(g.decide(0, "a", t0, limits(5000, 2)).v, verdict::delay);
  EXPECT_EQ(g.decide(0, "a", t0, limits(5000, 2)).v, verdict::delay);
  const auto third = g.decide(0, "a", t0, limits(5000, 2));
  EXPECT_EQ(third.v, verdict::reject);
  EXPECT_EQ(third.reason, reject_reason::held_full);
  g.release_held();
  EXPECT_EQ(g.decide(0, "a", t0, limits(5000, 2)).v, verdict::delay);
}

TEST(Gate, SlotOfAHeldClientThatLeftIsTakenPrepaidByTheNextRequest) {
  gate g;
  g.update(0, "a", t0 + 100 * ms, 50 * ms, t0);
  const auto first = g.decide(0, "a", t0, limits());
  const auto second = g.decide(0, "a", t0, limits());
  ASSERT_EQ(first.release_us, t0 + 100 * ms);
  ASSERT_EQ(second.release_us, t0 + 150 * ms);
  EXPECT_FALSE(first.prepaid);
  g.release_held();
  g.cancel(0, "a", first, t0 + 10 * ms);  // its client went away; the master already counted t0+100
  const auto taker = g.decide(0, "a", t0 + 20 * ms, limits());
  EXPECT_EQ(taker.v, verdict::delay);
  EXPECT_EQ(taker.release_us, t0 + 100 * ms);  // the freed place, not one interval behind the queue
  EXPECT_TRUE(taker.prepaid);                   // reported already: no second DELAYED
  const auto next = g.decide(0, "a", t0 + 20 * ms, limits());
  EXPECT_EQ(next.release_us, t0 + 200 * ms);  // the queue goes on as before
  EXPECT_FALSE(next.prepaid);
}

TEST(Gate, SpareSlotLapsesAtItsTimeAndRespectsMaxHeld) {
  gate g;
  g.update(0, "a", t0 + 100 * ms, 50 * ms, t0);
  const auto first = g.decide(0, "a", t0, limits());
  g.decide(0, "a", t0, limits());
  g.release_held();
  g.cancel(0, "a", first, t0 + 10 * ms);
  // Nobody took it by t0+100: at t0+120 the next request queues normally.
  const auto late = g.decide(0, "a", t0 + 120 * ms, limits());
  EXPECT_FALSE(late.prepaid);
  EXPECT_EQ(late.release_us, t0 + 200 * ms);
  g.cancel(0, "a", late, t0 + 300 * ms);  // already past its time: nothing to give back
  EXPECT_FALSE(g.decide(0, "a", t0 + 130 * ms, limits()).prepaid);

  gate h;
  h.update(0, "b", t0 + 100 * ms, 50 * ms, t0);
  const auto held = h.decide(0, "b", t0, limits(5000, 1));
  h.cancel(0, "b", held, t0 + 1 * ms);  // still counted held (not released yet): no room
  const auto full = h.decide(0, "b", t0 + 2 * ms, limits(5000, 1));
  EXPECT_EQ(full.v, verdict::reject);
  EXPECT_EQ(full.reason, reject_reason::held_full);
  h.release_held();
  EXPECT_TRUE(h.decide(0, "b", t0 + 3 * ms, limits(5000, 1)).prepaid);
}

TEST(Gate, PastUpdatesAreNotStoredAndSweepExpires) {
  gate g;
  g.update(0, "old", t0 - 1, 0, t0);
  EXPECT_EQ(g.entries(), 0u);
  for (int i = 0; i < 200; ++i) g.update(0, "k" + std::to_string(i), t0 + 10 * ms, 0, t0);
  EXPECT_EQ(g.entries(), 200u);
  std::size_t removed = 0;
  for (int i = 0; i < 64; ++i) removed += g.sweep(t0 + 20 * ms);
  EXPECT_EQ(removed, 200u);
  EXPECT_EQ(g.entries(), 0u);
}

TEST(Gate, MemoryIsBoundedAndFailsOpen) {
  gate g(64);  // one entry per shard
  for (int i = 0; i < 1000; ++i) g.update(0, "k" + std::to_string(i), t0 + 1000 * ms, 0, t0);
  EXPECT_LE(g.entries(), 64u);
  EXPECT_GT(g.dropped_updates(), 0u);
  // Expired entries make room again.
  g.update(0, "late", t0 + 3000 * ms, 0, t0 + 2000 * ms);
  EXPECT_EQ(g.decide(0, "late", t0 + 2000 * ms, limits()).v, verdict::delay);
}

TEST(Gate, LocalPacingStopsWhenTheMasterFallsSilent) {
  // A busy identifier keeps reserving slots; with no master update for longer
  // than pacing_fresh, only the master's own time counts (fail-open).
  gate g;
  gate_limits l = limits(60'000);
  l.pacing_fresh_us = 2'000 * ms;
  g.update(0, "a", t0 + 100 * ms, 100 * ms, t0);
  for (int i = 0; i < 50; ++i) g.decide(0, "a", t0, l);  // slots reserved up to t0 + 5.1 s
  EXPECT_EQ(g.decide(0, "a", t0 + 1'000 * ms, l).v, verdict::delay);  // master still fresh
  EXPECT_EQ(g.decide(0, "a", t0 + 2'500 * ms, l).v, verdict::accept);  // silent for 2.5 s
  g.update(0, "a", t0 + 2'700 * ms, 100 * ms, t0 + 2'500 * ms);       // the master is back
  EXPECT_EQ(g.decide(0, "a", t0 + 2'500 * ms, l).v, verdict::delay);
}
