// Exact admission on the master: the GOs held open until their accounting
// settles them (asks.hpp), and the ANSWERs ingest gives to ASKs.
#include <gtest/gtest.h>

#include "master/core/rules.hpp"
#include "master/engine/asks.hpp"
#include "master/engine/ingest.hpp"

using namespace smockron;
using namespace std::string_literals;

TEST(Asks, EachGoIsSettledByItsOwnRequest) {
  master::asks book(10);
  EXPECT_TRUE(book.open(1, "api", "k", 10, 5, 0, 0, 0));
  EXPECT_TRUE(book.open(2, "api", "k", 10, 7, 0, 0, 0));
  EXPECT_TRUE(book.open(1, "api", "k", 11, 3, 5, 0, 5));
  EXPECT_EQ(book.open_units("api", "k"), 15);
  EXPECT_EQ(book.open_units("api", "other"), 0);
  EXPECT_EQ(book.open_units("web", "k"), 0) << "domains are apart";
  EXPECT_EQ(book.settle(1, "api", "k", 11, 5), 5) << "the GO its ASK had, whatever the order: expected at 5";
  EXPECT_EQ(book.open_units("api", "k"), 12);
  EXPECT_FALSE(book.settle(3, "api", "k", 10, 5)) << "another connection's number settles nothing";
  EXPECT_FALSE(book.settle(1, "api", "k", 12, 5)) << "nor a number with no GO";
  EXPECT_EQ(book.settle(2, "api", "k", 10, 5), 0);
  EXPECT_EQ(book.open_units("api", "k"), 5);
  EXPECT_TRUE(book.settle(1, "api", "k", 10, 5));
  EXPECT_FALSE(book.settle(1, "api", "k", 10, 5));
  EXPECT_EQ(book.size(), 0u);
  EXPECT_EQ(book.units(), 0);
}

TEST(Asks, GosDieWithTheirConnectionOrTheirTimeout) {
  master::asks book(10);
  book.open(1, "api", "a", 0, 4, 0, 0, 0);
  book.open(2, "api", "a", 0, 6, 0, 0, 0);
  book.open(1, "api", "b", 1, 1, 5'000'000, 0, 5'000'000);
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
  EXPECT_TRUE(book.open(1, "api", "a", 0, 1, 0, 0, 0));
  EXPECT_TRUE(book.open(1, "api", "a", 1, 1, 0, 0, 0)) << "more GOs of a held identifier are kept";
  EXPECT_FALSE(book.open(1, "api", "b", 2, 1, 0, 0, 0));
}

