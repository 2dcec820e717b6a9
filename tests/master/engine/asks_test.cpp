// Exact admission on the master: the GOs held open until their accounting
// settles them (asks.hpp), and the ANSWERs ingest gives to ASKs.
#include <gtest/gtest.h>

#include "master/engine/asks.hpp"
#include "master/engine/ingest.hpp"

using namespace smockron;
using namespace std::string_literals;

TEST(Asks, EachGoIsSettledByItsOwnRequest) {
  master::asks book(10);
  EXPECT_TRUE(book.open(1, "api", "k", 10, 5, 0));
  EXPECT_TRUE(book.open(2, "api", "k", 10, 7, 0));
  EXPECT_TRUE(book.open(1, "api", "k", 11, 3, 5));
  EXPECT_EQ(book.open_units("api", "k"), 15);
  EXPECT_EQ(book.open_units("api", "other"), 0);
  EXPECT_EQ(book.open_units("web", "k"), 0) << "domains are apart";
  EXPECT_EQ(book.settle(1, "api", "k", 11), 5) << "the GO its ASK had, whatever the order: given at 5";
  EXPECT_EQ(book.open_units("api", "k"), 12);
  EXPECT_FALSE(book.settle(3, "api", "k", 10)) << "another connection's number settles nothing";
  EXPECT_FALSE(book.settle(1, "api", "k", 12)) << "nor a number with no GO";
  EXPECT_EQ(book.settle(2, "api", "k", 10), 0);
  EXPECT_EQ(book.open_units("api", "k"), 5);
  EXPECT_TRUE(book.settle(1, "api", "k", 10));
  EXPECT_FALSE(book.settle(1, "api", "k", 10));
  EXPECT_EQ(book.size(), 0u);
  EXPECT_EQ(book.units(), 0);
}

TEST(Asks, GosDieWithTheirConnectionOrTheirTimeout) {
  master::asks book(10);
  book.open(1, "api", "a", 0, 4, 0);
  book.open(2, "api", "a", 0, 6, 0);
  book.open(1, "api", "b", 1, 1, 5'000'000);
  EXPECT_EQ(book.peer_closed(1), 2u);
  EXPECT_EQ(book.open_units("api", "a"), 6);
  EXPECT_EQ(book.open_units("api", "b"), 0);
  EXPECT_EQ(book.expire(master::asks::k_ttl_us - 1), 0u);
  EXPECT_EQ(book.expire(master::asks::k_ttl_us), 1u);
  EXPECT_EQ(book.units(), 0);
  EXPECT_EQ(book.size(), 0u);
}

TEST(Asks, TheBookIsBounded) {
  master::asks book(1);
  EXPECT_TRUE(book.open(1, "api", "a", 0, 1, 0));
  EXPECT_TRUE(book.open(1, "api", "a", 1, 1, 0)) << "more GOs of a held identifier are kept";
  EXPECT_FALSE(book.open(1, "api", "b", 2, 1, 0));
}

namespace {

class IngestAsks : public ::testing::Test {
protected:
  IngestAsks()
      : cfg_(*config::load_string(R"(
[master]
[master.domains.api]
admission = "exact"
algorithm = "gcra"
rules = [ { rate = "10/s", burst = 10 } ]
)",
                                  "test")
                  .cfg->master),
        in_(cfg_, clock_, reg_) {}

