// Shared rates split max-min (master/engine/shares.hpp), on simulated time:
// clients that obey the master's answers, as gatekeepers holding them do.
#include "master/engine/shares.hpp"

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <string>

using smockron::master::shares;

namespace {

constexpr std::int64_t ms = 1000;
constexpr std::int64_t s = 1'000'000;
constexpr std::int64_t t0 = 1'700'000'000LL * s;

// 100 units/s shared, a burst of one second's, demand over 10 s.
shares one_pool() {
  shares book(1000);
  book.configure({shares::pool_config{10 * ms, 100, 10 * s}}, {std::nullopt});
  return book;
}

double jain(double a, double b) { return (a + b) * (a + b) / (2 * (a * a + b * b)); }

// Clients each wanting `per_s` units a second (in units of one, evenly), each
// going only when its last answer allows: the units each got from `from_us` to `to_us`.
std::map<std::string, double> run(shares& book, const std::map<std::string, double>& per_s, std::int64_t from_us,
                                  std::int64_t to_us, std::int64_t start_us = t0) {
  std::map<std::string, double> got;
  std::map<std::string, std::int64_t> next_allowed, next_wish;
  for (const auto& [id, r] : per_s) next_wish[id] = start_us;
  std::int64_t rebalanced = start_us;
  for (std::int64_t now = start_us; now < to_us; now += ms) {
    if (now - rebalanced >= s) {
      book.rebalance(now);
      rebalanced = now;
    }
    for (const auto& [id, r] : per_s) {
      const auto gap = static_cast<std::int64_t>(1e6 / r);
      while (next_wish[id] <= now && next_allowed[id] <= now) {
        const auto d = book.use(0, id, 1, now, now, next_wish[id] < now);  // held: it wished earlier
        if (d.throttled) next_allowed[id] = d.next_us;
        next_wish[id] += gap;
        if (now >= from_us) got[id] += 1;
      }
      // A client held past its wishes does not pile them up (it is paced, not queued).
      if (next_wish[id] < now - s) next_wish[id] = now - s;
    }
  }
  return got;
}

}  // namespace

// Two heavy tenants (5x an equal share each) and a light one (0.1x): the
// light one gets all it wants, the heavy ones split the rest evenly, and the
// total stays at the rate.
TEST(Shares, TwoHeavyAndOneLightTenant) {
  shares book = one_pool();
  const double equal = 100.0 / 3;
  const auto got = run(book, {{"a", 5 * equal}, {"b", 5 * equal}, {"light", 0.1 * equal}}, t0 + 10 * s, t0 + 30 * s);
  const double window = 20;
  const double a = got.at("a") / window, b = got.at("b") / window, light = got.at("light") / window;
  EXPECT_NEAR(light, 0.1 * equal, 0.2) << "the light one gets what it wants";
  EXPECT_GE(jain(a, b), 0.99) << a << " " << b;
  const double total = a + b + light;
  EXPECT_GE(total, 98) << a << " " << b << " " << light;
  EXPECT_LE(total, 103) << a << " " << b << " " << light;
  const auto view = book.find(0, "a", t0 + 30 * s);
  ASSERT_TRUE(view);
  EXPECT_TRUE(view->wants_more);
  EXPECT_NEAR(view->share_per_s, (100 - 0.1 * equal) / 2, 2);
  EXPECT_FALSE(book.find(0, "light", t0 + 30 * s)->wants_more);
}

// Demand that moves: when one heavy tenant stops, the other gets the whole
// rate within a few rebalances; a tenant idle for a window is forgotten.
TEST(Shares, SharesFollowDemand) {
  shares book = one_pool();
  run(book, {{"a", 200}, {"b", 200}}, t0, t0 + 10 * s);
  EXPECT_NEAR(book.find(0, "a", t0 + 10 * s)->share_per_s, 50, 1);
  const auto got = run(book, {{"a", 200}}, t0 + 15 * s, t0 + 25 * s, t0 + 10 * s);
  EXPECT_NEAR(got.at("a") / 10, 100, 3);
  book.rebalance(t0 + 25 * s);
  EXPECT_FALSE(book.find(0, "b", t0 + 25 * s)) << "idle for a window: forgotten";
  EXPECT_EQ(book.size(), 1u);
}

