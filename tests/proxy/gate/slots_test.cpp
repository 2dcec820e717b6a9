// One worker's concurrency slots (proxy/gate/slots.hpp), with no sockets: the
// LEASEs it sends are captured, GRANTs are fed in, time is a manual clock.
#include "proxy/gate/slots.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace smockron;
using namespace smockron::proxy;

namespace {

class Slots : public ::testing::Test {
protected:
  Slots()
      : table_(
            7,
            [this](const wire::lease& m) {
              sent_.push_back({m.want, m.held, m.returned});
            },
            clock_) {}

  struct lease {
    std::int64_t want, held, returned;
    bool operator==(const lease&) const = default;
  };
  void grant(std::int64_t held, std::int64_t cap, std::int64_t seen) {
    table_.on_grant(wire::grant{"llm", "k", 7, held, cap, seen}, clock_.wall_us());
  }
  slot_table::entry* take(slot_table::waiter& w, bool online = true) {
    return table_.acquire("llm", "k", online, w, clock_.wall_us());
  }
  lease last() const { return sent_.empty() ? lease{-1, -1, -1} : sent_.back(); }

  manual_clock clock_;
  std::vector<lease> sent_;
  slot_table table_;
};

}  // namespace

TEST_F(Slots, TheFirstRequestWaitsForAGrantTheNextGoWithinTheLease) {
  slot_table::waiter a;
  int woken = 0;
  a.wake = [&] { ++woken; };
  EXPECT_EQ(take(a), nullptr);
  EXPECT_EQ(last(), (lease{1, 0, 0}));
  EXPECT_EQ(table_.waiting(), 1);
  grant(2, 2, 0);
  EXPECT_EQ(woken, 1);
  ASSERT_NE(a.granted, nullptr);
  EXPECT_EQ(table_.in_use(), 1);
  slot_table::waiter b;
  slot_table::entry* e = take(b);
  ASSERT_NE(e, nullptr);  // a free slot of the lease: no round trip
  EXPECT_EQ(table_.in_use(), 2);
  slot_table::waiter c;
  c.wake = [] {};
  EXPECT_EQ(take(c), nullptr);  // the lease is used up: waits, and asks for one more
  EXPECT_EQ(last(), (lease{3, 2, 0}));
  table_.release(*e, clock_.wall_us());  // b ends: c goes
  EXPECT_NE(c.granted, nullptr);
  EXPECT_EQ(table_.in_use(), 2);
  EXPECT_EQ(table_.waiting(), 0);
}

TEST_F(Slots, IdleSlotsAreKeptForTheLingerThenGivenBack) {
  slot_table::waiter a;
  a.wake = [] {};
  take(a);
  grant(1, 1, 0);
  table_.release(*a.granted, clock_.wall_us());
  EXPECT_EQ(last(), (lease{0, 1, 0}));  // idle now: the master may ask for it back
  const std::size_t before = sent_.size();
  clock_.advance(std::chrono::microseconds(slot_table::k_linger_us / 2));
  table_.tick(clock_.wall_us());
  EXPECT_EQ(sent_.size(), before);  // kept: the next request needs no round trip
  EXPECT_EQ(table_.held(), 1);
  clock_.advance(std::chrono::microseconds(slot_table::k_linger_us));
  table_.tick(clock_.wall_us());
  EXPECT_EQ(last(), (lease{0, 0, 1}));
  EXPECT_EQ(table_.held(), 0);
}

TEST_F(Slots, AGrantBelowWhatIsHeldGivesBackWhatIsNotInFlight) {
  std::vector<slot_table::waiter> w(3);
  for (auto& x : w) {
    x.wake = [] {};
    take(x);
  }
  grant(4, 4, 0);  // three in flight, one spare
  EXPECT_EQ(table_.in_use(), 3);
  grant(4, 1, 0);  // the master asks down to one: the spare goes at once
  EXPECT_EQ(last(), (lease{3, 3, 1}));
  table_.release(*w[0].granted, clock_.wall_us());  // then each that ends
  EXPECT_EQ(last(), (lease{2, 2, 2}));
  // A GRANT still counting a give-back on its way subtracts it.
  grant(3, 3, 1);  // the master had seen one of the two
  EXPECT_EQ(table_.held(), 2);
}

