// Rule engine: worked examples of the spec's sliding-log logic and GCRA, with
// time passed in (no clock, no sleeping). Times below are in milliseconds.
#include "master/core/rules.hpp"

#include <gtest/gtest.h>

using namespace smockron::rules;

namespace {
constexpr std::int64_t ms = 1000;  // µs per ms
const std::int64_t t0 = 1'700'000'000'000 * ms;

limits make(algorithm a, std::initializer_list<rule> rs) {
  limits l;
  l.algo = a;
  l.rules = rs;
  return l;
}
rule per_second(std::int64_t n, std::int64_t burst) { return {1'000'000 / n, burst}; }

decision accepted(const limits& l, state& s, std::int64_t at, std::int64_t now) {
  return apply(l, s, {event_kind::accepted, at}, now);
}
decision delayed(const limits& l, state& s, std::int64_t at, std::int64_t now) {
  return apply(l, s, {event_kind::delayed, at}, now);
}

class BothAlgorithms : public ::testing::TestWithParam<algorithm> {};
}  // namespace

TEST_P(BothAlgorithms, BurstExactlyAtTheLimit) {
  const limits l = make(GetParam(), {per_second(10, 3)});
  state s;
  EXPECT_FALSE(accepted(l, s, t0, t0).throttled);
  EXPECT_FALSE(accepted(l, s, t0, t0).throttled);
  const decision d = accepted(l, s, t0, t0);  // the third fills the burst
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.next_us, t0 + 100 * ms);
  EXPECT_EQ(d.interval_us, 100 * ms);
}

TEST_P(BothAlgorithms, SeveralDelayedWithTheSameTimestampEachCount) {
  // Three gatekeepers release held requests at the same DELAY_UNTIL instant.
  const limits l = make(GetParam(), {per_second(10, 1)});
  state s;
  ASSERT_EQ(accepted(l, s, t0, t0).next_us, t0 + 100 * ms);
  EXPECT_EQ(delayed(l, s, t0 + 100 * ms, t0 + 1 * ms).next_us, t0 + 200 * ms);
  EXPECT_EQ(delayed(l, s, t0 + 100 * ms, t0 + 2 * ms).next_us, t0 + 300 * ms);
  EXPECT_EQ(delayed(l, s, t0 + 100 * ms, t0 + 3 * ms).next_us, t0 + 400 * ms);
}

TEST_P(BothAlgorithms, RejectedDoesNotCount) {
  const limits l = make(GetParam(), {per_second(10, 1)});
  state s;
  ASSERT_TRUE(accepted(l, s, t0, t0).throttled);
  const decision d = apply(l, s, {event_kind::rejected, t0}, t0);
  EXPECT_EQ(d.next_us, t0 + 100 * ms);  // unchanged by the rejection
  EXPECT_FALSE(evaluate(l, s, t0 + 100 * ms).throttled);
}