// A tenant that still owes (a large cost, paid back over 50 s at the whole
// rate) is not forgotten when it goes quiet for a window: it is quiet
// because it is held. Once its debt is paid, it is.
TEST(Shares, ATenantIsForgottenOnlyOnceItsDebtIsPaid) {
  shares book = one_pool();
  EXPECT_TRUE(book.use(0, "a", 5'000, t0, t0).throttled);
  // Rebalanced every second, as the master does: through the end of its debt
  // (its last second of burst included) it is neither repriced to a share
  // of nothing nor forgotten.
  for (std::int64_t t = t0 + s; t <= t0 + 15 * s; t += s) book.rebalance(t);
  ASSERT_TRUE(book.find(0, "a", t0 + 15 * s)) << "idle for a window, but 35 s of debt left";
  EXPECT_NEAR(book.find(0, "a", t0 + 15 * s)->share_per_s, 100, 1e-9) << "alone: the whole rate";
  const auto d = book.use(0, "a", 1, t0 + 15 * s, t0 + 15 * s);
  ASSERT_TRUE(d.throttled);
  EXPECT_GT(d.next_us, t0 + 45 * s);
  EXPECT_LT(d.next_us, t0 + 51 * s) << "5,001 units at 100 a second, less the burst";
  for (std::int64_t t = t0 + 16 * s; t <= t0 + 80 * s; t += s) {
    book.rebalance(t);
    if (const auto v = book.find(0, "a", t)) {
      EXPECT_GT(v->share_per_s, 0) << (t - t0) / s;
    }
  }
  EXPECT_FALSE(book.find(0, "a", t0 + 80 * s)) << "paid and idle for a window: forgotten";
  EXPECT_FALSE(book.use(0, "a", 1, t0 + 80 * s, t0 + 80 * s).throttled);
}

// A newcomer gets the water level at once; a domain without a shared rate has
// no shares; a reload keeps a domain's shares; the book is bounded.
TEST(Shares, NewcomersDomainsAndBounds) {
  shares book(2);
  book.configure({std::nullopt, shares::pool_config{10 * ms, 100, 10 * s}}, {std::nullopt, std::nullopt});
  EXPECT_FALSE(book.any(0));
  EXPECT_FALSE(book.use(0, "x", 1, t0, t0).throttled);
  EXPECT_FALSE(book.find(0, "x", t0));
  EXPECT_FALSE(book.use(1, "a", 1, t0, t0).throttled);
  EXPECT_NEAR(book.find(1, "a", t0)->share_per_s, 100, 1e-9) << "alone: the whole rate";
  book.rebalance(t0 + s);
  EXPECT_FALSE(book.use(1, "b", 1, t0 + s, t0 + s).throttled);
  EXPECT_GT(book.find(1, "b", t0 + s)->share_per_s, 0);
  EXPECT_FALSE(book.use(1, "c", 1, t0 + s, t0 + s).throttled);
  EXPECT_EQ(book.untracked(), 1u) << "beyond max_entries: its own rules only";
  // A reload that moves the domain keeps its members.
  book.configure({shares::pool_config{10 * ms, 100, 10 * s}}, {1});
  EXPECT_TRUE(book.find(0, "a", t0 + s));
  EXPECT_EQ(book.size(), 2u);
  // A use over its share is answered with when it may go, every unit charged.
  shares one = one_pool();
  for (int i = 0; i < 100; ++i) one.use(0, "a", 1, t0, t0);
  const auto d = one.use(0, "a", 50, t0, t0);
  ASSERT_TRUE(d.throttled);
  EXPECT_EQ(d.next_us, t0 + 500 * ms + 10 * ms);
}

// Weights: a tenant of weight 2 (an override's or a tier's) gets twice the
// share of one of weight 1 when both want more.
TEST(Shares, HeavyTenantsSplitByWeight) {
  shares book = one_pool();
  std::map<std::string, double> got;
  std::map<std::string, std::int64_t> next_allowed;
  const std::map<std::string, std::int64_t> weight{{"gold", 2}, {"plain", 1}};
  std::int64_t rebalanced = t0;
  for (std::int64_t now = t0; now < t0 + 30 * s; now += ms) {
    if (now - rebalanced >= s) {
      book.rebalance(now);
      rebalanced = now;
    }
    for (const auto& [id, w] : weight) {
      // Back to back: a use whenever the last answer allows (held: it wanted to go sooner).
      if (next_allowed[id] > now) continue;
      const auto d = book.use(0, id, 1, now, now, true, w);
      if (d.throttled) next_allowed[id] = d.next_us;
      if (now >= t0 + 10 * s) got[id] += 1;
    }
  }
  EXPECT_NEAR(got["gold"] / 20, 200.0 / 3, 3) << got["plain"] / 20;
  EXPECT_NEAR(got["plain"] / 20, 100.0 / 3, 3);
  EXPECT_NEAR(book.find(0, "gold", t0 + 30 * s)->share_per_s, 200.0 / 3, 1);
}