  // Sends an ASK from connection `peer` for a request that may go until
  // `latest_ms` from now (0: now or never); returns its ANSWER.
  wire::answer ask(std::uint64_t peer, std::int64_t seq, std::int64_t cost, std::int64_t latest_ms = 0,
                   const std::string& id = "k") {
    const std::vector<std::string> f{"api\0"s, "ASK", id,
                                     "00000000000000" + std::to_string(10 + peer) + " " + std::to_string(seq) + " " +
                                         std::to_string(cost) + " " + std::to_string(clock_.wall_ms() + latest_ms)};
    const auto told = in_.handle(std::vector<std::string_view>(f.begin(), f.end()), false, clock_.wall_us(), peer);
    published_ = told ? told->next_ms : 0;
    wire::answer out;
    int n = 0;
    in_.take_answers([&](const wire::answer& a) {
      out = a;
      out.domain = out.identifier = {};  // views into the book's pending list, gone after the call
      ++n;
    });
    EXPECT_EQ(n, 1);
    // A time (a wait, a GO for later) is told to every gatekeeper as a DELAY_UNTIL; nothing else is.
    EXPECT_EQ(published_, out.at_ms);
    return out;
  }
  // The request that went: its accounting message, settling ASK number `seq` (-1: naming none).
  void went(std::uint64_t peer, std::int64_t cost, std::int64_t seq, const std::string& id = "k") {
    const std::vector<std::string> f{
        "api\0"s, "ACCEPTED",
        id,       std::to_string(clock_.wall_ms()),
        "",       "cost=" + std::to_string(cost) + (seq >= 0 ? " ask=" + std::to_string(seq) : std::string())};
    in_.handle(std::vector<std::string_view>(f.begin(), f.end()), false, clock_.wall_us(), peer);
  }

  manual_clock clock_;
  metrics::registry reg_;
  config::master_config cfg_;
  master::ingest in_;
  std::int64_t published_ = 0;  ///< the last ASK's DELAY_UNTIL (0: none)
};

}  // namespace

// Three gatekeepers ask for a fresh client's burst at once: the master lets
// the burst go once, whoever asks, and the accounting that follows settles it.
TEST_F(IngestAsks, NoMoreThanTheBurstGoesBeforeTheAccountingComes) {
  ASSERT_TRUE(cfg_.domains[0].exact);
  int go = 0;
  std::vector<std::pair<std::uint64_t, std::int64_t>> gone;  // (connection, ASK number) of each GO
  for (std::uint64_t gk = 1; gk <= 3; ++gk) {
    for (int i = 0; i < 5; ++i) {
      const auto a = ask(gk, i, 1);
      EXPECT_EQ(a.holder, 0x10 + gk) << "the holder named in hex";
      EXPECT_EQ(a.seq, i);
      if (a.verdict == wire::verdict_kind::go) {
        ++go;
        gone.emplace_back(gk, i);
        EXPECT_EQ(a.at_ms, 0);
      } else {
        EXPECT_EQ(a.verdict, wire::verdict_kind::wait);
        EXPECT_GT(a.at_ms, clock_.wall_ms()) << "ask again later";
      }
    }
  }
  EXPECT_EQ(go, 10) << "the burst, across every gatekeeper";
  EXPECT_EQ(in_.ask_book().open_units("api", "k"), 10);
  // An accounting message that names no ASK (a request that went without an
  // answer) charges, and settles nothing.
  went(1, 0, -1);
  EXPECT_EQ(in_.ask_book().open_units("api", "k"), 10);
  // The accounting of the ten that went settles them and charges them.
  for (const auto& [gk, seq] : gone) went(gk, 1, seq);
  EXPECT_EQ(in_.ask_book().open_units("api", "k"), 0);
  EXPECT_EQ(ask(1, 99, 1).verdict, wire::verdict_kind::wait) << "charged now: the burst is used";
  clock_.advance(std::chrono::milliseconds(100));
  EXPECT_EQ(ask(1, 100, 1).verdict, wire::verdict_kind::go) << "one unit back after one interval";
  EXPECT_NE(reg_.render().find("smockron_master_asks_settled_total 10"), std::string::npos);
  EXPECT_NE(reg_.render().find("smockron_master_asks_total{verdict=\"go\"} 11"), std::string::npos);
}

