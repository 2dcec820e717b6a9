// The master's in-memory store: LRU cap, bounded sweeps, reconfiguration.
#include "master/engine/limiter.hpp"

#include <gtest/gtest.h>

using namespace smockron;
using namespace smockron::master;

namespace {
constexpr std::int64_t ms = 1000;
const std::int64_t t0 = 1'700'000'000'000 * ms;

rules::limits ten_per_second(std::int64_t burst = 1) {
  rules::limits l;
  l.rules = {{100 * ms, burst}};
  l.max_future_us = 0;
  return l;
}
rules::event at(std::int64_t t) { return {rules::event_kind::accepted, t}; }
}  // namespace

TEST(Limiter, KeepsStatePerDomainAndIdentifier) {
  limiter l({ten_per_second(), ten_per_second()}, 100);
  EXPECT_TRUE(l.apply(0, "a", at(t0), t0).throttled);
  EXPECT_TRUE(l.apply(1, "a", at(t0), t0).throttled);  // same identifier, other domain: own state
  EXPECT_EQ(l.tracked(), 2u);
  EXPECT_EQ(l.tracked(0), 1u);
  // A second use 10 ms later is over the limit: charged at the next free slot (t0 + 100 ms).
  EXPECT_EQ(l.apply(0, "a", at(t0 + 10 * ms), t0 + 10 * ms).next_us, t0 + 200 * ms);
}

TEST(Limiter, EvictsLeastRecentlyUsedAtTheCap) {
  limiter l({ten_per_second(5)}, 3);
  l.apply(0, "id0", at(t0), t0);
  l.apply(0, "id1", at(t0), t0);
  l.apply(0, "id2", at(t0), t0);
  l.apply(0, "id0", at(t0 + 1), t0 + 1);  // id0 is now the most recently used
  l.apply(0, "id3", at(t0 + 2), t0 + 2);  // evicts id1
  EXPECT_EQ(l.tracked(), 3u);
  EXPECT_EQ(l.evictions(), 1u);
  EXPECT_TRUE(l.find(0, "id0"));
  EXPECT_FALSE(l.find(0, "id1"));
  EXPECT_TRUE(l.find(0, "id3"));
  for (int i = 0; i < 1000; ++i) l.apply(0, "flood" + std::to_string(i), at(t0), t0);
  EXPECT_EQ(l.tracked(), 3u);
  EXPECT_EQ(l.evictions(), 1001u);
}

TEST(Limiter, RejectedForUnknownIdentifierCreatesNoState) {
  limiter l({ten_per_second()}, 10);
  EXPECT_FALSE(l.apply(0, "x", {rules::event_kind::rejected, t0}, t0).throttled);
  EXPECT_EQ(l.tracked(), 0u);
}

TEST(Limiter, SweepRemovesOnlyExpiredStateWithinBudget) {
  limiter l({ten_per_second()}, 100);
  for (int i = 0; i < 10; ++i) l.apply(0, "old" + std::to_string(i), at(t0), t0);
  l.apply(0, "fresh", at(t0 + 1000 * ms), t0 + 1000 * ms);
  const std::int64_t late = limiter::k_late_us;
  EXPECT_EQ(l.sweep(t0 + 100 * ms + late - 1, 100), 0u) << "kept for uses reported late";
  EXPECT_EQ(l.sweep(t0 + 1000 * ms + late, 4), 4u);    // bounded
  EXPECT_EQ(l.sweep(t0 + 1000 * ms + late, 100), 6u);  // resumes, reaches the rest
  EXPECT_EQ(l.tracked(), 1u);
  EXPECT_TRUE(l.find(0, "fresh"));
  EXPECT_EQ(l.expirations(), 10u);
  EXPECT_EQ(l.sweep(t0 + 1050 * ms + late, 100), 0u);  // still inside its window
  EXPECT_EQ(l.sweep(t0 + 1100 * ms + late, 100), 1u);
}

