// The gate's decision arithmetic as a table: a client's entry, the guard's
// policy and the limits in, the plan out; then what recording it does to the
// entry. No map, no locks, no clock (times in ms below).
#include "proxy/gate/plan.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace smockron::proxy;

namespace {
constexpr std::int64_t ms = 1000;
constexpr std::int64_t now = 1'000'000 * ms;
constexpr std::int64_t max_delay = 5'000 * ms;
constexpr std::int64_t fresh = 2'000 * ms;

guard_policy no_guard() { return {}; }
guard_policy one_rule(std::int64_t interval_ms, std::int64_t burst) {
  guard_policy g;
  g.rules[0] = {interval_ms * ms, burst};
  g.count = 1;
  g.seq = 2;
  return g;
}

struct row {
  std::string name;
  client_entry e;
  guard_policy guard;
  // expected
  bool accept;
  std::int64_t release;  ///< ms after now (when not accepted)
  bool too_long;
  std::int64_t spare;  ///< ms after now, 0: none
};

client_entry master_says(std::int64_t next_after_ms, std::int64_t spoke_ago_ms = 0, std::int64_t interval_ms = 100) {
  client_entry e;
  e.next_us = now + next_after_ms * ms;
  e.updated_us = now - spoke_ago_ms * ms;
  e.interval_us = interval_ms * ms;
  e.policy_seq = 2;
  return e;
}

}  // namespace