// The GOs open for an identifier, as uses at the times their requests are
// expected to go, in time order.
TEST(Asks, PendingUsesAreInTimeOrder) {
  master::asks book(10);
  book.open(1, "api", "k", 1, 5, 0, 300'000, 300'000);
  book.open(2, "api", "k", 1, 7, 10, 0, 120'000);
  book.open(1, "api", "j", 2, 9, 10, 0, 10);
  std::vector<rules::event> out{{rules::event_kind::rejected, 1, 1}};
  book.pending("api", "k", out);
  ASSERT_EQ(out.size(), 2u) << "replaced, and only this identifier's";
  EXPECT_EQ(out[0].at_us, 120'000);
  EXPECT_EQ(out[0].cost, 7);
  EXPECT_EQ(out[0].kind, rules::event_kind::accepted);
  EXPECT_EQ(out[1].at_us, 300'000);
  book.pending("api", "none", out);
  EXPECT_TRUE(out.empty());
}

// A connection's lag is learnt from the requests that went on a GO's arrival:
// the largest lately, fading slowly; a GO that waited for its time teaches nothing.
TEST(Asks, ALagIsLearntFromTheRequestsThatWent) {
  master::asks book(10);
  EXPECT_EQ(book.lag_us(1), 0) << "none seen";
  book.open(1, "api", "k", 1, 1, 1'000'000, 0, 1'000'000);
  book.settle(1, "api", "k", 1, 1'100'000);
  EXPECT_EQ(book.lag_us(1), 100'000) << "a GO for now, gone 100 ms after";
  EXPECT_EQ(book.lag_us(2), 0) << "per connection";
  book.open(1, "api", "k", 2, 1, 2'000'000, 0, 2'100'000);
  book.settle(1, "api", "k", 2, 2'020'000);
  EXPECT_EQ(book.lag_us(1), 100'000 - 80'000 / 16) << "a smaller one fades it by a sixteenth of the difference";
  const std::int64_t before = book.lag_us(1);
  book.open(1, "api", "k", 3, 1, 3'000'000, 3'500'000, 3'500'000);
  book.settle(1, "api", "k", 3, 3'500'000);
  EXPECT_EQ(book.lag_us(1), before) << "went at its time: the answer came sooner, by how much unknown";
  book.open(1, "api", "k", 4, 1, 4'000'000, 4'050'000, 4'050'000);
  book.settle(1, "api", "k", 4, 4'300'000);
  EXPECT_EQ(book.lag_us(1), 300'000) << "went after its time: the answer's way";
  book.open(1, "api", "k", 5, 1, 5'000'000, 0, 5'000'000);
  book.settle(1, "api", "k", 5, 9'000'000);
  EXPECT_EQ(book.lag_us(1), master::asks::k_max_lag_us) << "bounded";
  book.peer_closed(1);
  EXPECT_EQ(book.lag_us(1), 0) << "forgotten with its connection";
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
    // A time (a wait, a GO for later) is told to every gatekeeper as a
    // DELAY_UNTIL; nothing else is (nor a GO that waits only for GOs on their way).
    if (published_ != 0 || out.verdict != wire::verdict_kind::go) {
      EXPECT_EQ(published_, out.at_ms);
    }
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

// Requests that may wait queue behind each other past the burst, each GO'd
// for its own time (asked once), until their max_delay is used up.
TEST_F(IngestAsks, GosForLaterQueuePastTheBurst) {
  EXPECT_EQ(ask(1, 1, 10).verdict, wire::verdict_kind::go);
  for (int i = 0; i < 4; ++i) {
    const auto a = ask(1 + i % 2, 10 + i, 5, 2000);
    EXPECT_EQ(a.verdict, wire::verdict_kind::go) << i;
    EXPECT_EQ(a.at_ms, clock_.wall_ms() + 500 * (i + 1)) << i << ": five intervals after the one before";
  }
  EXPECT_EQ(in_.ask_book().open_units("api", "k"), 30) << "more than the burst, each at its own time";
  const auto w = ask(1, 20, 5, 2000);
  EXPECT_EQ(w.verdict, wire::verdict_kind::wait) << "past its max_delay: the time it would fit";
  EXPECT_EQ(w.at_ms, clock_.wall_ms() + 2500);
}

// A GO for now is counted from when its request goes, a round trip's half
// later at a far gatekeeper: the units its rules give back start from then.
TEST_F(IngestAsks, AGoForNowCountsFromWhenItsRequestGoes) {
  // Connection 1 is 100 ms from here: its request went 100 ms after its GO.
  EXPECT_EQ(ask(1, 1, 1, 0, "probe").verdict, wire::verdict_kind::go);
  clock_.advance(std::chrono::milliseconds(100));
  went(1, 1, 1, "probe");
  ASSERT_EQ(in_.ask_book().lag_us(1), 100'000);
  // A fresh client's burst, through it: it goes 100 ms from now.
  EXPECT_EQ(ask(1, 2, 10).verdict, wire::verdict_kind::go);
  const auto next = ask(2, 1, 1, 1000);
  EXPECT_EQ(next.verdict, wire::verdict_kind::go);
  EXPECT_EQ(next.at_ms, clock_.wall_ms() + 200) << "one interval after the burst goes, not after its GO";
  EXPECT_EQ(published_, next.at_ms) << "held by the rules: every gatekeeper is told";
  // A client under its limit, twice through the far connection: the second
  // goes behind the first, when the answer arrives anyway; nobody is told to hold it.
  EXPECT_EQ(ask(1, 3, 1, 1000, "calm").verdict, wire::verdict_kind::go);
  const auto calm = ask(1, 4, 1, 1000, "calm");
  EXPECT_EQ(calm.verdict, wire::verdict_kind::go);
  EXPECT_EQ(calm.at_ms, clock_.wall_ms() + 100) << "behind the first (not before its units are counted)";
  EXPECT_EQ(published_, 0) << "not throttled";
  // And through a near connection: its answer arrives sooner; it waits its
  // place behind the first two, still not held by the rules.
  const auto near = ask(2, 2, 1, 1000, "calm");
  EXPECT_EQ(near.at_ms, clock_.wall_ms() + 100);
  EXPECT_EQ(published_, 0) << "not throttled";
}