TEST_F(IngestAsks, ACostOverTheBurstNeverFitsAndWaitsNameWhenItFits) {
  EXPECT_EQ(ask(1, 1, 11).verdict, wire::verdict_kind::never);
  EXPECT_EQ(ask(1, 2, 10).verdict, wire::verdict_kind::go);
  went(1, 10, 2);
  const auto w = ask(1, 3, 4);
  EXPECT_EQ(w.verdict, wire::verdict_kind::wait);
  EXPECT_EQ(w.at_ms, clock_.wall_ms() + 400) << "four intervals";
  EXPECT_EQ(in_.ask_book().open_units("api", "k"), 0) << "a wait holds nothing open";
}

// A gatekeeper that dies with GOs open frees them (its requests died with it).
TEST_F(IngestAsks, AClosedConnectionsGosAreDropped) {
  EXPECT_EQ(ask(1, 1, 10).verdict, wire::verdict_kind::go);
  EXPECT_EQ(ask(2, 1, 1).verdict, wire::verdict_kind::wait);
  in_.peer_closed(1, clock_.wall_us());
  EXPECT_EQ(ask(2, 2, 1).verdict, wire::verdict_kind::go);
  // One never settled is dropped after its timeout.
  clock_.advance(std::chrono::microseconds(master::asks::k_ttl_us + 1'000'000));
  in_.sweep(clock_.wall_us());
  EXPECT_EQ(in_.ask_book().units(), 0);
  EXPECT_NE(reg_.render().find("smockron_master_asks_dropped_total{reason=\"gatekeeper_gone\"} 1"), std::string::npos);
  EXPECT_NE(reg_.render().find("smockron_master_asks_dropped_total{reason=\"timeout\"} 1"), std::string::npos);
}

// A domain that is not exact settles nothing (its accounting is the spec's).
TEST(IngestAsksOff, OnlyExactDomainsSettle) {
  auto r = config::load_string("[master]\n[master.domains.api]\nrules = [ { rate = \"10/s\", burst = 2 } ]\n", "t");
  ASSERT_TRUE(r.cfg);
  EXPECT_FALSE(r.cfg->master->domains[0].exact);
  auto bad = config::load_string("[master]\n[master.domains.api]\nadmission = \"always\"\nrules = []\n", "t");
  EXPECT_FALSE(bad.cfg);
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_EQ(bad.errors[0].key, "master.domains.api.admission");
}

// A domain that is no longer exact (a reload) answers GO and holds nothing open.
TEST_F(IngestAsks, ADomainNoLongerExactLetsEveryRequestGo) {
  auto next = cfg_;
  next.domains[0].exact = false;
  in_.reconfigure(next);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(ask(1, i, 1).verdict, wire::verdict_kind::go);
  EXPECT_EQ(in_.ask_book().units(), 0);
}

// A request that may wait is given the time its units are its own, the next
// one the time after: held, not asked again; counted from now until settled.
TEST_F(IngestAsks, AGoForLaterQueuesRequestsWithinTheirMaxDelay) {
  EXPECT_EQ(ask(1, 1, 10).verdict, wire::verdict_kind::go);
  went(1, 10, 1);
  const auto a = ask(1, 2, 1, 1000);
  EXPECT_EQ(a.verdict, wire::verdict_kind::go);
  EXPECT_EQ(a.at_ms, clock_.wall_ms() + 100) << "one interval";
  const auto b = ask(2, 1, 2, 1000);
  EXPECT_EQ(b.verdict, wire::verdict_kind::go);
  EXPECT_EQ(b.at_ms, clock_.wall_ms() + 300) << "after the first, whoever asks";
  EXPECT_EQ(ask(2, 2, 8, 500).verdict, wire::verdict_kind::wait) << "not within its max_delay";
  EXPECT_EQ(in_.ask_book().open_units("api", "k"), 3);
  // Settled (its accounting at the time it went), charged no earlier than its GO's time.
  clock_.advance(std::chrono::milliseconds(100));
  went(1, 1, 2);
  clock_.advance(std::chrono::milliseconds(200));
  went(2, 2, 1);
  EXPECT_EQ(in_.ask_book().open_units("api", "k"), 0);
  EXPECT_EQ(ask(1, 3, 1).verdict, wire::verdict_kind::wait) << "the burst is used up to now";
}