TEST_P(BothAlgorithms, ARefusalNeverMovesTheNextAllowedTime) {
  // 1/2s, burst 1: refused 1.3 s after its use, the client is told 2.0 s;
  // its retries (each a REJECTED) must not push that time on.
  const limits l = make(GetParam(), {rule{2'000 * ms, 1}});
  state s;
  ASSERT_EQ(accepted(l, s, t0, t0).next_us, t0 + 2'000 * ms);
  for (const std::int64_t at : {1'300, 1'700, 1'999}) {
    const decision d = apply(l, s, {event_kind::rejected, t0 + at * ms}, t0 + at * ms);
    ASSERT_TRUE(d.throttled);
    EXPECT_EQ(d.next_us, t0 + 2'000 * ms) << "refused at +" << at << " ms";
  }
  // The retry at the promised time is a use inside the limit.
  EXPECT_FALSE(evaluate(l, s, t0 + 2'000 * ms).throttled);
  EXPECT_EQ(accepted(l, s, t0 + 2'000 * ms, t0 + 2'000 * ms).next_us, t0 + 4'000 * ms);
}

TEST_P(BothAlgorithms, ARefusalAfterTheBurstNamesTheTimeTheUsesSet) {
  // Two rules: the refusal's time is the latest either sets, and stays.
  const limits l = make(GetParam(), {per_second(10, 3), rule{1'000 * ms, 4}});
  state s;
  decision published;
  for (int i = 0; i < 4; ++i) published = accepted(l, s, t0 + i * 100 * ms, t0 + i * 100 * ms);
  ASSERT_TRUE(published.throttled);  // what the gatekeepers were told after the last use
  for (const std::int64_t at : {350, 900}) {
    const decision d = apply(l, s, {event_kind::rejected, t0 + at * ms}, t0 + at * ms);
    ASSERT_TRUE(d.throttled);
    EXPECT_EQ(d.next_us, published.next_us) << "refused at +" << at << " ms";
  }
}

TEST_P(BothAlgorithms, FutureTimestampIsClampedToTheAllowedSkew) {
  limits l = make(GetParam(), {per_second(10, 1)});
  l.max_future_us = 2'000 * ms;
  state s;
  const decision d = accepted(l, s, t0 + 3'600'000 * ms, t0);  // a gatekeeper clock an hour ahead
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.next_us, t0 + 2'000 * ms + 100 * ms);
}

TEST_P(BothAlgorithms, IdleStateExpires) {
  const limits l = make(GetParam(), {per_second(10, 2)});
  state s;
  accepted(l, s, t0, t0);
  accepted(l, s, t0, t0);
  EXPECT_FALSE(expired(l, s, t0 + 100 * ms));
  EXPECT_TRUE(expired(l, s, t0 + 200 * ms));
  // Expired state decides exactly like no state.
  state fresh;
  EXPECT_EQ(accepted(l, s, t0 + 200 * ms, t0 + 200 * ms).throttled,
            accepted(l, fresh, t0 + 200 * ms, t0 + 200 * ms).throttled);
}

TEST_P(BothAlgorithms, NoRulesNeverThrottles) {
  const limits l = make(GetParam(), {});
  state s;
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(accepted(l, s, t0, t0).throttled);
  EXPECT_TRUE(s.times.empty());
}

TEST_P(BothAlgorithms, HistoryIsBoundedByTheLargestBurst) {
  // The largest burst plus the reorder slack (sliding log), one time per rule (GCRA).
  const limits l = make(GetParam(), {per_second(100, 7), per_second(1, 3)});
  state s;
  for (int i = 0; i < 1000; ++i) accepted(l, s, t0 + i * ms, t0 + i * ms);
  EXPECT_LE(s.times.size(), GetParam() == algorithm::gcra ? 2u : 7u + limits::k_reorder_slack);
}

// A hot client at 20x the rate behind one gatekeeper that obeys DELAY_UNTIL:
// over a long run the admitted count is burst + rate x duration.
TEST_P(BothAlgorithms, LongRunAdmittedRateHoldsForAHotClient) {
  const limits l = make(GetParam(), {per_second(10, 5)});
  state s;
  std::int64_t next_allowed = 0;
  int admitted = 0;
  const std::int64_t duration = 10'000 * ms;
  for (std::int64_t t = t0; t < t0 + duration; t += 5 * ms) {  // 200 requests/s
    decision d;
    if (t >= next_allowed) {
      d = accepted(l, s, t, t);
      ++admitted;
    } else if (next_allowed < t0 + duration) {
      d = delayed(l, s, next_allowed, t);
      ++admitted;
    } else {
      continue;
    }
    if (d.throttled) next_allowed = std::max(next_allowed, d.next_us);
  }
  EXPECT_GE(admitted, 5 + 100 - 1);
  EXPECT_LE(admitted, 5 + 100 + 1);
}

INSTANTIATE_TEST_SUITE_P(Rules, BothAlgorithms, ::testing::Values(algorithm::sliding_log, algorithm::gcra),
                         [](const auto& info) { return info.param == algorithm::gcra ? "gcra" : "sliding_log"; });

TEST(SlidingLog, UnderTheBurstNothingIsPublished) {
  const limits l = make(algorithm::sliding_log, {per_second(10, 3)});
  state s;
  EXPECT_FALSE(accepted(l, s, t0, t0).throttled);
  EXPECT_FALSE(accepted(l, s, t0 + 10 * ms, t0 + 10 * ms).throttled);
}

TEST(SlidingLog, WindowIsBurstOverRate) {
  // burst 3 at 10/s: the window is 300 ms; three requests at t0 throttle until it slides.
  const limits l = make(algorithm::sliding_log, {per_second(10, 3)});
  state s;
  for (int i = 0; i < 3; ++i) accepted(l, s, t0, t0);
  const decision inside = evaluate(l, s, t0 + 299 * ms);
  ASSERT_TRUE(inside.throttled);
  EXPECT_EQ(inside.next_us, t0 + 399 * ms);  // start = max(now, last) = now
  EXPECT_FALSE(evaluate(l, s, t0 + 300 * ms).throttled);
}

TEST(SlidingLog, DelayedTimestampEntersTheHistory) {
  const limits l = make(algorithm::sliding_log, {per_second(10, 1)});
  state s;
  ASSERT_EQ(accepted(l, s, t0, t0).next_us, t0 + 100 * ms);
  // Reported before its delayed time: start = max(now, last) = the delayed timestamp.
  const decision d = delayed(l, s, t0 + 100 * ms, t0 + 10 * ms);
  EXPECT_EQ(d.next_us, t0 + 200 * ms);
  ASSERT_EQ(s.times.size(), 2u);
  EXPECT_EQ(s.times.back(), t0 + 100 * ms);
}

TEST(SlidingLog, SlowerRuleDominates) {
  const limits l = make(algorithm::sliding_log, {per_second(10, 5), per_second(1, 2)});
  state s;
  EXPECT_FALSE(accepted(l, s, t0, t0).throttled);
  const decision d = accepted(l, s, t0, t0);  // the 1/s rule's burst of 2 is full
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.next_us, t0 + 1'000 * ms);
  EXPECT_EQ(d.interval_us, 1'000 * ms);
}

TEST(SlidingLog, FasterRuleCanBindFirst) {
  // 10/s burst 2 and 1/min burst 100: the first rule binds after two requests.
  const limits l = make(algorithm::sliding_log, {per_second(10, 2), {60'000 * ms, 100}});
  state s;
  accepted(l, s, t0, t0);
  const decision d = accepted(l, s, t0, t0);
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.next_us, t0 + 100 * ms);
}

TEST(SlidingLog, PastTimestampOutsideEveryWindowIsIgnored) {
  const limits l = make(algorithm::sliding_log, {per_second(10, 1)});
  state s;
  EXPECT_FALSE(accepted(l, s, t0 - 10'000 * ms, t0).throttled);  // a message 10 s late
  EXPECT_TRUE(s.times.empty());
  // Late but inside the window still counts.
  EXPECT_TRUE(accepted(l, s, t0 - 50 * ms, t0).throttled);
}

TEST(SlidingLog, OutOfOrderDelayedTakesItsOwnSlotWhenFree) {
  const limits l = make(algorithm::sliding_log, {per_second(10, 1)});
  state s;
  accepted(l, s, t0, t0);
  delayed(l, s, t0 + 200 * ms, t0);                     // the second paced release is reported first
  const decision d = delayed(l, s, t0 + 100 * ms, t0);  // the slot at 100 ms was free: charged there
  EXPECT_EQ(d.next_us, t0 + 300 * ms);
  EXPECT_EQ(delayed(l, s, t0 + 100 * ms, t0).next_us, t0 + 400 * ms);  // now it is taken: next free slot
}

TEST(SlidingLog, DelayedOlderThanAFullHistoryIsTakenAsUsed) {
  const limits l = make(algorithm::sliding_log, {per_second(10, 1)});
  state s;
  for (int i = 0; i < 5; ++i) delayed(l, s, t0 + (i + 1) * 100 * ms, t0);
  ASSERT_EQ(s.times.size(), l.history_cap());
  // 50 ms is before everything remembered: unknown, so charged after the last use.
  EXPECT_EQ(delayed(l, s, t0 + 50 * ms, t0).next_us, t0 + 700 * ms);
}

TEST(Gcra, BurstIsTolerance) {
  const limits l = make(algorithm::gcra, {per_second(10, 3)});
  state s;
  accepted(l, s, t0, t0);
  accepted(l, s, t0, t0);
  const decision d = accepted(l, s, t0, t0);
  EXPECT_EQ(d.next_us, t0 + 100 * ms);
  // One interval later exactly one more request is allowed.
  EXPECT_FALSE(evaluate(l, s, t0 + 100 * ms).throttled);
  EXPECT_EQ(accepted(l, s, t0 + 100 * ms, t0 + 100 * ms).next_us, t0 + 200 * ms);
}

TEST(Gcra, SlowerRuleDominates) {
  const limits l = make(algorithm::gcra, {per_second(10, 5), per_second(1, 2)});
  state s;
  accepted(l, s, t0, t0);
  const decision d = accepted(l, s, t0, t0);
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.next_us, t0 + 1'000 * ms);
}

TEST(Gcra, PastTimestampsDoNotMoveTheArrivalTimeBack) {
  const limits l = make(algorithm::gcra, {per_second(10, 1)});
  state s;
  accepted(l, s, t0, t0);
  const decision d = accepted(l, s, t0 - 5'000 * ms, t0);  // late message: still one use
  EXPECT_EQ(d.next_us, t0 + 200 * ms);
}

TEST(Rules, ExpiresAtIsTheFirstInstantExpiredHolds) {
  const limits log = make(algorithm::sliding_log, {per_second(10, 2), {1'000'000, 5}});
  state s;
  accepted(log, s, t0, t0);
  accepted(log, s, t0 + 30 * ms, t0 + 30 * ms);
  const std::int64_t at = expires_at_us(log, s);
  EXPECT_EQ(at, t0 + 30 * ms + 5'000 * ms);  // newest use + the longest window
  EXPECT_FALSE(expired(log, s, at - 1));
  EXPECT_TRUE(expired(log, s, at));

  const limits g = make(algorithm::gcra, {per_second(10, 2), per_second(1, 3)});
  state gs;
  accepted(g, gs, t0, t0);
  EXPECT_EQ(expires_at_us(g, gs), t0 + 1'000 * ms);
  EXPECT_FALSE(expired(g, gs, t0 + 999 * ms));
  EXPECT_TRUE(expired(g, gs, expires_at_us(g, gs)));
  EXPECT_EQ(expires_at_us(g, state{}), 0);
}

TEST(Rules, MergeAddsOlderUsesAndKeepsTheNewestHistory) {
  const limits l = make(algorithm::sliding_log, {per_second(10, 1)});  // history cap 1 + slack 4 = 5
  state into{{t0 + 500 * ms, t0 + 600 * ms}};
  merge(l, into, state{{t0 + 50 * ms, t0 + 100 * ms, t0 + 200 * ms, t0 + 500 * ms}});
  // Uses at or after into's first are taken as the same ones; the cap keeps the newest 5.
  EXPECT_EQ(into.times,
            (std::vector<std::int64_t>{t0 + 50 * ms, t0 + 100 * ms, t0 + 200 * ms, t0 + 500 * ms, t0 + 600 * ms}));
  merge(l, into, state{{t0}});
  EXPECT_EQ(into.times.size(), l.history_cap());  // the cap holds
  EXPECT_EQ(into.times.front(), t0 + 50 * ms);

  state empty;
  merge(l, empty, state{{t0, t0 + 1}});
  EXPECT_EQ(empty.times, (std::vector<std::int64_t>{t0, t0 + 1}));

  state same{{t0, t0 + 1}};
  merge(l, same, same);  // idempotent
  EXPECT_EQ(same.times, (std::vector<std::int64_t>{t0, t0 + 1}));

  state keep{{t0}};
  merge(l, keep, state{{t0 + 5, t0 + 1}});  // not ascending: not a log, ignored
  EXPECT_EQ(keep.times, (std::vector<std::int64_t>{t0}));
}

TEST(Rules, MergeGcraTakesTheLaterArrivalPerRule) {
  const limits g = make(algorithm::gcra, {per_second(10, 2), per_second(1, 3)});
  state into{{t0 + 100 * ms, t0 + 900 * ms}};
  merge(g, into, state{{t0 + 300 * ms, t0 + 200 * ms}});
  EXPECT_EQ(into.times, (std::vector<std::int64_t>{t0 + 300 * ms, t0 + 900 * ms}));
  merge(g, into, state{{t0 + 5'000 * ms}});  // wrong rule count: ignored
  EXPECT_EQ(into.times, (std::vector<std::int64_t>{t0 + 300 * ms, t0 + 900 * ms}));
  state fresh;
  merge(g, fresh, into);
  EXPECT_EQ(fresh.times, into.times);
  EXPECT_TRUE(compatible(g, into));
  EXPECT_FALSE(compatible(g, state{{t0}}));
}

TEST(Rules, RestoredHistoryLimitsLikeTheOriginal) {
  // A master that restarts with the history it wrote decides as if it had never stopped.
  const limits l = make(algorithm::sliding_log, {per_second(2, 3)});
  state before;
  for (int i = 0; i < 3; ++i) accepted(l, before, t0 + i * ms, t0 + i * ms);
  state after;
  merge(l, after, before);
  const decision a = accepted(l, before, t0 + 10 * ms, t0 + 10 * ms);
  const decision b = accepted(l, after, t0 + 10 * ms, t0 + 10 * ms);
  EXPECT_TRUE(b.throttled);
  EXPECT_EQ(a.next_us, b.next_us);
}

TEST(Rules, OutOfOrderDelayedAreChargedAtTheirOwnFreeSlots) {
  // One identifier's held requests reserved R1 < R2 < R3, one interval apart,
  // reported as R1, R3, R2 (one accounting socket per proxy worker). Each slot
  // was free; R2 must not be pushed behind R3.
  const limits l = make(algorithm::sliding_log, {per_second(2, 1)});  // interval 500 ms
  state s;
  const std::int64_t base = t0 + 10'000 * ms;  // ahead of now: the history alone decides
  EXPECT_EQ(accepted(l, s, base, t0).next_us, base + 500 * ms);
  EXPECT_EQ(delayed(l, s, base + 500 * ms, t0).next_us, base + 1000 * ms);
  EXPECT_EQ(delayed(l, s, base + 1500 * ms, t0).next_us, base + 2000 * ms);
  EXPECT_EQ(delayed(l, s, base + 1000 * ms, t0).next_us, base + 2000 * ms);
  EXPECT_EQ(s.times, (std::vector<std::int64_t>{base, base + 500 * ms, base + 1000 * ms, base + 1500 * ms}));
  // Same timestamp twice (two gatekeepers released at one DELAY_UNTIL): still the next free slot.
  state d;
  accepted(l, d, base, t0);
  delayed(l, d, base + 500 * ms, t0);
  EXPECT_EQ(delayed(l, d, base + 500 * ms, t0).next_us, base + 1500 * ms);
}

// A gatekeeper far from the master accepts a whole burst over the limit
// before the first DELAY_UNTIL reaches it. Every one of those uses is charged:
// the next allowed time moves out by one interval per use over the burst.
TEST_P(BothAlgorithms, AcceptedOverTheLimitIsPaidBack) {
  const limits l = make(GetParam(), {per_second(10, 3)});
  state s;
  decision d;
  for (int i = 0; i < 10; ++i) d = accepted(l, s, t0 + i * ms, t0 + 100 * ms);  // reported 100 ms later
  ASSERT_TRUE(d.throttled);
  // 3 within the burst, 7 over it: 7 intervals of debt, then one more interval.
  EXPECT_NEAR(static_cast<double>(d.next_us - t0), 800.0 * ms, 2.0 * ms);
  EXPECT_EQ(d.interval_us, 100 * ms);
}

TEST_P(BothAlgorithms, AcceptedOverTheLimitIsPaidBackWithSeveralRules) {
  // 10/s burst 3 and 2/s burst 4: the slower rule's debt dominates.
  const limits l = make(GetParam(), {per_second(10, 3), per_second(2, 4)});
  state s;
  decision d;
  for (int i = 0; i < 10; ++i) d = accepted(l, s, t0 + i * ms, t0 + 100 * ms);
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.interval_us, 500 * ms);
  // 6 uses over the 2/s rule's burst of 4: at least 6 of its intervals of debt.
  EXPECT_GE(d.next_us - t0, 6 * 500 * ms);
  // Nothing is allowed again until that time.
  EXPECT_TRUE(evaluate(l, s, d.next_us - 1).throttled);
  EXPECT_FALSE(evaluate(l, s, d.next_us).throttled);
}

TEST_P(BothAlgorithms, ClientUnderItsLimitIsNeverThrottledWhenReportedLate) {
  // Uses that fit the rule are recorded at their own time, however late they arrive.
  const limits l = make(GetParam(), {per_second(10, 3)});
  state s;
  for (int i = 0; i < 50; ++i) {
    const std::int64_t at = t0 + i * 110 * ms;  // 9/s
    EXPECT_FALSE(accepted(l, s, at, at + 80 * ms).throttled) << "use " << i;
  }
}

namespace {
// Discrete-time model of G gatekeepers that reach the master with a one-way
// delay: the master sees each use `one_way` after it happened, a gatekeeper
// sees each DELAY_UNTIL `one_way` after it was decided. Gatekeepers hold a
// request until the newest DELAY_UNTIL they know (pacing held ones one
// interval apart), reject beyond 2 s, and report DELAYED with the release time.
// A hot client sends every `gap` round robin over the gatekeepers. Returns how
// many requests were admitted (forwarded) within [t0, t0 + duration).
struct distance_run {
  std::int64_t admitted = 0;
};
distance_run run_at_distance(const limits& l, int gatekeepers, std::int64_t one_way, std::int64_t gap,
                             std::int64_t duration) {
  struct use {
    std::int64_t seen_at;
    event e;
  };
  struct control {
    std::int64_t seen_at;
    int gk;
    std::int64_t next;
    std::int64_t interval;
  };
  std::vector<use> to_master;  // ordered by seen_at (constant delay)
  std::vector<control> to_gk;
  std::size_t mi = 0, gi = 0;
  std::vector<std::int64_t> known(gatekeepers, 0), paced(gatekeepers, 0), interval(gatekeepers, 0);
  state s;
  distance_run out;
  int seq = 0;
  for (std::int64_t now = t0; now < t0 + duration; now += ms) {
    while (mi < to_master.size() && to_master[mi].seen_at <= now) {
      const decision d = apply(l, s, to_master[mi].e, now);
      ++mi;
      if (d.throttled && d.next_us > now) {
        for (int g = 0; g < gatekeepers; ++g) to_gk.push_back({now + one_way, g, d.next_us, d.interval_us});
      }
    }
    while (gi < to_gk.size() && to_gk[gi].seen_at <= now) {
      const control& c = to_gk[gi++];
      known[c.gk] = std::max(known[c.gk], c.next);
      interval[c.gk] = c.interval;
    }
    if ((now - t0) % gap != 0) continue;
    const int g = seq++ % gatekeepers;
    const std::int64_t release = std::max(known[g], paced[g]);
    if (release <= now) {
      to_master.push_back({now + one_way, {event_kind::accepted, now}});
      ++out.admitted;
    } else if (release - now <= 2'000 * ms) {
      paced[g] = release + interval[g];
      to_master.push_back({now + one_way, {event_kind::delayed, release}});
      if (release < t0 + duration) ++out.admitted;
    }
  }
  return out;
}
}  // namespace

// The limit holds whatever the distance: at a one-way delay of 2x the
// interval, the spec's formula alone let every request through.
TEST_P(BothAlgorithms, LongRunAdmittedRateHoldsAtADistance) {
  const limits l = make(GetParam(), {per_second(10, 5)});
  const std::int64_t duration = 20'000 * ms;
  const double ideal = 5 + 10 * 20;
  for (int g : {1, 3}) {
    for (std::int64_t one_way : {0 * ms, 25 * ms, 100 * ms, 200 * ms}) {
      const auto r = run_at_distance(l, g, one_way, 5 * ms, duration);  // 200/s: 20x the rate
      EXPECT_GE(r.admitted, 0.98 * ideal) << "G=" << g << " one-way " << one_way / ms << " ms";
      EXPECT_LE(r.admitted, 1.03 * ideal) << "G=" << g << " one-way " << one_way / ms << " ms";
    }
  }
}

TEST_P(BothAlgorithms, LongRunAdmittedRateHoldsAtADistanceWithTwoRules) {
  // 10/s burst 5 and 300/min burst 20: the second binds after about 2 s.
  const limits l = make(GetParam(), {per_second(10, 5), {200 * ms, 20}});
  const std::int64_t duration = 20'000 * ms;
  const double ideal = 20 + 5 * 20;
  for (int g : {1, 3}) {
    for (std::int64_t one_way : {0 * ms, 50 * ms, 200 * ms}) {
      const auto r = run_at_distance(l, g, one_way, 5 * ms, duration);
      EXPECT_LE(r.admitted, 1.03 * ideal) << "G=" << g << " one-way " << one_way / ms << " ms";
      EXPECT_GE(r.admitted, 0.9 * ideal) << "G=" << g << " one-way " << one_way / ms << " ms";
    }
  }
}

TEST(SlidingLog, LateUseOfAClientUnderItsLimitKeepsItsOwnTime) {
  // 10/s burst 2 (history of 6). One use went through a far gatekeeper and
  // arrives after five later ones: it fits where it happened, so it is not
  // charged ahead (here it is older than the window and changes nothing).
  const limits l = make(algorithm::sliding_log, {per_second(10, 2)});
  state s;
  accepted(l, s, t0 - 100 * ms, t0 - 100 * ms);
  for (int i = 1; i <= 5; ++i) accepted(l, s, t0 + i * 100 * ms, t0 + i * 100 * ms);
  ASSERT_EQ(s.times.size(), l.history_cap());
  accepted(l, s, t0, t0 + 500 * ms);
  EXPECT_EQ(s.times.back(), t0 + 500 * ms);               // not charged at t0 + 600 ms
  EXPECT_FALSE(evaluate(l, s, t0 + 600 * ms).throttled);  // its next use on time is not held
}

TEST_P(BothAlgorithms, EveryUseIsPaidBack) {
  // A gatekeeper that keeps accepting (failing open, an older version): every
  // use it reports is charged, and paid back at the rate (no cap by time).
  const limits l = make(GetParam(), {{60'000 * ms, 1}});  // 1/min
  state s;
  decision d;
  for (int i = 0; i < 1000; ++i) d = accepted(l, s, t0, t0);
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.next_us, t0 + 1000 * 60'000 * ms);
}

// The decision says which limit set the next allowed time: the rule that
// holds the client longest, by its place in the limits.
TEST_P(BothAlgorithms, TheRuleThatSetsTheTimeIsNamed) {
  const limits l = make(GetParam(), {per_second(100, 10), per_second(1, 2)});
  state s;
  EXPECT_FALSE(accepted(l, s, t0, t0).throttled);
  const decision d = accepted(l, s, t0, t0);  // the second rule's burst is full
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.by, limit_kind::rule);
  EXPECT_EQ(d.index, 1);
  EXPECT_EQ(d.interval_us, 1'000 * ms);
  const limits one = make(GetParam(), {per_second(1, 1)});
  state s1;
  const decision d1 = accepted(one, s1, t0, t0);
  EXPECT_EQ(d1.by, limit_kind::rule);
  EXPECT_EQ(d1.index, 0);
  EXPECT_EQ(decision{}.by, limit_kind::none);
}
