// Reservations the gatekeepers hold open, and their death with a gatekeeper:
// the book alone, then through ingest (accounting frames in, the state's
// standing out). Time is a manual clock.
#include <gtest/gtest.h>

#include "master/engine/ingest.hpp"
#include "master/engine/reservations.hpp"

using namespace smockron;
using namespace std::string_literals;
using master::reservations;

TEST(Reservations, CloseTakesTheOneNamedOnItsConnection) {
  reservations book(10);
  ASSERT_TRUE(book.open({1, "llm", "k", 1000, 50, 0}));
  ASSERT_TRUE(book.open({1, "llm", "k", 1000, 70, 1}));  // the same instant: two of them
  ASSERT_TRUE(book.open({2, "llm", "k", 1000, 90, 2}));
  EXPECT_FALSE(book.close(3, "llm", "k", 1000)) << "another connection's";
  EXPECT_FALSE(book.close(1, "llm", "k", 999));
  EXPECT_FALSE(book.close(1, "api", "k", 1000));
  EXPECT_EQ(book.close(1, "llm", "k", 1000)->units, 50);
  EXPECT_EQ(book.close(1, "llm", "k", 1000)->units, 70);
  EXPECT_FALSE(book.close(1, "llm", "k", 1000));
  EXPECT_EQ(book.size(), 1u);
}

TEST(Reservations, APeersAndTheOldOnesAreTakenAndTheBookIsBounded) {
  reservations book(3);
  ASSERT_TRUE(book.open({1, "llm", "a", 1, 5, 100}));
  ASSERT_TRUE(book.open({2, "llm", "b", 2, 6, 200}));
  ASSERT_TRUE(book.open({1, "llm", "c", 3, 7, 300}));
  EXPECT_FALSE(book.open({2, "llm", "d", 4, 8, 400})) << "bounded";
  const auto gone = book.take_peer(1);
  ASSERT_EQ(gone.size(), 2u);
  EXPECT_EQ(gone[0].identifier, "a");
  EXPECT_EQ(gone[1].identifier, "c");
  EXPECT_FALSE(book.close(1, "llm", "a", 1)) << "closed with its peer";
  ASSERT_TRUE(book.open({2, "llm", "e", 5, 9, 500}));
  EXPECT_TRUE(book.take_older(200, 10).empty()) << "opened at 200: not before it";
  const auto old = book.take_older(501, 1);
  ASSERT_EQ(old.size(), 1u) << "at most the budget, oldest first";
  EXPECT_EQ(old[0].identifier, "b");
  EXPECT_EQ(book.size(), 1u);
}

// After a restart, reservations read back from the store belong to no
// connection: a correction on any connection closes one (its own first),
// they go before this run's in age order, and the book stays bounded.
TEST(Reservations, RestoredOnesAreClosedByAnyConnectionAndAgeFirst) {
  reservations book(4);
  ASSERT_TRUE(book.open({1, "llm", "new", 5, 9, 900}));
  ASSERT_TRUE(book.restore({7, "llm", "k", 1000, 40, 300, 0xb}));
  ASSERT_TRUE(book.restore({7, "llm", "old", 10, 30, 100, 0xa}));
  ASSERT_TRUE(book.open({2, "llm", "k", 1000, 60, 950}));
  EXPECT_FALSE(book.restore({7, "llm", "z", 1, 1, 1, 0xc})) << "bounded";
  const auto own = book.close(2, "llm", "k", 1000);
  ASSERT_TRUE(own);
  EXPECT_EQ(own->units, 60) << "the connection's own first";
  const auto restored = book.close(5, "llm", "k", 1000);
  ASSERT_TRUE(restored);
  EXPECT_EQ(restored->peer, reservations::k_restored);
  EXPECT_EQ(restored->tag, 0xbu);
  EXPECT_TRUE(book.take_peer(7).empty()) << "a restored one is no connection's";
  const auto old = book.take_older(901, 10);
  ASSERT_EQ(old.size(), 2u);
  EXPECT_EQ(old[0].identifier, "old");
  EXPECT_EQ(old[1].identifier, "new");
}

