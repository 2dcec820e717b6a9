// The master's lease book: never more than the limit leased, shares, give-backs, departures.
#include "master/engine/leases.hpp"

#include <gtest/gtest.h>

#include <map>
#include <utility>

using smockron::master::leases;
using smockron::wire::lease;

namespace {

// What each holder was last granted: (held, cap).
struct grants {
  std::map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> last;
  std::size_t messages = 0;
  void take(leases& book) {
    book.take_changed([&](std::string_view, std::string_view, const leases::holder& h) {
      last[h.id] = {h.held, h.cap};
      ++messages;
    });
  }
  std::int64_t held(std::uint64_t id) const { return last.count(id) ? last.at(id).first : 0; }
  std::int64_t cap(std::uint64_t id) const { return last.count(id) ? last.at(id).second : 0; }
};

lease ask(std::uint64_t holder, std::int64_t want, std::int64_t returned = 0, std::int64_t held = 0) {
  return lease{"llm", "key", holder, want, held, returned};
}

}  // namespace

TEST(Leases, GrantsWhatIsWantedUpToTheLimit) {
  leases book(100);
  grants g;
  ASSERT_TRUE(book.on_lease(1, ask(10, 3), {4, 0}, 1'000));
  g.take(book);
  EXPECT_EQ(g.held(10), 3);
  EXPECT_EQ(g.cap(10), 3);
  ASSERT_TRUE(book.on_lease(2, ask(20, 5), {4, 0}, 2'000));
  g.take(book);
  EXPECT_EQ(g.held(20), 1);  // one slot left
  EXPECT_EQ(book.held(), 4);
  EXPECT_EQ(book.held_by("llm", "key"), 4);
  EXPECT_EQ(book.held_by("llm", "other"), -1);
}

TEST(Leases, AHolderAboveItsShareIsAskedDownAndTheSlotsGoToTheOneWaiting) {
  leases book(100);
  grants g;
  book.on_lease(1, ask(10, 30), {4, 0}, 1'000);  // holder 10 takes all four
  g.take(book);
  EXPECT_EQ(g.held(10), 4);
  book.on_lease(2, ask(20, 30), {4, 0}, 2'000);  // holder 20 waits: 10 is capped to its share
  g.take(book);
  EXPECT_EQ(g.held(20), 0);
  EXPECT_EQ(g.held(10), 4);
  EXPECT_EQ(g.cap(10), 2);
  // Holder 10 gives two back as its requests end: they go to 20, never more than four in all.
  book.on_lease(1, ask(10, 29, 1), {4, 0}, 3'000);
  g.take(book);
  EXPECT_EQ(g.held(20), 1);
  EXPECT_EQ(book.held(), 4);
  book.on_lease(1, ask(10, 28, 2), {4, 0}, 4'000);
  g.take(book);
  EXPECT_EQ(g.held(20), 2);
  EXPECT_EQ(book.held(), 4);
}

TEST(Leases, MaxMinShares) {
  leases book(100);
  grants g;
  // A light holder wants 1 of 9, two heavy ones want many: 1, 4, 4.
  book.on_lease(1, ask(10, 50), {9, 0}, 1'000);
  g.take(book);
  EXPECT_EQ(g.held(10), 9);
  book.on_lease(2, ask(20, 50), {9, 0}, 2'000);
  book.on_lease(3, ask(30, 1), {9, 0}, 3'000);
  g.take(book);
  EXPECT_EQ(g.cap(10), 4);  // 9 - 1 (light) split in two
  // Holder 10 gives back five: the light one is served, then the other heavy one up to its share.
  book.on_lease(1, ask(10, 50, 5), {9, 0}, 4'000);
  g.take(book);
  EXPECT_EQ(g.held(30), 1);
  EXPECT_EQ(g.held(20), 4);
  EXPECT_EQ(book.held(), 9);
}

TEST(Leases, IdleSlotsStayUntilSomeoneElseWants) {
  leases book(100);
  grants g;
  book.on_lease(1, ask(10, 4), {4, 0}, 1'000);
  g.take(book);
  const std::size_t before = g.messages;
  book.on_lease(1, ask(10, 0), {4, 0}, 2'000);  // done, but keeps its lease
  g.take(book);
  EXPECT_EQ(g.messages, before);  // nothing to tell
  EXPECT_EQ(book.held(), 4);
  book.on_lease(2, ask(20, 1), {4, 0}, 3'000);
  g.take(book);
  EXPECT_EQ(g.cap(10), 0);  // wants none: asked for all back
  book.on_lease(1, ask(10, 0, 4), {4, 0}, 4'000);
  g.take(book);
  EXPECT_EQ(g.held(20), 1);
  EXPECT_EQ(book.held(), 1);
}

TEST(Leases, AClosedConnectionFreesItsSlotsAndAComebackClaimsWhatIsInFlight) {
  leases book(100);
  grants g;
  book.on_lease(1, ask(10, 4), {4, 0}, 1'000);
  book.on_lease(2, ask(20, 2), {4, 0}, 2'000);
  g.take(book);
  EXPECT_EQ(book.peer_closed(1, 3'000), 4);
  g.take(book);
  EXPECT_EQ(g.held(20), 2);
  // Holder 10 is back on connection 3 with three still in flight: counted beyond the limit...
  book.on_lease(3, ask(10, 3, 0, 3), {4, 0}, 4'000);
  g.take(book);
  EXPECT_EQ(book.held(), 5);
  // ...and nothing more is granted until the total is under it.
  book.on_lease(2, ask(20, 3), {4, 0}, 5'000);
  g.take(book);
  EXPECT_EQ(g.held(20), 2);
  book.on_lease(3, ask(10, 1, 2), {4, 0}, 6'000);  // two ended
  g.take(book);
  EXPECT_EQ(book.held(), 4);
  EXPECT_EQ(g.held(20), 3);
}

TEST(Leases, NoRuleGrantsEveryWantAndTheBookIsBounded) {
  leases book(1);
  grants g;
  ASSERT_TRUE(book.on_lease(1, ask(10, 7), {0, 0}, 1'000));
  g.take(book);
  EXPECT_EQ(g.held(10), 7);
  lease other{"llm", "other", 10, 1, 0, 0};
  EXPECT_FALSE(book.on_lease(1, other, {4, 0}, 2'000));  // full
  // Nothing held and nothing wanted: forgotten.
  book.on_lease(1, ask(10, 0, 7), {0, 0}, 3'000);
  g.take(book);
  EXPECT_EQ(book.size(), 0u);
  EXPECT_TRUE(book.on_lease(1, other, {4, 0}, 4'000));
}

TEST(Leases, ALowerLimitOnReloadCapsTheHolders) {
  leases book(100);
  grants g;
  book.on_lease(1, ask(10, 4), {4, 0}, 1'000);
  book.on_lease(2, ask(20, 4), {8, 0}, 1'000);
  g.take(book);
  EXPECT_EQ(book.held(), 8);
  book.relimit([](std::string_view, std::string_view, std::string_view) { return leases::limits{2, 0}; }, 2'000);
  g.take(book);
  EXPECT_EQ(book.held(), 8);  // in flight stays counted
  EXPECT_EQ(g.cap(10) + g.cap(20), 2);
}

namespace {

// A deterministic random number below n (a 64-bit LCG).
struct lcg {
  std::uint64_t x;
  std::uint64_t operator()(std::uint64_t n) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (x >> 33) % n;
  }
};

// One holder of one identifier as a gatekeeper worker runs it: requests
// arrive and end at random, it admits within min(held, cap) and gives back
// above what it keeps (proxy/gate/slots.cpp's rules).
struct simulated_holder {
  std::int64_t held = 0, cap = 0, in_use = 0, waiting = 0, returned = 0;

  /// One random event; returns the LEASE it then sends (want, held, returned).
  lease step(lcg& next, std::string_view identifier, std::uint64_t holder) {
    switch (next(3)) {
      case 0: ++waiting; break;
      case 1:
        if (in_use > 0) --in_use;
        break;
      default: break;
    }
    while (waiting > 0 && in_use < std::min(held, cap)) {
      --waiting;
      ++in_use;
    }
    const std::int64_t want = in_use + waiting;
    const std::int64_t keep = cap < held ? std::max(in_use, std::min(cap, want)) : held;
    if (held > keep) {
      returned += held - keep;
      held = keep;
    }
    return lease{"llm", identifier, holder, want, held, returned};
  }
  /// A GRANT for it: what the master counted, less the give-backs on their way.
  void grant(const leases::holder& h) {
    held = h.held - (returned - h.seen);
    cap = std::min(h.cap, held);
  }
};

}  // namespace

// Many holders asking and giving back in any order: what the master counts
// never exceeds the limit once the claims are paid back, and never falls
// below what the holders may use.
TEST(Leases, RandomTrafficNeverLeasesMoreThanTheLimit) {
  leases book(100);
  lcg next{12345};
  std::map<std::uint64_t, simulated_holder> side;
  for (int step = 0; step < 20'000; ++step) {
    const std::uint64_t id = 1 + next(5);
    book.on_lease(id, side[id].step(next, "key", id), {3, 0}, step);
    book.take_changed([&](std::string_view, std::string_view, const leases::holder& h) { side[h.id].grant(h); });
    std::int64_t in_use = 0;
    for (auto& [_, s] : side) in_use += s.in_use;
    ASSERT_LE(in_use, 3) << "step " << step;
    ASSERT_LE(book.held(), 3) << "step " << step;
  }
}

namespace {
lease for_id(const char* id, std::uint64_t holder, std::int64_t want, std::int64_t returned = 0) {
  return lease{"llm", id, holder, want, 0, returned};
}
}  // namespace

// A shared limit: the light identifier gets what it wants, the heavy ones
// split the rest, and the pool is never leased past its limit.
TEST(Leases, ASharedLimitIsSplitMaxMinAmongTheIdentifiers) {
  leases book(100);
  std::map<std::string, std::int64_t> held;
  const auto take = [&] {
    book.take_changed(
        [&](std::string_view, std::string_view id, const leases::holder& h) { held[std::string(id)] = h.held; });
  };
  book.on_lease(1, for_id("a", 10, 20), {0, 10}, 1'000);  // alone: all ten
  take();
  EXPECT_EQ(held["a"], 10);
  book.on_lease(1, for_id("b", 10, 20), {0, 10}, 2'000);
  book.on_lease(1, for_id("c", 10, 1), {0, 10}, 3'000);
  take();
  EXPECT_EQ(book.held(), 10);  // nothing free: b and c wait for a to come down to its share
  EXPECT_EQ(held["b"], 0);
  book.on_lease(1, for_id("a", 10, 20, 6), {0, 10}, 4'000);  // a gives six back as its requests end
  take();
  EXPECT_EQ(held["c"], 1);                 // the light one: all it wants
  EXPECT_EQ(book.held_by("llm", "a"), 4);  // the heavy ones split the other nine
  EXPECT_EQ(held["b"], 5);
  EXPECT_EQ(book.held(), 10);
  // An identifier's own limit still applies under the pool.
  book.on_lease(2, for_id("d", 20, 9), {2, 10}, 5'000);
  book.on_lease(1, for_id("a", 10, 20, 6 + 4), {0, 10}, 6'000);
  take();
  EXPECT_EQ(book.held_by("llm", "d"), 1);  // b still holds one over its new share
  EXPECT_EQ(book.held(), 10);
  book.on_lease(1, for_id("b", 10, 20, 1), {0, 10}, 7'000);  // b comes down
  take();
  EXPECT_EQ(book.held_by("llm", "d"), 2);  // its own limit, however much it wants
  EXPECT_EQ(book.held(), 10);
}

// Weights: an identifier of weight w counts as w even shares of the pool.
TEST(Leases, APoolIsSplitByWeight) {
  leases book(100);
  book.on_lease(1, for_id("a", 10, 20), {0, 9, 2}, 1'000);
  book.on_lease(1, for_id("b", 10, 20), {0, 9, 1}, 2'000);
  book.take_changed([](std::string_view, std::string_view, const leases::holder&) {});
  EXPECT_EQ(book.limit_of("llm", "a"), 6);
  EXPECT_EQ(book.limit_of("llm", "b"), 3);
  // One that wants less than its weighted share leaves the rest to the other.
  book.on_lease(1, for_id("a", 10, 2), {0, 9, 2}, 3'000);
  EXPECT_EQ(book.limit_of("llm", "a"), 2);
  EXPECT_EQ(book.limit_of("llm", "b"), 7);
}

// Identifiers and holders asking and giving back at random under a pool:
// never more than the pool in flight, nor more than an identifier's own.
TEST(Leases, RandomTrafficNeverLeasesMoreThanThePool) {
  leases book(100);
  lcg next{777};
  const std::string ids[] = {"a", "b", "c", "d"};
  std::map<std::pair<std::string, std::uint64_t>, simulated_holder> side;  // (identifier, holder)
  for (int step = 0; step < 20'000; ++step) {
    const std::string& id = ids[next(4)];
    const std::uint64_t holder = 1 + next(3);
    const std::int64_t own = id == "d" ? 2 : 0;  // "d" has its own limit of 2
    book.on_lease(holder, side[{id, holder}].step(next, id, holder), {own, 5}, step);
    book.take_changed([&](std::string_view, std::string_view name, const leases::holder& h) {
      side[{std::string(name), h.id}].grant(h);
    });
    std::int64_t in_use = 0, d = 0;
    for (auto& [key, s] : side) {
      in_use += s.in_use;
      if (key.first == "d") d += s.in_use;
    }
    ASSERT_LE(in_use, 5) << "step " << step;
    ASSERT_LE(d, 2) << "step " << step;
    ASSERT_LE(book.held(), 5) << "step " << step;
  }
}