TEST_F(Slots, WithoutAMasterRequestsGoAndAreClaimedWhenItIsBack) {
  slot_table::waiter a, b;
  a.wake = [] {};
  b.wake = [] {};
  EXPECT_EQ(take(a), nullptr);  // online: waits for a grant
  table_.links_changed([](std::string_view) { return false; }, clock_.wall_us());
  EXPECT_NE(a.granted, nullptr);  // the master is gone: it goes (fail-open)
  EXPECT_NE(take(b, false), nullptr);
  EXPECT_EQ(table_.in_use(), 2);
  sent_.clear();
  table_.links_changed([](std::string_view) { return true; }, clock_.wall_us());
  EXPECT_EQ(last(), (lease{2, 2, 0}));  // both still in flight: claimed
  EXPECT_EQ(table_.held(), 2);
}

TEST_F(Slots, AWaiterThatLeavesIsForgottenAndTheMasterTold) {
  slot_table::waiter a;
  a.wake = [] { FAIL() << "a request that left is never woken"; };
  take(a);
  table_.cancel(a, clock_.wall_us());
  EXPECT_EQ(last(), (lease{0, 0, 0}));
  EXPECT_EQ(table_.waiting(), 0);
  grant(1, 1, 0);  // a grant on its way: the slot lingers, then goes back
  clock_.advance(std::chrono::microseconds(slot_table::k_linger_us * 2));
  table_.tick(clock_.wall_us());
  table_.tick(clock_.wall_us());
  EXPECT_EQ(table_.held(), 0);
  // Quiet long enough: forgotten.
  clock_.advance(std::chrono::microseconds(slot_table::k_forget_us + 1));
  table_.tick(clock_.wall_us());
  table_.tick(clock_.wall_us());
  EXPECT_EQ(table_.entries(), 0u);
}

TEST_F(Slots, AWaitingRequestIsAskedForAgain) {
  slot_table::waiter a;
  a.wake = [] {};
  take(a);
  const std::size_t before = sent_.size();
  clock_.advance(std::chrono::microseconds(slot_table::k_ask_again_us));
  table_.tick(clock_.wall_us());
  EXPECT_EQ(sent_.size(), before + 1);  // a LEASE lost on the way is not waited for forever
}

TEST(ConcurrencyPolicies, FreshLimitsOverridesAndNone) {
  concurrency_policies p;
  EXPECT_FALSE(p.any());
  const std::int64_t t = 1'000'000'000;
  p.set("llm", "", 4, t);
  p.set("llm", "batch", 16, t);
  p.set("llm", "vip", 0, t);
  EXPECT_TRUE(p.any());
  EXPECT_EQ(p.limit("llm", "k", t), 4);
  EXPECT_EQ(p.limit("llm", "batch", t), 16);
  EXPECT_EQ(p.limit("llm", "vip", t), 0);
  EXPECT_EQ(p.limit("other", "k", t), 0);
  // Not refreshed: dropped (a silent master means no limit).
  EXPECT_EQ(p.limit("llm", "k", t + wire::policy_fresh_ms * 1000 + 1), 0);
}

TEST(ConcurrencyPolicies, ATiersLimitAfterAnOverrideBeforeTheDomains) {
  concurrency_policies p;
  const std::int64_t t = 1'000'000'000;
  p.set("llm", "", 1, t);
  p.set("llm", "batch", 16, t);
  p.set_tier("llm", "pro", 4, t);
  p.set_tier("llm", "free", 0, t);
  EXPECT_EQ(p.limit("llm", "k", t, "pro"), 4);
  EXPECT_EQ(p.limit("llm", "k", t, "free"), 0);  // the tier has no concurrency rule
  EXPECT_EQ(p.limit("llm", "k", t, "gold"), 1);  // unknown: the domain's
  EXPECT_EQ(p.limit("llm", "k", t), 1);
  EXPECT_EQ(p.limit("llm", "batch", t, "pro"), 16);
  EXPECT_EQ(p.limit("llm", "k", t + wire::policy_fresh_ms * 1000 + 1, "pro"), 0);
}

// The LEASE names the tier of the request that asked, so the master leases
// under that tier's limit.
TEST(SlotsTier, LeasesNameTheTier) {
  manual_clock clock;
  std::vector<std::string> tiers;
  slot_table table(
      7, [&](const wire::lease& m) { tiers.emplace_back(m.tier); }, clock);
  slot_table::waiter w;
  w.wake = [] {};
  EXPECT_EQ(table.acquire("llm", "k", true, w, clock.wall_us(), "pro"), nullptr);
  ASSERT_EQ(tiers.size(), 1u);
  EXPECT_EQ(tiers.back(), "pro");
  table.cancel(w, clock.wall_us());
  slot_table::waiter v;
  v.wake = [] {};
  EXPECT_EQ(table.acquire("llm", "k", true, v, clock.wall_us()), nullptr);
  EXPECT_EQ(tiers.back(), "");
  table.cancel(v, clock.wall_us());
}