// What was given back is remembered for a late correction: once each, on
// any connection, the oldest first, and at most k_max_released of them.
TEST(Reservations, GivenBackOnesAreRememberedOnceAndBounded) {
  reservations book(4);
  book.remember_released({1, "llm", "k", 1000, 40, 100, 1});
  book.remember_released({2, "llm", "k", 1000, 60, 200, 2});
  EXPECT_FALSE(book.take_released("llm", "k", 999));
  EXPECT_EQ(book.take_released("llm", "k", 1000), 40);
  EXPECT_EQ(book.take_released("llm", "k", 1000), 60);
  EXPECT_FALSE(book.take_released("llm", "k", 1000)) << "once each";
  for (std::size_t i = 0; i <= reservations::k_max_released; ++i) {
    book.remember_released({1, "llm", "id" + std::to_string(i), 5, 1, static_cast<std::int64_t>(i), i});
  }
  EXPECT_FALSE(book.take_released("llm", "id0", 5)) << "the oldest forgotten past the bound";
  EXPECT_EQ(book.take_released("llm", "id1", 5), 1);
  EXPECT_EQ(book.take_released("llm", "id" + std::to_string(reservations::k_max_released), 5), 1);
}

namespace {

config::master_config llm(const std::string& extra = "") {
  auto r = config::load_string("[master]\n" + extra + R"(
[master.domains.llm]
rules = [ { rate = "100/s", burst = 100 }, { quota = 1000, per = "day" } ]
algorithm = "gcra"
)",
                               "test");
  return *r.cfg->master;
}

class IngestReservations : public ::testing::Test {
protected:
  explicit IngestReservations(const std::string& extra = "reservation_timeout = \"5m\"")
      : cfg_(llm(extra)), ingest_(cfg_, clock_, registry_) {}

  void send(std::uint64_t peer, std::vector<std::string> frames) {
    std::vector<std::string_view> v(frames.begin(), frames.end());
    ingest_.handle(v, false, clock_.wall_us(), peer);
  }
  std::string at(std::int64_t offset_ms = 0) const { return std::to_string(clock_.wall_ms() + offset_ms); }
  std::int64_t used(const std::string& id) {
    const rules::state* u = ingest_.states().find(0, id);
    return u ? rules::quota_used(ingest_.domains()[0].limits, *u, 0, clock_.wall_us()) : 0;
  }

  manual_clock clock_;
  metrics::registry registry_;
  config::master_config cfg_;
  master::ingest ingest_;
};

}  // namespace

TEST_F(IngestReservations, ACorrectionClosesItsReservation) {
  const std::string t = at();
  send(1, {"llm\0"s, "ACCEPTED", "k", t, "", "reserve=300"});
  EXPECT_EQ(used("k"), 300);
  EXPECT_EQ(ingest_.open_reservations(), 1u);
  send(1, {"llm\0"s, "REJECTED", "k", t, "", "adjust=-180"});
  EXPECT_EQ(used("k"), 120);
  EXPECT_EQ(ingest_.open_reservations(), 0u);
  EXPECT_EQ(ingest_.peer_closed(1, clock_.wall_us()), 0u) << "nothing left open to give back";
  EXPECT_EQ(used("k"), 120);
}

TEST_F(IngestReservations, AGatekeepersReservationsDieWithItsConnection) {
  send(1, {"llm\0"s, "ACCEPTED", "k", at(), "", "reserve=300"});
  send(1, {"llm\0"s, "DELAYED", "k", at(), at(500), "reserve=200"});
  send(2, {"llm\0"s, "ACCEPTED", "k", at(), "", "reserve=100"});
  send(2, {"llm\0"s, "ACCEPTED", "k", at(), "", "cost=7"});  // a known cost: nothing held open
  EXPECT_EQ(used("k"), 607);
  EXPECT_EQ(ingest_.open_reservations(), 3u);
  EXPECT_EQ(ingest_.peer_closed(1, clock_.wall_us()), 2u);
  EXPECT_EQ(used("k"), 107) << "its two reservations given back, the other gatekeeper's kept";
  EXPECT_NE(registry_.render().find("smockron_master_reservations_released_total{reason=\"gatekeeper_gone\"} 2"),
            std::string::npos);
}