TEST(GatePlan, Table) {
  client_entry paced = master_says(100);
  paced.local_next_us = now + 700 * ms;  // two requests already held on this gatekeeper
  client_entry stale_paced = paced;
  stale_paced.updated_us = now - 3'000 * ms;  // the master went quiet: only its own time counts
  client_entry guarded;                       // the guard alone: 1 per 500 ms, burst 1, a use 100 ms ago
  guarded.tat[0] = now + 400 * ms;
  guarded.policy_seq = 2;
  client_entry guarded_far = guarded;  // the guard's own wait is bounded before the master spoke
  guarded_far.tat[0] = now + 1'500 * ms;
  client_entry guarded_heard = guarded_far;  // ... and not once it did
  guarded_heard.updated_us = now - 10 * ms;
  client_entry with_spare = master_says(300);
  with_spare.spare_us = now + 200 * ms;
  client_entry late_spare = master_says(300);
  late_spare.spare_us = now + 400 * ms;
  const row rows[] = {
      {"nothing known", client_entry{}, no_guard(), true, 0, false, 0},
      {"the master's time has passed", master_says(-5), no_guard(), true, 0, false, 0},
      {"held until the master's time", master_says(300), no_guard(), false, 300, false, 0},
      {"exactly max_delay is held", master_says(5'000), no_guard(), false, 5'000, false, 0},
      {"beyond max_delay is refused", master_says(5'001), no_guard(), false, 5'001, true, 0},
      {"paced behind the held ones", paced, no_guard(), false, 700, false, 0},
      {"stale pacing does not count", stale_paced, no_guard(), false, 100, false, 0},
      {"the guard holds a hot client", guarded, one_rule(500, 1), false, 400, false, 0},
      {"burst 2 admits the second", guarded, one_rule(500, 2), true, 0, false, 0},
      {"the guard alone holds 2 intervals", guarded_far, one_rule(500, 1), false, 1'500, true, 0},
      {"with the master's word, max_delay", guarded_heard, one_rule(500, 1), false, 1'500, false, 0},
      {"an earlier spare is offered", with_spare, no_guard(), false, 300, false, 200},
      {"a later spare is not", late_spare, no_guard(), false, 300, false, 0},
  };
  for (const row& r : rows) {
    const request_plan p = plan_request(r.e, r.guard, max_delay, fresh, now);
    EXPECT_EQ(p.accept, r.accept) << r.name;
    if (r.accept) continue;
    EXPECT_EQ(p.release_us, now + r.release * ms) << r.name;
    EXPECT_EQ(p.too_long, r.too_long) << r.name;
    EXPECT_EQ(p.spare_us, r.spare == 0 ? 0 : now + r.spare * ms) << r.name;
  }
}

TEST(GatePlan, RecordingAHoldChargesAtTheReleaseAndPaces) {
  const guard_policy g = one_rule(500, 1);
  client_entry e = master_says(300, 0, 100);
  const request_plan p = plan_request(e, g, max_delay, fresh, now);
  ASSERT_FALSE(p.accept);
  record_hold(e, g, p);
  EXPECT_EQ(e.tat[0], now + 300 * ms + 500 * ms) << "the guard's use is at the release time";
  EXPECT_EQ(e.local_next_us, now + 300 * ms + 100 * ms) << "the next held one goes one interval later";
  const request_plan next = plan_request(e, g, max_delay, fresh, now);
  EXPECT_EQ(next.release_us, now + 300 * ms + 500 * ms) << "the guard's rule is the slower one: it paces";
  EXPECT_EQ(next.pace_us, 500 * ms);
}

TEST(GatePlan, RecordingAnAcceptChargesTheGuardNow) {
  const guard_policy g = one_rule(500, 2);
  client_entry e;
  e.policy_seq = g.seq;
  record_accept(e, g, now);
  EXPECT_EQ(e.tat[0], now + 500 * ms);
  EXPECT_TRUE(plan_request(e, g, max_delay, fresh, now).accept) << "burst 2: the second passes";
  record_accept(e, g, now);
  const request_plan third = plan_request(e, g, max_delay, fresh, now);
  EXPECT_FALSE(third.accept);
  EXPECT_EQ(third.release_us, now + 500 * ms);
}

TEST(GatePlan, TheGuardChargesUnits) {
  const guard_policy g = one_rule(500, 4);
  client_entry e;
  e.policy_seq = g.seq;
  record_accept(e, g, now, 3);
  EXPECT_EQ(e.tat[0], now + 3 * 500 * ms);
  EXPECT_TRUE(plan_request(e, g, max_delay, fresh, now).accept) << "3 of a burst of 4 used";
  record_accept(e, g, now, 0);
  EXPECT_EQ(e.tat[0], now + 3 * 500 * ms) << "a cost charged later charges nothing now";
  charge(e, g, now, 20);
  EXPECT_EQ(e.tat[0], now + 23 * 500 * ms) << "the whole cost: a Retry-After names its payback";
  EXPECT_EQ(plan_request(e, g, max_delay, fresh, now).release_us, now + 20 * 500 * ms);
  charge(e, g, now, smockron::wire::max_cost);
  EXPECT_LE(e.tat[0], now + 23 * 500 * ms + smockron::wire::max_policy_span_us) << "bounded";
}

TEST(GatePlan, RefreshStartsAfreshUnderNewRulesAndLapsesSpares) {
  client_entry e;
  e.tat[0] = now + 9'000 * ms;
  e.policy_seq = 1;
  e.spare_us = now - 1;
  refresh(e, one_rule(500, 1), now);
  EXPECT_EQ(e.tat[0], 0);
  EXPECT_EQ(e.policy_seq, 2u);
  EXPECT_EQ(e.spare_us, 0) << "a spare not taken by its time lapses";
  e.tat[0] = now + 100;
  refresh(e, no_guard(), now);
  EXPECT_EQ(e.tat[0], now + 100) << "no policy: nothing to reset";
}

TEST(GatePlan, AGivenBackSlotKeepsTheEarliestSpare) {
  client_entry e;
  give_back(e, now + 500 * ms, now);
  EXPECT_EQ(e.spare_us, now + 500 * ms);
  give_back(e, now + 800 * ms, now);
  EXPECT_EQ(e.spare_us, now + 500 * ms) << "the earlier stays";
  give_back(e, now + 300 * ms, now);
  EXPECT_EQ(e.spare_us, now + 300 * ms);
  give_back(e, now + 900 * ms, now + 400 * ms);
  EXPECT_EQ(e.spare_us, now + 900 * ms) << "a lapsed spare is replaced";
  record_spare(e);
  EXPECT_EQ(e.spare_us, 0);
}

TEST(GatePlan, RetryAfterIsWholeSecondsRoundedUpAtLeastOne) {
  EXPECT_EQ(retry_after_s(now + 1, now), 1);
  EXPECT_EQ(retry_after_s(now + 1'000'000, now), 1);
  EXPECT_EQ(retry_after_s(now + 1'000'001, now), 2);
  EXPECT_EQ(retry_after_s(now - 5, now), 1);
}

TEST(GatePlan, TheGuardChargesEveryUnitUpToTheRepresentationBound) {
  // 1/s burst 2: 300 units are paid back at the rate (no cap by time); a
  // cost of 10^12 leaves the next allowed time at the bound POLICY can carry.
  const guard_policy g = one_rule(1'000, 2);
  client_entry e;
  e.policy_seq = g.seq;
  charge(e, g, now, 300);
  EXPECT_EQ(plan_request(e, g, max_delay, fresh, now).release_us, now + 299 * 1'000 * ms);
  for (int i = 0; i < 100; ++i) charge(e, g, now, 1'000'000'000'000);
  const request_plan p = plan_request(e, g, max_delay, fresh, now);
  EXPECT_FALSE(p.accept);
  EXPECT_LE(p.release_us, now + smockron::wire::max_policy_span_us + 2'000 * ms);
  EXPECT_GE(p.release_us, now + smockron::wire::max_policy_span_us);
}

TEST(GatePlan, AHeldRequestsSuccessorWaitsOutItsCost) {
  const guard_policy g = one_rule(10, 1);
  client_entry e;
  e.policy_seq = g.seq;
  request_plan p;
  p.release_us = now + 50 * ms;
  p.pace_us = 10 * ms;
  record_hold(e, g, p, 100, 100);
  EXPECT_EQ(e.local_next_us, now + 50 * ms + 100 * 10 * ms) << "100 units: 100 intervals";
  record_hold(e, g, p, 0, 1'000'000'000'000);
  EXPECT_LE(e.local_next_us, now + 50 * ms + smockron::wire::max_policy_span_us) << "bounded";
}

TEST(GatePlan, AllTheUnitsOfARequestMustFit) {
  // The guard: 1 per 500 ms, burst 10, 4 used.
  const guard_policy g = one_rule(500, 10);
  client_entry e;
  e.policy_seq = g.seq;
  e.tat[0] = now + 4 * 500 * ms;
  EXPECT_TRUE(plan_request(e, g, max_delay, fresh, now, 6).accept) << "6 fit beside 4";
  const request_plan seven = plan_request(e, g, max_delay, fresh, now, 7);
  EXPECT_FALSE(seven.accept) << "7 do not: held until one more unit is paid back";
  EXPECT_EQ(seven.release_us, now + 500 * ms);
  const request_plan eleven = plan_request(e, g, max_delay, fresh, now, 11);
  EXPECT_TRUE(eleven.never) << "more than the burst never fits";
  EXPECT_FALSE(eleven.accept);
  EXPECT_FALSE(plan_request(e, g, max_delay, fresh, now, 10).never);
  // The master's next allowed time is one unit's: 5 units wait 4 of its intervals more.
  EXPECT_EQ(plan_request(master_says(300, 0, 100), no_guard(), max_delay, fresh, now, 5).release_us, now + 700 * ms);
  EXPECT_EQ(plan_request(master_says(300, 0, 100), no_guard(), max_delay, fresh, now, 0).release_us, now + 300 * ms)
      << "a request of no units checks one";
  // Behind this gatekeeper's own queue, its units take as many paces.
  client_entry queued = master_says(100, 0, 100);
  queued.local_next_us = now + 700 * ms;
  EXPECT_EQ(plan_request(queued, no_guard(), max_delay, fresh, now, 5).release_us, now + 1'100 * ms);
}

TEST(GatePlan, ItsOwnQueueIsPacedWhileTheDomainsPolicyIsFresh) {
  // The master last spoke about the client 3 s ago (it has nothing new to
  // say: the client is held here, within its limit), but it is there (the
  // domain's policy is fresh): the held requests stay one chain.
  client_entry e = master_says(100);
  e.local_next_us = now + 700 * ms;
  e.updated_us = now - 3'000 * ms;
  EXPECT_EQ(plan_request(e, one_rule(100, 10), max_delay, fresh, now).release_us, now + 700 * ms);
  EXPECT_EQ(plan_request(e, no_guard(), max_delay, fresh, now).release_us, now + 100 * ms)
      << "no policy: the master is gone, fail open to its own word";
}

// A request's units after the master's time: one rule interval each when
// the guard holds the client's own rules; when it names a tier this
// gatekeeper does not hold (the domain's rules stand in), by the interval
// the master gave.
TEST(GatePlan, UnitsAreTimedByTheMastersIntervalWhenTheRulesAreNotTheClients) {
  guard_policy g = one_rule(10, 1000);               // the domain: 100/s
  const client_entry e = master_says(100, 0, 1000);  // the master, by the tier's 1/s
  EXPECT_EQ(plan_request(e, g, 60'000 * ms, 2'000 * ms, now, 3).release_us, now + 120 * ms);
  g.own = false;
  EXPECT_EQ(plan_request(e, g, 60'000 * ms, 2'000 * ms, now, 3).release_us, now + 2'100 * ms);
}

TEST(GatePlan, ARefundMovesTheArrivalTimeBackNeverBeforeNow) {
  const guard_policy g = one_rule(500, 4);
  client_entry e;
  e.policy_seq = g.seq;
  charge(e, g, now, 10);
  refund(e, g, now, 4);
  EXPECT_EQ(e.tat[0], now + 6 * 500 * ms);
  refund(e, g, now + 1'000 * ms, 100);
  EXPECT_EQ(e.tat[0], now + 1'000 * ms);
  // The master's time moves back too when the rule set it, not when a quota did.
  client_entry m = master_says(3'000, 0, 500);
  m.policy_seq = g.seq;
  refund(m, g, now, 2);
  EXPECT_EQ(m.next_us, now + 2'000 * ms);
  client_entry q = master_says(3'000, 0, 1);
  q.policy_seq = g.seq;
  refund(q, g, now, 2);
  EXPECT_EQ(q.next_us, now + 3'000 * ms);
}

TEST(GatePlan, WhatFitsIsTheBurstLeftUnderEveryRuleAndTheMaster) {
  // The guard: 1 per 500 ms, burst 10, 4 used (one of them half paid back: still owed).
  const guard_policy g = one_rule(500, 10);
  client_entry e;
  e.policy_seq = g.seq;
  e.tat[0] = now + 3'750 * ms;
  EXPECT_EQ(units_that_fit(e, g, now), 10 - 8);
  e.tat[0] = now + 4 * 500 * ms;
  EXPECT_EQ(units_that_fit(e, g, now), 6);
  EXPECT_EQ(units_that_fit(e, g, now + 1'000 * ms), 8) << "two more paid back a second later";
  EXPECT_EQ(units_that_fit(e, g, now + 60'000 * ms), 10) << "never more than the burst";
  // The master: its next allowed time is one unit's, each interval after it one more.
  EXPECT_EQ(units_that_fit(master_says(300, 0, 100), no_guard(), now + 300 * ms), 1);
  EXPECT_EQ(units_that_fit(master_says(300, 0, 100), no_guard(), now + 750 * ms), 5);
  EXPECT_EQ(units_that_fit(master_says(300, 0, 100), no_guard(), now), 0) << "not yet";
  // After a request's own units (an estimate reserved): the master's allowance is what is left.
  EXPECT_EQ(units_that_fit(master_says(300, 0, 100), no_guard(), now + 750 * ms, 2), 3);
  EXPECT_EQ(units_that_fit(master_says(300, 0, 100), no_guard(), now + 750 * ms, 5), 0);
  client_entry both = master_says(0, 0, 500);
  both.tat[0] = now + 9 * 500 * ms;
  EXPECT_EQ(units_that_fit(both, g, now), 1) << "the tighter of the two";
  EXPECT_EQ(units_that_fit(client_entry{}, no_guard(), now), -1) << "nothing known: no bound";
}

TEST(GatePlan, ARefundBringsThisGatekeepersQueueForwardForTheRequestsPlannedAfter) {
  // A queue planned at estimates of 100 units, 10 ms a unit: the next
  // request of 100 would go 100 paces after the last held one.
  const guard_policy g = one_rule(10, 1000);
  client_entry e = master_says(0, 0, 10);
  e.policy_seq = g.seq;
  e.local_next_us = now + 2'000 * ms;
  EXPECT_EQ(plan_request(e, g, 10'000 * ms, fresh, now, 100).release_us, now + (2'000 + 99 * 10) * ms);
  // Two reservations came back 60 units under their estimates each.
  refund(e, g, now, 120);
  EXPECT_EQ(e.local_next_us, now + (2'000 - 1'200) * ms);
  EXPECT_EQ(plan_request(e, g, 10'000 * ms, fresh, now, 100).release_us, now + (800 + 99 * 10) * ms);
  refund(e, g, now, 1'000);
  EXPECT_EQ(e.local_next_us, now) << "never before now";
}

// Under pace share a slot of this gatekeeper's share is no later than the
// master's theoretical arrival time as last told (next allowed + burst - 1
// intervals): after it the client's bucket is whole, and the time between
// would go unused for good when the other gatekeepers do not take theirs.
TEST(GatePlan, UnderPaceShareASlotIsNoLaterThanTheBucketIsWhole) {
  // 10/s burst 5; two gatekeepers share the client (the master's interval
  // 200 ms), its next allowed time 100 ms away: whole at 500 ms.
  const guard_policy g = one_rule(100, 5);
  client_entry e = master_says(100, 0, 200);
  e.local_next_us = now + 700 * ms;  // the other gatekeeper left its slots unused
  request_plan p = plan_request(e, g, max_delay, fresh, now);
  EXPECT_TRUE(p.units_after);
  EXPECT_EQ(p.release_us, now + 500 * ms);
  e.local_next_us = now + 300 * ms;  // within it: the share's slot
  EXPECT_EQ(plan_request(e, g, max_delay, fresh, now).release_us, now + 300 * ms);
  e.local_next_us = now + 700 * ms;
  e.tat[0] = now + 800 * ms;  // the guard later than the master's time (400 ms), earlier than whole
  EXPECT_EQ(plan_request(e, g, max_delay, fresh, now).release_us, now + 500 * ms);
  e.tat[0] = now + 1'100 * ms;  // the guard (this gatekeeper's own uses) still binds
  EXPECT_EQ(plan_request(e, g, max_delay, fresh, now).release_us, now + 700 * ms);
  // The master's word long past (it no longer holds the client): its bucket is whole, go.
  client_entry old = master_says(-1'000, 1'100, 200);
  old.local_next_us = now + 100 * ms;
  EXPECT_TRUE(plan_request(old, g, max_delay, fresh, now).accept);
  // Without pace share (the rule's own interval) the queue's slot stands.
  client_entry plain = master_says(100, 0, 100);
  plain.local_next_us = now + 700 * ms;
  EXPECT_EQ(plan_request(plain, g, max_delay, fresh, now).release_us, now + 700 * ms);
}

TEST(GatePlan, UnderPaceShareARequestsUnitsArePacedAfterIt) {
  // 1000/s burst 500; the master holds the client and ten gatekeepers share
  // it (its interval 10 ms); this gatekeeper's next slot is 200 ms away.
  const guard_policy g = one_rule(1, 500);
  client_entry e = master_says(100, 0, 10);
  e.policy_seq = g.seq;
  e.local_next_us = now + 200 * ms;
  request_plan p = plan_request(e, g, max_delay, fresh, now, 50);
  ASSERT_FALSE(p.accept);
  EXPECT_EQ(p.release_us, now + 200 * ms) << "its slot: the 50 units are not paced before it (490 ms more)";
  record_hold(e, g, p, 50);
  EXPECT_EQ(e.local_next_us, now + 700 * ms) << "the next waits them: 50 shared paces";
  // The master's time still counts them first (one rule interval each).
  client_entry late = e;
  late.next_us = now + 600 * ms;
  EXPECT_EQ(plan_request(late, g, max_delay, fresh, now, 50).release_us, now + 700 * ms);
  late.local_next_us = 0;
  EXPECT_EQ(plan_request(late, g, max_delay, fresh, now, 50).release_us, now + 649 * ms);
  // Without pace share (the master's interval is the rule's): paced before it, as always.
  client_entry plain = master_says(100, 0, 1);
  plain.policy_seq = g.seq;
  plain.local_next_us = now + 200 * ms;
  p = plan_request(plain, g, max_delay, fresh, now, 50);
  EXPECT_FALSE(p.units_after);
  EXPECT_EQ(p.release_us, now + 249 * ms);
  record_hold(plain, g, p, 50);
  EXPECT_EQ(plain.local_next_us, now + 250 * ms);
  // Nor for a rule whose interval the master rounds up to whole milliseconds (7/s: 143 ms).
  guard_policy seven;
  seven.rules[0] = {142'857, 10};
  seven.count = 1;
  seven.seq = 2;
  client_entry r7 = master_says(100, 0, 143);
  r7.policy_seq = seven.seq;
  r7.local_next_us = now + 200 * ms;
  p = plan_request(r7, seven, max_delay, fresh, now, 3);
  EXPECT_FALSE(p.units_after);
  EXPECT_EQ(p.release_us, now + (200 + 2 * 143) * ms);
  // Nor when the guard binds (its own rule's pace): it counts the units itself.
  client_entry bound = master_says(100, 0, 10);
  bound.policy_seq = g.seq;
  bound.tat[0] = now + 2'000 * ms;
  p = plan_request(bound, g, max_delay, fresh, now, 50);
  EXPECT_FALSE(p.units_after);
  EXPECT_EQ(p.pace_us, 1 * ms);
}