// A use reported late (the accounting's way, a gatekeeper's clock behind)
// after the state stopped mattering at now is charged on top of the uses
// before it: GCRA 1000/s burst 500, 68 units at t0, swept 100 ms later
// (its arrival time, t0 + 68 ms, is behind), then 74 units used at t0 + 10 ms.
TEST(Limiter, AUseReportedLateIsChargedOnTopOfTheUsesBeforeIt) {
  rules::limits units;
  units.algo = rules::algorithm::gcra;
  units.rules = {{1 * ms, 500}};
  units.max_future_us = 0;
  limiter l({units}, 100);
  l.apply(0, "k", {rules::event_kind::accepted, t0, 68}, t0);
  EXPECT_EQ(l.sweep(t0 + 100 * ms, 100), 0u);
  l.apply(0, "k", {rules::event_kind::accepted, t0 + 10 * ms, 74}, t0 + 100 * ms);
  EXPECT_EQ(l.fits_at(0, "k", 500, t0 + 100 * ms), t0 + 142 * ms) << "68 then 74 units from t0, not 74 from t0 + 10 ms";
  // A state read back from the store is taken as long: expired, but not k_late_us ago.
  EXPECT_TRUE(l.restore(0, "read-back", rules::state{{t0 - 1'000 * ms}}, t0));
  EXPECT_FALSE(l.restore(0, "too-old", rules::state{{t0 - limiter::k_late_us}}, t0));
}

TEST(Limiter, SweepReachesExpiredEntriesBehindLongLivedOnes) {
  rules::limits hourly;
  hourly.rules = {{3'600'000 * ms, 1}};
  limiter l({hourly, ten_per_second()}, 100);
  l.apply(0, "long", at(t0), t0);  // least recently used, relevant for an hour
  for (int i = 0; i < 5; ++i) l.apply(1, "short" + std::to_string(i), at(t0), t0);
  std::size_t removed = 0;
  for (int tick = 0; tick < 6; ++tick) removed += l.sweep(t0 + 1000 * ms + limiter::k_late_us, 2);
  EXPECT_EQ(removed, 5u);
  EXPECT_TRUE(l.find(0, "long"));
}

TEST(Limiter, ReconfigureKeepsCompatibleStateAndDropsRemovedDomains) {
  limiter l({ten_per_second(), ten_per_second(), ten_per_second()}, 100);
  l.apply(0, "a", at(t0), t0);
  l.apply(1, "b", at(t0), t0);
  l.apply(2, "c", at(t0), t0);
  rules::limits gcra = ten_per_second();
  gcra.algo = rules::algorithm::gcra;
  // New order: old domain 2 first (same rules), old domain 0 with a new algorithm; old 1 removed.
  l.reconfigure({ten_per_second(), gcra}, {2, 0});
  EXPECT_EQ(l.tracked(), 2u);
  ASSERT_TRUE(l.find(0, "c"));
  EXPECT_EQ(l.find(0, "c")->times.size(), 1u);
  ASSERT_TRUE(l.find(1, "a"));
  EXPECT_TRUE(l.find(1, "a")->times.empty());  // incompatible state cleared
  EXPECT_TRUE(l.apply(0, "c", at(t0 + 10 * ms), t0 + 10 * ms).throttled);
  // The LRU list stays consistent: a flood evicts normally.
  for (int i = 0; i < 200; ++i) l.apply(1, "n" + std::to_string(i), at(t0), t0);
  EXPECT_EQ(l.tracked(), 100u);
}

TEST(Limiter, ReconfigureKeepsQuotasOfTheSameLayoutAndDropsOthers) {
  rules::limits with_quota = ten_per_second(5);
  with_quota.quotas = {{100, rules::period::day}};
  limiter l({with_quota}, 100);
  for (int i = 0; i < 3; ++i) l.apply(0, "a", at(t0), t0);
  ASSERT_EQ(rules::quota_used(l.limits(0).base, *l.find(0, "a"), 0, t0), 3);
  // A larger limit, the same layout: the count stays.
  rules::limits larger = with_quota;
  larger.quotas[0].limit = 1'000;
  l.reconfigure({larger}, {0});
  EXPECT_EQ(rules::quota_used(l.limits(0).base, *l.find(0, "a"), 0, t0), 3);
  // The quota's window changes (a day becomes a month): its count belongs to another window.
  rules::limits monthly = larger;
  monthly.quotas[0].per = rules::period::month;
  EXPECT_FALSE(rules::same_aux_layout(larger, monthly));
  // The rate rule's burst crosses k_exact_burst (it becomes a counter): the numbers mean something else.
  rules::limits counted = larger;
  counted.rules[0].burst = rules::k_exact_burst + 1;
  l.reconfigure({counted}, {0});
  EXPECT_TRUE(l.find(0, "a")->aux.empty());
  EXPECT_FALSE(l.apply(0, "a", at(t0), t0).throttled);
  EXPECT_EQ(l.find(0, "a")->aux.size(), counted.aux_size());
}

TEST(Limiter, OverrideGivesOneIdentifierItsOwnLimitsAndReconfigureFollowsIt) {
  domain_limits d = ten_per_second(1);
  d.overrides.emplace("vip", ten_per_second(3));
  limiter l({d}, 100);
  EXPECT_TRUE(l.apply(0, "plain", at(t0), t0).throttled);
  EXPECT_FALSE(l.apply(0, "vip", at(t0), t0).throttled);
  EXPECT_FALSE(l.apply(0, "vip", at(t0), t0).throttled);
  EXPECT_TRUE(l.apply(0, "vip", at(t0), t0).throttled) << "its own burst of 3";
  EXPECT_EQ(l.limits_of(0, "vip").max_burst(), 3u);
  EXPECT_EQ(l.limits_of(0, "plain").max_burst(), 1u);
  // The override removed: same shape (sliding log, one rule), state kept, the domain's rules apply.
  l.reconfigure({ten_per_second(1)}, {0});
  ASSERT_TRUE(l.find(0, "vip"));
  EXPECT_EQ(l.find(0, "vip")->times.size(), 3u);
  // Burst 1 now: the use at +10 ms is charged at the next free slot (+100 ms), the next allowed at +200 ms.
  EXPECT_EQ(l.apply(0, "vip", at(t0 + 10 * ms), t0 + 10 * ms).next_us, t0 + 200 * ms);
  // An override of another shape (two rules) starts that identifier afresh, and only it.
  domain_limits two = ten_per_second(1);
  rules::limits both = ten_per_second(2);
  both.rules.push_back({1'000 * ms, 5});
  two.overrides.emplace("vip", both);
  l.reconfigure({two}, {0});
  EXPECT_TRUE(l.find(0, "vip")->times.empty());
  EXPECT_EQ(l.find(0, "plain")->times.size(), 1u);
  EXPECT_FALSE(l.apply(0, "vip", at(t0 + 20 * ms), t0 + 20 * ms).throttled);
  // Expiry follows the identifier's own limits: 1/s burst 5 keeps vip 5 s.
  EXPECT_EQ(l.sweep(t0 + 2'000 * ms + limiter::k_late_us, 100), 1u) << "plain expired, vip not";
  EXPECT_TRUE(l.find(0, "vip"));
}

namespace {
std::vector<std::string> drain_all(limiter& l) {
  std::vector<std::string> out;
  l.drain_dirty(1000, [&](std::size_t d, std::string_view id, const rules::state&, const rules::limits&) {
    out.push_back(std::to_string(d) + ":" + std::string(id));
  });
  return out;
}
}  // namespace

TEST(Limiter, DirtyTrackingWritesEachChangedStateOnceOldestFirst) {
  limiter l({ten_per_second(5), ten_per_second(5)}, 100);
  l.apply(0, "a", at(t0), t0);
  EXPECT_EQ(l.dirty(), 0u);  // off by default: the memory store pays nothing
  l.track_dirty();
  l.apply(0, "a", at(t0), t0);
  l.apply(1, "b", at(t0), t0);
  l.apply(0, "a", at(t0 + 1), t0 + 1);                     // already dirty: still once
  l.apply(0, "c", {rules::event_kind::rejected, t0}, t0);  // records nothing
  EXPECT_EQ(l.dirty(), 2u);
  EXPECT_EQ(drain_all(l), (std::vector<std::string>{"0:a", "1:b"}));
  EXPECT_EQ(l.dirty(), 0u);
  l.apply(1, "b", at(t0 + 2), t0 + 2);
  EXPECT_EQ(drain_all(l), (std::vector<std::string>{"1:b"}));
  l.mark_all_dirty();
  EXPECT_EQ(l.dirty(), 2u);
  std::size_t seen = 0;
  EXPECT_EQ(l.drain_dirty(1, [&](auto, auto, const auto&, const auto&) { ++seen; }), 1u);  // bounded batch
  EXPECT_EQ(seen, 1u);
  EXPECT_EQ(l.dirty(), 1u);
}

TEST(Limiter, ErasedStateLeavesTheDirtyList) {
  limiter l({ten_per_second(1)}, 2);
  l.track_dirty();
  l.apply(0, "a", at(t0), t0);
  l.apply(0, "b", at(t0), t0);
  l.apply(0, "c", at(t0), t0);  // evicts a
  EXPECT_EQ(l.dirty(), 2u);
  EXPECT_EQ(drain_all(l), (std::vector<std::string>{"0:b", "0:c"}));
  l.apply(0, "b", at(t0 + 1), t0 + 1);
  EXPECT_EQ(l.sweep(t0 + 10'000 * ms, 10), 2u);  // both expired and erased
  EXPECT_EQ(l.dirty(), 0u);
  EXPECT_TRUE(drain_all(l).empty());
  l.apply(0, "d", at(t0 + 10'000 * ms), t0 + 10'000 * ms);
  l.reconfigure({}, {});  // domain dropped with its dirty state
  EXPECT_EQ(l.dirty(), 0u);
}

TEST(Limiter, RestoreFoldsStoredStateWithoutEvictingLiveState) {
  limiter l({ten_per_second(3)}, 2);
  l.track_dirty();
  rules::state stored{{t0 - 20 * ms, t0 - 10 * ms}};
  EXPECT_TRUE(l.restore(0, "a", stored, t0));
  EXPECT_EQ(l.dirty(), 0u);  // came from the store: nothing to write back
  // Two stored uses + one new one fill the burst of 3.
  EXPECT_TRUE(l.apply(0, "a", at(t0), t0).throttled);
  EXPECT_FALSE(l.restore(0, "old", rules::state{{t0 - 20'000 * ms}}, t0));  // expired
  EXPECT_FALSE(l.restore(0, "bad", rules::state{{t0, t0 - 1}}, t0));        // not a log
  EXPECT_TRUE(l.restore(0, "b", stored, t0));
  EXPECT_FALSE(l.restore(0, "c", stored, t0));  // at the cap: dropped, live state kept
  EXPECT_EQ(l.evictions(), 0u);
  EXPECT_EQ(l.tracked(), 2u);
  drain_all(l);
  EXPECT_TRUE(l.restore(0, "b", rules::state{{t0 - 30 * ms}}, t0));  // merged into live state
  EXPECT_EQ(l.find(0, "b")->times.size(), 3u);
  EXPECT_EQ(l.dirty(), 1u);
}

// A state read back with the tier its uses named is judged by that tier's
// limits: kept while the tier's longer window still holds it, and limited as
// that tier limits, not as the domain would.
TEST(Limiter, RestoreJudgesAStateByItsTier) {
  domain_limits d{ten_per_second(3)};  // window 300 ms
  rules::limits pro;
  pro.rules = {{1'000 * ms, 3}};  // 1/s burst 3: window 3 s
  d.tiers = {{"pro", pro}};
  limiter l({d}, 10);
  const rules::state stored{{t0 - 2'600 * ms, t0 - 2'500 * ms, t0 - 2'400 * ms}};
  EXPECT_FALSE(l.restore(0, "base", stored, t0)) << "the domain's 300 ms window (and 2 s) are over";
  ASSERT_TRUE(l.restore(0, "tiered", stored, t0, "pro"));
  EXPECT_EQ(&l.current_limits(0, "tiered"), &l.limits(0).tiers[0].second);
  EXPECT_TRUE(l.apply(0, "tiered", at(t0), t0, "pro").throttled) << "the tier's burst of 3 is used within 3 s";
}

TEST(Limiter, CompilesADomainAndItsOverridesWithTheDomainsAlgorithm) {
  auto r = smockron::config::load_string(R"(
[master.domains.api]
algorithm = "gcra"
rules = [ { rate = "10/s", burst = 20 } ]
overrides = [ { identifier = "vip", rules = [ { rate = "100/s", burst = 200 }, { rate = "1000/h" } ] } ]
)",
                                         "test.toml");
  ASSERT_TRUE(r.cfg);
  const auto& d = *r.cfg->master->find_domain("api");
  const auto base = smockron::master::compile(d, std::chrono::seconds(60));
  EXPECT_EQ(base.algo, smockron::rules::algorithm::gcra);
  EXPECT_EQ(base.max_future_us, 60'000'000);
  ASSERT_EQ(base.rules.size(), 1u);
  EXPECT_EQ(base.rules[0].interval_us, 100'000);
  const auto vip = smockron::master::compile(d, d.overrides[0], std::chrono::seconds(60));
  EXPECT_EQ(vip.algo, smockron::rules::algorithm::gcra);  // the domain's algorithm
  ASSERT_EQ(vip.rules.size(), 2u);
  EXPECT_EQ(vip.rules[0].interval_us, 10'000);
  EXPECT_EQ(vip.rules[1].burst, 1);
}

TEST(Limiter, ResetForgetsOneIdentifiersUses) {
  limiter l({ten_per_second()}, 100);
  l.track_dirty();
  EXPECT_TRUE(l.apply(0, "a", at(t0), t0).throttled);
  EXPECT_TRUE(l.apply(0, "b", at(t0), t0).throttled);
  l.reset(0, "a");
  l.reset(0, "nobody");  // nothing to forget
  EXPECT_TRUE(l.find(0, "a")->empty());
  EXPECT_FALSE(l.find(0, "b")->empty());
  EXPECT_EQ(l.apply(0, "a", at(t0), t0).next_us, t0 + 100 * ms) << "a fresh start: one use";
}
