// The gate: decisions, pacing, bounds and control-memory behaviour with
// injected wall time (microseconds), no sleeping.
#include "proxy/gate/gate.hpp"
#include "proxy/request/ratelimit_fields.hpp"

#include <gtest/gtest.h>

using namespace smockron;
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
  g.release_held({});
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
  g.release_held({});
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
  g.release_held({});
  g.cancel(0, "a", first, t0 + 10 * ms);  // its client went away; the master already counted t0+100
  const auto taker = g.decide(0, "a", t0 + 20 * ms, limits());
  EXPECT_EQ(taker.v, verdict::delay);
  EXPECT_EQ(taker.release_us, t0 + 100 * ms);  // the freed place, not one interval behind the queue
  EXPECT_TRUE(taker.prepaid);                  // reported already: no second DELAYED
  const auto next = g.decide(0, "a", t0 + 20 * ms, limits());
  EXPECT_EQ(next.release_us, t0 + 200 * ms);  // the queue goes on as before
  EXPECT_FALSE(next.prepaid);
}

TEST(Gate, ASlotReportedForOneCostNeverCarriesAnother) {
  // A held request of 1 unit leaves: its slot is for 1 unit, so a request of
  // 10 does not take it (it queues and is reported with its own cost);
  // a held request whose cost is charged later (0 now) reported nothing, so
  // it gives nothing back.
  gate g;
  g.update(0, "a", t0 + 100 * ms, 50 * ms, t0);
  const auto one = g.decide(0, "a", t0, limits());
  g.release_held({});
  g.cancel(0, "a", one, t0 + 10 * ms);
  const auto costly = g.decide(0, "a", t0 + 20 * ms, limits(), 10);
  EXPECT_EQ(costly.v, verdict::delay);
  EXPECT_FALSE(costly.prepaid);
  EXPECT_EQ(costly.units, 10);
  EXPECT_EQ(costly.release_us, t0 + 100 * ms + 10 * 50 * ms) << "behind the first held one, its 10 units";
  g.release_held({});
  EXPECT_TRUE(g.decide(0, "a", t0 + 20 * ms, limits()).prepaid) << "still there for a request of 1";
  g.release_held({});

  gate h;
  h.update(0, "b", t0 + 100 * ms, 50 * ms, t0);
  const auto later = h.decide(0, "b", t0, limits(), 0, 1'000);
  h.release_held({});
  h.cancel(0, "b", later, t0 + 10 * ms);
  EXPECT_FALSE(h.decide(0, "b", t0 + 20 * ms, limits()).prepaid);
}

TEST(Gate, SpareSlotLapsesAtItsTimeAndRespectsMaxHeld) {
  gate g;
  g.update(0, "a", t0 + 100 * ms, 50 * ms, t0);
  const auto first = g.decide(0, "a", t0, limits());
  g.decide(0, "a", t0, limits());
  g.release_held({});
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
  h.release_held({});
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
  for (int i = 0; i < 50; ++i) g.decide(0, "a", t0, l);                // slots reserved up to t0 + 5.1 s
  EXPECT_EQ(g.decide(0, "a", t0 + 1'000 * ms, l).v, verdict::delay);   // master still fresh
  EXPECT_EQ(g.decide(0, "a", t0 + 2'500 * ms, l).v, verdict::accept);  // silent for 2.5 s
  g.update(0, "a", t0 + 2'700 * ms, 100 * ms, t0 + 2'500 * ms);        // the master is back
  EXPECT_EQ(g.decide(0, "a", t0 + 2'500 * ms, l).v, verdict::delay);
}

namespace {
void set_policy(gate& g, std::uint32_t domain, std::initializer_list<guard_rule> rules, std::int64_t now) {
  g.set_policy(domain, std::vector<guard_rule>(rules), now);
}
}  // namespace

// Before the master's first DELAY_UNTIL: the burst passes, then requests are
// held one interval apart, by the gate alone.
TEST(GateGuard, HotClientIsBoundedBeforeTheMasterSpeaks) {
  gate g;
  set_policy(g, 0, {{100 * ms, 3}}, t0);  // 10/s burst 3
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g.decide(0, "hot", t0, limits()).v, verdict::accept) << i;
  std::vector<std::int64_t> releases;
  for (int i = 0; i < 2; ++i) {
    const auto d = g.decide(0, "hot", t0, limits());
    ASSERT_EQ(d.v, verdict::delay);
    EXPECT_EQ(d.interval_us, 100 * ms);
    releases.push_back(d.release_us - t0);
  }
  EXPECT_EQ(releases, (std::vector<std::int64_t>{100 * ms, 200 * ms}));
  // On its own authority the guard holds only k_guard_hold_intervals ahead
  // (max_delay is 5 s): refused, and a refusal uses no slot.
  const auto refused = g.decide(0, "hot", t0, limits());
  EXPECT_EQ(refused.v, verdict::reject);
  EXPECT_EQ(refused.release_us, t0 + 300 * ms);
  EXPECT_EQ(g.decide(0, "hot", t0 + 100 * ms, limits()).release_us, t0 + 300 * ms);
  // Once the master has spoken about the client, max_delay applies again.
  g.update(0, "hot", t0 + 150 * ms, 100 * ms, t0 + 100 * ms);
  const auto d = g.decide(0, "hot", t0 + 100 * ms, limits());
  ASSERT_EQ(d.v, verdict::delay);
  EXPECT_EQ(d.release_us, t0 + 400 * ms);
  // Other identifiers and domains have their own budget; an unguarded domain has none.
  EXPECT_EQ(g.decide(0, "other", t0, limits()).v, verdict::accept);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(g.decide(1, "hot", t0, limits()).v, verdict::accept);
}

// Pace share: the master's interval is this gatekeeper's share of the pace
// (the rule's times the gatekeepers holding the client); a request's own
// units still fit one rule interval each after the master's time.
TEST(GateGuard, UnitsFitByTheRuleWhileTheQueueGoesAtTheSharedPace) {
  gate g;
  set_policy(g, 0, {{1 * ms, 1000}}, t0);        // 1000/s burst 1000
  g.update(0, "a", t0 + 100 * ms, 10 * ms, t0);  // held; ten gatekeepers share the pace
  const auto first = g.decide(0, "a", t0, limits(), 50);
  ASSERT_EQ(first.v, verdict::delay);
  EXPECT_EQ(first.release_us, t0 + 149 * ms) << "49 more units, one rule interval each (not 490 ms)";
  EXPECT_EQ(first.interval_us, 10 * ms);
  // The next held request: after the first one's 50 units at the shared pace (its own are paced after it).
  EXPECT_EQ(g.decide(0, "a", t0, limits(), 50).release_us, t0 + 649 * ms);
  // With a burst of 500 the client's bucket is whole at 599 ms as the master
  // last told (plan.cpp): the share's slot is no later than that.
  gate small;
  set_policy(small, 0, {{1 * ms, 500}}, t0);
  small.update(0, "a", t0 + 100 * ms, 10 * ms, t0);
  small.decide(0, "a", t0, limits(), 50);
  EXPECT_EQ(small.decide(0, "a", t0, limits(), 50).release_us, t0 + 599 * ms);
}

// A client under its limit is never held by the guard: sends that fit the
// rules' sliding logs fit their GCRAs. Here both rules are met exactly at
// their bounds: bursts of 3 every 300 ms (10/s burst 3), and 20 uses then the
// same 20 again 20 s later (1/s burst 20).
TEST(GateGuard, ClientUnderItsLimitIsNeverHeld) {
  gate g;
  const std::vector<guard_rule> rules{{100 * ms, 3}, {1'000 * ms, 20}};
  for (std::int64_t batch : {0, 20'000}) {
    for (int k = 0; k < 20; ++k) {
      const std::int64_t at = t0 + batch * ms + (k / 3) * 300 * ms + (k % 3) * ms;
      g.set_policy(0, rules, at);  // the master keeps publishing
      EXPECT_EQ(g.decide(0, "calm", at, limits()).v, verdict::accept) << batch << "/" << k;
    }
  }
  // The same pacing kept up goes over the second rule: it binds (GCRA admits
  // burst + elapsed / interval = 20 + 2.4 by then).
  int stopped = 0;
  for (int k = 0; k < 27; ++k) {
    const std::int64_t at = t0 + 60'000 * ms + (k / 3) * 300 * ms + (k % 3) * ms;
    g.set_policy(0, rules, at);
    const auto d = g.decide(0, "busy", at, limits());
    if (k < 20) {
      EXPECT_EQ(d.v, verdict::accept) << k;
    }
    if (d.v != verdict::accept) ++stopped;
    if (d.v == verdict::delay) g.release_held({});
  }
  EXPECT_GE(stopped, 4);
}

// Arrival times computed under other rules are not carried over (a reload on
// the master changed them): the new rules start afresh.
TEST(GateGuard, PolicyChangeStartsTheGuardAfresh) {
  gate g;
  set_policy(g, 0, {{10'000 * ms, 1}}, t0);  // 1 per 10 s
  EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::accept);
  set_policy(g, 0, {{100 * ms, 10}}, t0);  // 10/s burst 10
  for (int i = 0; i < 10; ++i) EXPECT_EQ(g.decide(0, "a", t0 + 1 * ms, limits()).v, verdict::accept) << i;
  EXPECT_EQ(g.decide(0, "a", t0 + 1 * ms, limits()).v, verdict::delay);
  g.release_held({});
}

// The master's word and the guard combine: whichever is later holds.
TEST(GateGuard, MasterDelayAndGuardCombine) {
  gate g;
  set_policy(g, 0, {{100 * ms, 1}}, t0);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::accept);
  g.update(0, "a", t0 + 500 * ms, 100 * ms, t0);  // the master knows of earlier uses elsewhere
  const auto d = g.decide(0, "a", t0 + 1 * ms, limits());
  ASSERT_EQ(d.v, verdict::delay);
  EXPECT_EQ(d.release_us, t0 + 500 * ms);
  EXPECT_EQ(g.decide(0, "a", t0 + 2 * ms, limits()).release_us, t0 + 600 * ms);  // paced behind it
}

// A silent master means fail-open: the guard needs a fresh policy.
TEST(GateGuard, StalePolicyMeansNoGuard) {
  gate g;
  set_policy(g, 0, {{100 * ms, 1}}, t0);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::accept);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::delay);
  g.release_held({});
  const std::int64_t later = t0 + smockron::wire::policy_fresh_ms * ms + 1;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(g.decide(0, "b", later, limits()).v, verdict::accept);
  set_policy(g, 0, {{100 * ms, 1}}, later);  // refreshed: guarded again
  EXPECT_EQ(g.decide(0, "c", later, limits()).v, verdict::accept);
  EXPECT_EQ(g.decide(0, "c", later, limits()).v, verdict::delay);
  g.release_held({});
}

TEST(GateGuard, PolicyChangesApplyAndExtraRulesAreIgnored) {
  gate g;
  std::vector<guard_rule> many(smockron::wire::max_policy_rules + 2, guard_rule{100 * ms, 2});
  g.set_policy(0, many, t0);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::accept);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::accept);
  EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::delay);
  g.release_held({});
  set_policy(g, 0, {{100 * ms, 5}}, t0);  // a larger burst takes effect at once
  EXPECT_EQ(g.decide(0, "b", t0, limits()).v, verdict::accept);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.decide(0, "b", t0, limits()).v, verdict::accept) << i;
  EXPECT_EQ(g.decide(0, "b", t0, limits()).v, verdict::delay);
  g.release_held({});
  // Domain ids beyond what policies are kept for are not guarded (and the caller is told).
  const guard_rule one{100 * ms, 1};
  EXPECT_FALSE(g.set_policy(gate::k_policy_domains, {&one, 1}, t0));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g.decide(gate::k_policy_domains, "a", t0, limits()).v, verdict::accept);
}

// Guard state is bounded: it uses at most half the control memory, the rest
// stays for the master's DELAY_UNTIL; untracked identifiers pass and are counted.
TEST(GateGuard, GuardUsesAtMostHalfTheControlMemory) {
  gate g(64 * 4);  // 4 per shard
  set_policy(g, 0, {{1'000 * ms, 1}}, t0);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(g.decide(0, "id" + std::to_string(i), t0, limits()).v, verdict::accept);
  EXPECT_LE(g.entries(), 64u * 2);
  EXPECT_GT(g.unguarded(), 0u);
  // The master's word still finds room (two keys fit even in one shard).
  g.update(0, "hot-a", t0 + 500 * ms, 100 * ms, t0);
  g.update(0, "hot-b", t0 + 500 * ms, 100 * ms, t0);
  EXPECT_EQ(g.dropped_updates(), 0u);
  EXPECT_EQ(g.decide(0, "hot-a", t0, limits()).release_us, t0 + 500 * ms);
  EXPECT_EQ(g.decide(0, "hot-b", t0, limits()).release_us, t0 + 500 * ms);
  // Expired guard state is swept.
  for (std::size_t i = 0; i < 64; ++i) g.sweep(t0 + 2'000 * ms);
  EXPECT_EQ(g.entries(), 0u);
}

// Gatekeepers with different horizons do not all reserve the slot that just
// came within reach: the farthest-reaching one takes it.
TEST(Gate, HorizonShortensHowFarAheadRequestsAreHeld) {
  gate near_one(1'000'000, 0.0), far_one(1'000'000, 1.0);
  for (gate* g : {&near_one, &far_one}) g->update(0, "hot", t0 + 4'000 * ms, 100 * ms, t0);
  // max_delay 5 s: 4 s ahead is within plain max_delay, beyond 5 s x (1 - 0.25).
  EXPECT_EQ(near_one.decide(0, "hot", t0, limits(5000)).v, verdict::delay);
  EXPECT_EQ(far_one.decide(0, "hot", t0, limits(5000)).v, verdict::reject);
  EXPECT_EQ(far_one.decide(0, "hot", t0 + 300 * ms, limits(5000)).v, verdict::delay);
}

// A domain is covered while a master keeps publishing its POLICY (rules or
// none): what fail_closed asks.
TEST(Gate, CoveredWhilePoliciesArriveEvenWithoutRules) {
  gate g;
  EXPECT_FALSE(g.covered(0, t0));
  g.set_policy(0, {}, t0);  // a domain without rules
  EXPECT_TRUE(g.covered(0, t0 + 1'000 * ms));
  EXPECT_FALSE(g.covered(1, t0));
  EXPECT_FALSE(g.covered(0, t0 + smockron::wire::policy_fresh_ms * ms + 1));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(g.decide(0, "a", t0, limits()).v, verdict::accept);  // no rules, no guard
  EXPECT_FALSE(g.covered(gate::k_policy_domains, t0));
}

// What RateLimit-Policy and RateLimit report: the domain's rules, and the
// client's standing under each as the guard counted it.
TEST(GateQuota, RemainingAndResetFollowTheGuard) {
  gate g;
  EXPECT_EQ(g.quota(0, "c", t0).count, 0u) << "no policy: nothing known";
  set_policy(g, 0, {{100 * ms, 3}, {10'000 * ms, 50}}, t0);  // 10/s burst 3; 6/min burst 50
  auto q = g.quota(0, "c", t0);
  ASSERT_EQ(q.count, 2u);
  EXPECT_EQ(q.items[0].quota, 3);
  EXPECT_EQ(q.items[0].window_s, 1) << "300 ms, in whole seconds";
  EXPECT_EQ(q.items[0].remaining, 3) << "an unknown client has all of it";
  EXPECT_EQ(q.items[0].reset_s, 0);
  EXPECT_EQ(q.items[1].window_s, 500);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(g.decide(0, "c", t0, limits()).v, verdict::accept);
  q = g.quota(0, "c", t0);
  EXPECT_EQ(q.items[0].remaining, 1);
  EXPECT_EQ(q.items[0].reset_s, 1) << "200 ms until whole, rounded up";
  EXPECT_EQ(q.items[1].remaining, 48);
  EXPECT_EQ(q.items[1].reset_s, 20);
  q = g.quota(0, "c", t0 + 150 * ms);
  EXPECT_EQ(q.items[0].remaining, 2) << "one interval later, one more";
  set_policy(g, 0, {{100 * ms, 3}, {10'000 * ms, 50}}, t0 + 1'000 * ms);  // the master keeps publishing
  EXPECT_EQ(g.quota(0, "c", t0 + 1'000 * ms).items[1].remaining, 48) << "the long rule replenishes slowly";
  EXPECT_EQ(g.quota(0, "c", t0 + 1'000 * ms).items[0].remaining, 3);
  EXPECT_EQ(g.quota(0, "c", t0 + 60'000 * ms).count, 0u) << "no fresh policy: nothing known";
}

// A master's per-identifier override: that client is guarded, and described,
// by its own rules; the others by the domain's. Fail-open when not refreshed.
TEST(GateGuard, OverrideGivesOneIdentifierItsOwnRules) {
  gate g;
  set_policy(g, 0, {{100 * ms, 2}}, t0);                                              // 10/s burst 2 for everyone
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{10 * ms, 20}}, t0));  // 100/s burst 20
  EXPECT_EQ(g.overrides(), 1u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(g.decide(0, "vip", t0, limits()).v, verdict::accept) << i;
  const auto held = g.decide(0, "vip", t0, limits());
  ASSERT_EQ(held.v, verdict::delay);
  EXPECT_EQ(held.release_us, t0 + 10 * ms);
  EXPECT_EQ(held.interval_us, 10 * ms);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(g.decide(0, "plain", t0, limits()).v, verdict::accept);
  EXPECT_EQ(g.decide(0, "plain", t0, limits()).v, verdict::delay);
  auto q = g.quota(0, "vip", t0);
  ASSERT_EQ(q.count, 1u);
  EXPECT_EQ(q.items[0].quota, 20);
  EXPECT_EQ(g.quota(0, "plain", t0).items[0].quota, 2);
  // Another domain's identifier of the same name is not overridden.
  set_policy(g, 1, {{100 * ms, 2}}, t0);
  EXPECT_EQ(g.quota(1, "vip", t0).items[0].quota, 2);

  // No rules: that client is not limited by the gate at all.
  ASSERT_TRUE(g.set_override(0, "internal", std::vector<guard_rule>{}, t0));
  for (int i = 0; i < 50; ++i) EXPECT_EQ(g.decide(0, "internal", t0, limits()).v, verdict::accept) << i;
  EXPECT_EQ(g.quota(0, "internal", t0).count, 0u);

  // The master keeps publishing the domain's policy but no longer the
  // override: after policy_fresh_ms the domain's rules apply again.
  const std::int64_t later = t0 + (smockron::wire::policy_fresh_ms + 100) * ms;
  set_policy(g, 0, {{100 * ms, 2}}, later);
  EXPECT_EQ(g.quota(0, "vip", later).items[0].quota, 2);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(g.decide(0, "vip", later, limits()).v, verdict::accept) << i;
  EXPECT_EQ(g.decide(0, "vip", later, limits()).v, verdict::delay);
  for (std::size_t i = 0; i < 64; ++i) g.sweep(later);  // every shard: stale overrides are dropped
  EXPECT_EQ(g.overrides(), 0u);
}

TEST(GateGuard, OverrideChangeStartsTheClientAfreshAndOverridesAreBounded) {
  gate g;
  set_policy(g, 0, {{100 * ms, 2}}, t0);
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{100 * ms, 3}}, t0));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g.decide(0, "vip", t0, limits()).v, verdict::accept);
  EXPECT_EQ(g.decide(0, "vip", t0, limits()).v, verdict::delay);
  // The same rules again (the periodic refresh) keep the state ...
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{100 * ms, 3}}, t0 + 1 * ms));
  EXPECT_EQ(g.quota(0, "vip", t0 + 1 * ms).items[0].remaining, 0);
  // ... new rules start it afresh.
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{100 * ms, 5}}, t0 + 2 * ms));
  EXPECT_EQ(g.quota(0, "vip", t0 + 2 * ms).items[0].remaining, 5);
  EXPECT_FALSE(g.set_override(gate::k_policy_domains, "x", std::vector<guard_rule>{}, t0));
  for (std::size_t i = g.overrides(); i < gate::k_max_overrides; ++i) {
    ASSERT_TRUE(g.set_override(0, "id" + std::to_string(i), std::vector<guard_rule>{}, t0));
  }
  EXPECT_FALSE(g.set_override(0, "one-too-many", std::vector<guard_rule>{}, t0));
  EXPECT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{100 * ms, 5}}, t0)) << "refreshing one kept is fine";
}

// A request naming a tier (TIER) is guarded, and described, by that tier's
// rules; an override still comes first; an unknown or stale tier falls back
// to the domain's rules. The domain's quotas are not a tiered client's.
TEST(GateGuard, ATierGivesItsRequestsItsRules) {
  gate g;
  set_policy(g, 0, {{100 * ms, 2}}, t0);
  ASSERT_TRUE(g.set_tier(0, "pro", std::vector<guard_rule>{{10 * ms, 20}}, t0));
  EXPECT_EQ(g.tiers(), 1u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(g.decide(0, "a", t0, limits(), 1, 0, "pro").v, verdict::accept) << i;
  const auto held = g.decide(0, "a", t0, limits(), 1, 0, "pro");
  ASSERT_EQ(held.v, verdict::delay);
  EXPECT_EQ(held.interval_us, 10 * ms);
  EXPECT_EQ(g.quota(0, "a", t0, "pro").items[0].quota, 20);
  // No tier, or one the master did not publish: the domain's rules.
  for (int i = 0; i < 2; ++i) EXPECT_EQ(g.decide(0, "b", t0, limits(), 1, 0, "gold").v, verdict::accept);
  EXPECT_EQ(g.decide(0, "b", t0, limits(), 1, 0, "gold").v, verdict::delay);
  EXPECT_EQ(g.quota(0, "b", t0).items[0].quota, 2);
  // An override before the tier.
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{10 * ms, 50}}, t0));
  EXPECT_EQ(g.quota(0, "vip", t0, "pro").items[0].quota, 50);
  // The same tier in another domain is another tier.
  set_policy(g, 1, {{100 * ms, 2}}, t0);
  EXPECT_EQ(g.quota(1, "a", t0, "pro").items[0].quota, 2);
  // The domain's quotas describe the domain's clients only.
  const std::vector<smockron::wire::quota_policy::item> quotas{{1000, smockron::calendar::period::day, 0, 0}};
  ASSERT_TRUE(g.set_quotas(0, quotas, t0));
  EXPECT_EQ(g.quota(0, "b", t0).count, 2u);
  EXPECT_EQ(g.quota(0, "a", t0, "pro").count, 1u);
  // A client whose plan changes: what the master said under its old tier no
  // longer holds it (its next use tells the master, which answers under the new one).
  EXPECT_EQ(g.decide(0, "c", t0, limits(), 1, 0, {}, true).v, verdict::accept);
  g.update(0, "c", t0 + 60'000 * ms, 100 * ms, t0);
  EXPECT_EQ(g.decide(0, "c", t0, limits(), 1, 0, {}, true).v, verdict::reject);  // a minute: beyond max_delay
  EXPECT_EQ(g.decide(0, "c", t0, limits(), 1, 0, "pro", true).v, verdict::accept);
  g.update(0, "c", t0 + 60'000 * ms, 100 * ms, t0);
  EXPECT_EQ(g.decide(0, "c", t0, limits(), 1, 0, "pro", true).v,
            verdict::reject);  // the same tier: the master's word holds
  // A request of a route without a tier source names none: alternating with
  // it frees no one from the master's word.
  EXPECT_EQ(g.decide(0, "c", t0, limits()).v, verdict::reject);
  EXPECT_EQ(g.decide(0, "c", t0, limits(), 1, 0, "pro", true).v, verdict::reject);
  // Not refreshed: the domain's rules again, and the sweep drops it.
  const std::int64_t later = t0 + (smockron::wire::policy_fresh_ms + 100) * ms;
  set_policy(g, 0, {{100 * ms, 2}}, later);
  EXPECT_EQ(g.quota(0, "a", later, "pro").items[0].quota, 2);
  for (std::size_t i = 0; i < 64; ++i) g.sweep(later);
  EXPECT_EQ(g.tiers(), 0u);
  EXPECT_FALSE(g.set_tier(gate::k_policy_domains, "pro", std::vector<guard_rule>{}, t0));
}

TEST(RateLimitFields, AConcurrencyLimitIsAPolicyOfItsOwn) {
  std::string out;
  append_concurrency_fields(out, "llm", 4, false);
  EXPECT_EQ(out, "RateLimit-Policy: \"llm-concurrency\";q=4;qu=\"concurrent-requests\"\r\n");
  out.clear();
  append_concurrency_fields(out, "llm", 4, true);
  EXPECT_EQ(out,
            "RateLimit-Policy: \"llm-concurrency\";q=4;qu=\"concurrent-requests\"\r\n"
            "RateLimit: \"llm-concurrency\";r=0;t=1\r\n");
}

TEST(RateLimitFields, DraftTenSyntax) {
  quota_state q;
  q.count = 1;
  q.items[0] = {20, 2, 7, 1};
  std::string out;
  append_ratelimit_fields(out, "api", q, 0);
  EXPECT_EQ(out, "RateLimit-Policy: \"api\";q=20;w=2\r\nRateLimit: \"api\";r=7;t=1\r\n");
  q.count = 2;
  q.items[1] = {100, 3600, 90, 360};
  out.clear();
  append_ratelimit_fields(out, "api", q, 5);  // refused for 5 s: nothing remains until then
  EXPECT_EQ(out,
            "RateLimit-Policy: \"api-1\";q=20;w=2, \"api-2\";q=100;w=3600\r\n"
            "RateLimit: \"api-1\";r=0;t=5, \"api-2\";r=0;t=360\r\n");
  out.clear();
  append_ratelimit_fields(out, "api", quota_state{}, 5);
  EXPECT_EQ(out, "") << "nothing known, nothing said";
  append_decision_field(out, decision::delayed, std::nullopt, "", 250);
  append_decision_field(out, decision::rejected, std::nullopt, "held_full", 0);
  append_decision_field(out, decision::accepted, decision::rejected, "", 0);
  EXPECT_EQ(out,
            "Smockron-Decision: delayed;held_ms=250\r\nSmockron-Decision: rejected;reason=held_full\r\n"
            "Smockron-Decision: accepted;shadow=rejected\r\n");
}

// A domain's quotas (QUOTA): described in RateLimit-Policy beside the rules;
// in RateLimit only once the client is known to have exhausted one (the
// master's DELAY_UNTIL to its window's end). Dropped when not refreshed.
TEST(GateGuard, QuotasAreDescribedAndKnownExhaustedOnly) {
  gate g;
  set_policy(g, 0, {{100 * ms, 2}}, t0);
  using item = smockron::wire::quota_policy::item;
  const std::vector<item> quotas{{1'000, smockron::calendar::period::fixed, 0, 60}};
  ASSERT_TRUE(g.set_quotas(0, quotas, t0));
  const auto window = quotas[0].window();
  const std::int64_t end = smockron::calendar::window_end_us(window, t0);
  auto q = g.quota(0, "c", t0);
  ASSERT_EQ(q.count, 2u);
  EXPECT_EQ(q.items[0].quota, 2) << "the rate rule first";
  EXPECT_EQ(q.items[1].quota, 1'000);
  EXPECT_EQ(q.items[1].window_s, 60);
  EXPECT_EQ(q.items[1].remaining, -1) << "the master counts the units left";
  EXPECT_EQ(q.items[1].reset_s, (end - t0 + 999'999) / 1'000'000);
  // The master says the client waits until the window's end: exhausted.
  g.update(0, "c", end, 0, t0);
  EXPECT_EQ(g.quota(0, "c", t0).items[1].remaining, 0);
  // A domain with quotas and no rate rule.
  set_policy(g, 1, {}, t0);
  ASSERT_TRUE(g.set_quotas(1, quotas, t0));
  EXPECT_EQ(g.quota(1, "c", t0).count, 1u);
  // An overridden identifier: its own rules only.
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{10 * ms, 20}}, t0));
  EXPECT_EQ(g.quota(0, "vip", t0).count, 1u);
  // Not refreshed: gone.
  const std::int64_t later = t0 + (smockron::wire::policy_fresh_ms + 100) * ms;
  set_policy(g, 0, {{100 * ms, 2}}, later);
  EXPECT_EQ(g.quota(0, "c", later).count, 1u);
  EXPECT_FALSE(g.set_quotas(gate::k_policy_domains, quotas, t0));
}

// A cost over one of the domain's quotas can never fit: refused at once, the
// client's standing untouched. An overridden identifier's quotas are its
// override's, which replace the domain's (the master applies them), and a
// tier's are the master's too: neither is refused by the domain's.
TEST(GateGuard, ACostOverADomainQuotaIsRefusedUnlessAnOverrideReplacesIt) {
  gate g;
  set_policy(g, 0, {{1 * ms, 1'000}}, t0);
  using item = smockron::wire::quota_policy::item;
  ASSERT_TRUE(g.set_quotas(0, std::vector<item>{{100, smockron::calendar::period::day, 0, 0}}, t0));
  auto d = g.decide(0, "c", t0, limits(), 101);
  EXPECT_EQ(d.v, verdict::reject);
  EXPECT_EQ(d.reason, reject_reason::cost_over_limit);
  EXPECT_EQ(d.units, 101);
  EXPECT_EQ(g.quota(0, "c", t0).items[0].remaining, 1'000) << "nothing charged";
  EXPECT_EQ(g.decide(0, "c", t0, limits(), 100).v, verdict::accept) << "the quota's whole limit fits";
  ASSERT_TRUE(g.set_override(0, "internal", std::vector<guard_rule>{}, t0));
  EXPECT_EQ(g.decide(0, "internal", t0, limits(), 101).v, verdict::accept);
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{1 * ms, 1'000}}, t0));
  EXPECT_EQ(g.decide(0, "vip", t0, limits(), 101).v, verdict::accept);
  ASSERT_TRUE(g.set_tier(0, "pro", std::vector<guard_rule>{{1 * ms, 1'000}}, t0));
  EXPECT_EQ(g.decide(0, "t", t0, limits(), 101, 0, "pro").v, verdict::accept);
  // Not refreshed: the quota is no longer known here, and the master judges.
  const std::int64_t later = t0 + (smockron::wire::policy_fresh_ms + 100) * ms;
  set_policy(g, 0, {{1 * ms, 1'000}}, later);
  EXPECT_EQ(g.decide(0, "d", later, limits(), 101).v, verdict::accept);
}

// LIMIT names what holds a client: only that item is at zero in RateLimit,
// the others show what they have left; a share is a policy of its own. The
// name goes with the DELAY_UNTIL it came with: a later one forgets it.
TEST(GateGuard, TheLimitTheMasterNamesIsTheOneAtZero) {
  using smockron::wire::limit_ref;
  gate g;
  set_policy(g, 0, {{10 * ms, 100}, {1'000 * ms, 2}}, t0);
  using item = smockron::wire::quota_policy::item;
  ASSERT_TRUE(g.set_quotas(0, std::vector<item>{{1'000, smockron::calendar::period::fixed, 0, 60}}, t0));
  const std::int64_t next = t0 + 2'000 * ms;
  g.update(0, "c", next, 1'000 * ms, t0);
  EXPECT_EQ(g.quota(0, "c", t0).limiting, -1) << "not named yet";
  g.name_limit(0, "c", next + 1, {limit_ref::kind::rule, 1, 0, 0});
  EXPECT_EQ(g.quota(0, "c", t0).limiting, -1) << "another DELAY_UNTIL's";
  g.name_limit(0, "c", next, {limit_ref::kind::rule, 1, 0, 0});
  auto q = g.quota(0, "c", t0);
  EXPECT_EQ(q.limiting, 1);
  EXPECT_EQ(q.share.burst, 0);
  std::string out;
  append_ratelimit_fields(out, "api", q, 2);
  EXPECT_EQ(out,
            "RateLimit-Policy: \"api-1\";q=100;w=1, \"api-2\";q=2;w=2, \"api-3\";q=1000;w=60\r\n"
            "RateLimit: \"api-1\";r=100;t=0, \"api-2\";r=0;t=2\r\n");
  // A quota: the third item, exhausted.
  g.name_limit(0, "c", next, {limit_ref::kind::quota, 0, 0, 0});
  q = g.quota(0, "c", t0);
  EXPECT_EQ(q.limiting, 2);
  EXPECT_EQ(q.items[2].remaining, 0);
  // Past what this gatekeeper shows: nothing named.
  g.name_limit(0, "c", next, {limit_ref::kind::quota, 1, 0, 0});
  EXPECT_EQ(g.quota(0, "c", t0).limiting, -1);
  g.name_limit(0, "c", next, {limit_ref::kind::rule, 2, 0, 0});
  EXPECT_EQ(g.quota(0, "c", t0).limiting, -1);
  // A share: described, and the rules keep what they have left.
  g.name_limit(0, "c", next, {limit_ref::kind::share, 0, 250 * ms, 8});
  q = g.quota(0, "c", t0);
  EXPECT_EQ(q.limiting, -1);
  EXPECT_EQ(q.share.burst, 8);
  EXPECT_EQ(q.share.window_s, 2);
  out.clear();
  append_ratelimit_fields(out, "api", q, 2);
  EXPECT_EQ(out,
            "RateLimit-Policy: \"api-share\";q=8;w=2\r\nRateLimit: \"api-share\";r=0;t=2\r\n"
            "RateLimit-Policy: \"api-1\";q=100;w=1, \"api-2\";q=2;w=2, \"api-3\";q=1000;w=60\r\n"
            "RateLimit: \"api-1\";r=100;t=0, \"api-2\";r=2;t=0\r\n");
  // The master moves the time on: what it named goes with the old time.
  g.update(0, "c", next + 1'000 * ms, 1'000 * ms, t0);
  q = g.quota(0, "c", t0);
  EXPECT_EQ(q.limiting, -1);
  EXPECT_EQ(q.share.burst, 0);
  // Once the time has passed, nothing holds the client: nothing is named.
  g.name_limit(0, "c", next + 1'000 * ms, {limit_ref::kind::rule, 1, 0, 0});
  EXPECT_EQ(g.quota(0, "c", t0).limiting, 1);
  EXPECT_EQ(g.quota(0, "c", next + 1'000 * ms).limiting, -1);
  g.name_limit(0, "nobody", next, {limit_ref::kind::rule, 1, 0, 0});  // no entry: nothing kept
  EXPECT_EQ(g.quota(0, "nobody", t0).limiting, -1);
  // The master judged a request of tier "pro" (its rules, fresh here): the
  // name is shown on that tier's requests only, not against the domain's rules.
  ASSERT_TRUE(g.set_tier(0, "pro", std::vector<guard_rule>{{10 * ms, 100}, {500 * ms, 4}}, t0));
  EXPECT_EQ(g.decide(0, "t", t0, limits(), 1, 0, "pro", true).v, verdict::accept);  // the entry: tier pro
  g.update(0, "t", next, 1'000 * ms, t0);
  g.name_limit(0, "t", next, {limit_ref::kind::rule, 1, 0, 0});
  EXPECT_EQ(g.quota(0, "t", t0, "pro").limiting, 1);
  EXPECT_EQ(g.quota(0, "t", t0, "").limiting, -1) << "the domain's rules: not the ones named";
  EXPECT_EQ(g.quota(0, "t", t0, "gold").limiting, -1) << "a tier not known here shows the domain's";
}

TEST(RateLimitFields, AShareIsAtZeroOnlyWhenItHolds) {
  quota_state q;
  q.count = 1;
  q.items[0] = {20, 2, 7, 1};
  q.share = {4, 1};
  std::string out;
  append_ratelimit_fields(out, "api", q, 0);
  EXPECT_EQ(out,
            "RateLimit-Policy: \"api-share\";q=4;w=1\r\n"
            "RateLimit-Policy: \"api\";q=20;w=2\r\nRateLimit: \"api\";r=7;t=1\r\n");
}

TEST(RateLimitFields, AQuotaNotKnownHereIsInThePolicyOnly) {
  quota_state q;
  q.count = 2;
  q.items[0] = {20, 2, 7, 1};
  q.items[1] = {1'000'000, 2'592'000, -1, 86'400};
  std::string out;
  append_ratelimit_fields(out, "llm", q, 0);
  EXPECT_EQ(out,
            "RateLimit-Policy: \"llm-1\";q=20;w=2, \"llm-2\";q=1000000;w=2592000\r\n"
            "RateLimit: \"llm-1\";r=7;t=1\r\n");
  q.items[1].remaining = 0;  // exhausted
  out.clear();
  append_ratelimit_fields(out, "llm", q, 86'400);
  EXPECT_EQ(out,
            "RateLimit-Policy: \"llm-1\";q=20;w=2, \"llm-2\";q=1000000;w=2592000\r\n"
            "RateLimit: \"llm-1\";r=0;t=86400, \"llm-2\";r=0;t=86400\r\n");
  q.count = 1;
  q.items[0] = q.items[1];
  q.items[0].remaining = -1;
  out.clear();
  append_ratelimit_fields(out, "llm", q, 0);
  EXPECT_EQ(out, "RateLimit-Policy: \"llm\";q=1000000;w=2592000\r\n") << "no RateLimit line without an item";
}

// An override whose rules change (set at run time through the master's API):
// what the master said of the client under the old rules goes, the new apply
// at once; the same override published again changes nothing.
TEST(GateGuard, AChangedOverrideDropsWhatTheMasterSaidUnderTheOldRules) {
  gate g;
  set_policy(g, 0, {{100 * ms, 2}}, t0);
  g.update(0, "vip", t0 + 60'000 * ms, 60'000 * ms, t0);  // throttled a minute by the domain's rules
  g.update(0, "other", t0 + 60'000 * ms, 60'000 * ms, t0);
  EXPECT_EQ(g.decide(0, "vip", t0, limits()).v, verdict::reject);
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{10 * ms, 20}}, t0));
  EXPECT_EQ(g.decide(0, "vip", t0, limits()).v, verdict::accept);
  EXPECT_EQ(g.decide(0, "other", t0, limits()).v, verdict::reject) << "only the overridden identifier";
  g.update(0, "vip", t0 + 60'000 * ms, 10 * ms, t0);
  ASSERT_TRUE(g.set_override(0, "vip", std::vector<guard_rule>{{10 * ms, 20}}, t0 + 1'000 * ms));  // refreshed
  EXPECT_EQ(g.decide(0, "vip", t0 + 1'000 * ms, limits()).v, verdict::reject) << "the same rules: kept";
}
