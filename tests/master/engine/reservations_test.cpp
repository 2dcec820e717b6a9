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
  EXPECT_EQ(book.close(1, "llm", "k", 1000), 50);
  EXPECT_EQ(book.close(1, "llm", "k", 1000), 70);
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