TEST_F(IngestReservations, AReservationOlderThanTheTimeoutIsGivenBack) {
  send(1, {"llm\0"s, "ACCEPTED", "k", at(), "", "reserve=300"});
  clock_.advance(std::chrono::minutes(4));
  ingest_.sweep(clock_.wall_us());
  EXPECT_EQ(ingest_.open_reservations(), 1u);
  clock_.advance(std::chrono::minutes(2));
  ingest_.sweep(clock_.wall_us());
  EXPECT_EQ(ingest_.open_reservations(), 0u);
  EXPECT_NE(registry_.render().find("smockron_master_reservations_released_total{reason=\"timeout\"} 1"),
            std::string::npos);
}

// What a store keeps of the book: told of each reservation opened and
// closed, however it closes.
struct recorded_log final : master::reservation_log {
  void opened(const reservations::reservation& r) override { events.push_back("+" + r.identifier); }
  void closed(const reservations::reservation& r) override { events.push_back("-" + r.identifier); }
  std::vector<std::string> events;
};

TEST_F(IngestReservations, TheLogHearsEveryOpenAndClose) {
  recorded_log log;
  ingest_.log_reservations(&log);
  send(1, {"llm\0"s, "ACCEPTED", "a", at(), "", "reserve=10"});
  send(1, {"llm\0"s, "ACCEPTED", "b", at(), "", "reserve=10"});
  send(2, {"llm\0"s, "ACCEPTED", "c", at(), "", "reserve=10"});
  send(1, {"llm\0"s, "REJECTED", "a", at(), "", "adjust=0"});
  ingest_.peer_closed(1, clock_.wall_us());
  clock_.advance(std::chrono::minutes(6));
  ingest_.sweep(clock_.wall_us());
  EXPECT_EQ(log.events, (std::vector<std::string>{"+a", "+b", "+c", "-a", "-b", "-c"}));
}

// A reservation an earlier run left open: its correction closes it (on
// whatever connection), else it is given back at the timeout from when it
// was first received.
TEST_F(IngestReservations, ARestoredReservationIsClosedOrGivenBackAtItsTimeout) {
  const std::string t = at();
  send(1, {"llm\0"s, "ACCEPTED", "k", t, "", "cost=300"});  // its charge, as the state read back has it
  send(1, {"llm\0"s, "ACCEPTED", "j", t, "", "cost=200"});
  const std::int64_t received = clock_.wall_us();
  ASSERT_TRUE(ingest_.restore_reservation({9, "llm", "k", std::stoll(t), 300, received, 1}));
  ASSERT_TRUE(ingest_.restore_reservation({9, "llm", "j", std::stoll(t), 200, received, 2}));
  EXPECT_EQ(ingest_.open_reservations(), 2u);
  send(4, {"llm\0"s, "REJECTED", "k", t, "", "adjust=-100"});
  EXPECT_EQ(used("k"), 200);
  EXPECT_EQ(ingest_.open_reservations(), 1u) << "closed by its correction on a connection of this run";
  clock_.advance(std::chrono::minutes(4));
  ingest_.sweep(clock_.wall_us());
  EXPECT_EQ(used("j"), 200);
  clock_.advance(std::chrono::minutes(2));
  ingest_.sweep(clock_.wall_us());
  EXPECT_EQ(ingest_.open_reservations(), 0u);
  EXPECT_EQ(used("j"), 0) << "its gatekeeper never corrected it: given back";
}

// A correction that comes after its reservation was given back charges the
// estimate again with the difference: what the use really cost.
TEST_F(IngestReservations, ALateCorrectionChargesTheEstimateAgain) {
  const std::string t = at();
  send(1, {"llm\0"s, "ACCEPTED", "k", t, "", "reserve=300"});
  send(1, {"llm\0"s, "ACCEPTED", "j", t, "", "reserve=100"});
  EXPECT_EQ(ingest_.peer_closed(1, clock_.wall_us()), 2u);  // the connection dropped
  EXPECT_EQ(used("k"), 0);
  send(2, {"llm\0"s, "REJECTED", "k", t, "", "adjust=-180"});  // the gatekeeper, back on a new connection
  EXPECT_EQ(used("k"), 120) << "what the call cost";
  send(2, {"llm\0"s, "REJECTED", "k", t, "", "adjust=0"});
  EXPECT_EQ(used("k"), 120) << "a second correction finds nothing given back";
  clock_.advance(std::chrono::minutes(6));
  send(2, {"llm\0"s, "REJECTED", "j", t, "", "adjust=50"});
  EXPECT_EQ(used("j"), 150);
  EXPECT_NE(registry_.render().find("smockron_master_reservations_late_corrections_total 2"), std::string::npos);
}

// A client idle while its long response goes on: its state is swept (2 s
// after it stopped mattering), and the estimate's charge with it. The
// correction then charges the whole real cost from the use's time, as if
// the state had been kept.
// (A sliding log swept had every unit leave its windows, the estimate's
// too: only the difference is owed, placed at the oldest time still counted.)
struct swept_correction {
  std::optional<wire::delay_until> answer;
  std::string metrics;
};
swept_correction correct_after_a_sweep(const std::string& algorithm) {
  auto r = config::load_string(R"([master]
[master.domains.llm]
rules = [ { rate = "10/s", burst = 10 } ]
algorithm = ")" + algorithm + "\"\n",
                               "test");
  manual_clock clock;
  metrics::registry registry;
  master::ingest ingest(*r.cfg->master, clock, registry);
  const auto send = [&](std::vector<std::string> frames) {
    std::vector<std::string_view> v(frames.begin(), frames.end());
    return ingest.handle(v, false, clock.wall_us(), 1);
  };
  const std::string t = std::to_string(clock.wall_ms());
  send({"llm\0"s, "ACCEPTED", "k", t, "", "reserve=10"});  // paid back 1 s later
  clock.advance(std::chrono::seconds(5));
  ingest.sweep(clock.wall_us());
  EXPECT_EQ(ingest.states().find(0, "k"), nullptr) << "swept while the response went on";
  EXPECT_EQ(ingest.open_reservations(), 1u);
  swept_correction out;
  out.answer = send({"llm\0"s, "REJECTED", "k", t, "", "adjust=90"});  // 100 units in all
  out.metrics = registry.render();
  return out;
}

TEST(IngestReservationsSwept, GcraChargesTheEstimateAgainUnderTheDifference) {
  const auto c = correct_after_a_sweep("gcra");
  ASSERT_TRUE(c.answer.has_value());
  // 100 units: 10 s of the rate from the use's time (t0), less the burst.
  EXPECT_EQ(c.answer->next_ms, manual_clock{}.wall_ms() + 9'100);
  EXPECT_NE(c.metrics.find("smockron_master_reservations_late_corrections_total 1"), std::string::npos);
  EXPECT_NE(c.metrics.find("smockron_master_units_total{domain=\"llm\"} 100"), std::string::npos)
      << "the estimate is charged again, not counted again";
}

TEST(IngestReservationsSwept, TheSlidingLogChargesOnlyTheDifference) {
  const auto c = correct_after_a_sweep("sliding-log");
  ASSERT_TRUE(c.answer.has_value());
  // 90 units from the oldest time the 1 s window still counts (t0 + 4 s):
  // the burst of 10 there, 80 more one interval apart after it.
  EXPECT_EQ(c.answer->next_ms, manual_clock{}.wall_ms() + 12'101);  // (t0 + 4 s and 1 µs, rounded up)
  EXPECT_NE(c.metrics.find("smockron_master_reservations_late_corrections_total 0"), std::string::npos);
}

TEST_F(IngestReservations, ACorrectionAfterARestartChargesTheDifference) {
  // A master that did not see the reservation (restarted from Redis, which
  // kept the state): the difference is what is missing.
  send(1, {"llm\0"s, "ACCEPTED", "k", at(), "", "cost=300"});  // as restored
  send(1, {"llm\0"s, "REJECTED", "k", at(), "", "adjust=50"});
  EXPECT_EQ(used("k"), 350);
  send(1, {"llm\0"s, "REJECTED", "k", at(), "", "adjust=0"});
  EXPECT_EQ(used("k"), 350);
  EXPECT_EQ(ingest_.open_reservations(), 0u);
}
