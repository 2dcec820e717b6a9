// The master's decisions without sockets: accounting frames in, the
// DELAY_UNTIL to publish out, every refusal counted.
#include <gtest/gtest.h>

#include "master/engine/ingest.hpp"
#include "master/server/status.hpp"

#include <nlohmann/json.hpp>

using namespace smockron;
using namespace std::string_literals;

namespace {

config::master_config two_domains() {
  auto r = config::load_string(R"(
[master]
[master.domains.api]
rules = [ { rate = "10/s", burst = 2 } ]
[master.domains.slow]
rules = [ { rate = "1/s", burst = 1 } ]
)",
                               "test");
  return *r.cfg->master;
}

class Ingest : public ::testing::Test {
protected:
  Ingest() : cfg_(two_domains()), ingest_(cfg_, clock_, registry_) {}

  std::optional<wire::delay_until> handle(std::vector<std::string> frames, std::uint64_t peer = 0,
                                          std::uint64_t gatekeeper = 0) {
    std::vector<std::string_view> v(frames.begin(), frames.end());
    kept_ = std::move(frames);  // the result views into them
    return ingest_.handle(v, false, clock_.wall_us(), peer, gatekeeper);
  }
  std::string ms(std::int64_t offset) const { return std::to_string(clock_.wall_ms() + offset); }

  manual_clock clock_;
  metrics::registry registry_;
  config::master_config cfg_;
  master::ingest ingest_;
  std::vector<std::string> kept_;
};

TEST_F(Ingest, ThrottledClientsGetDelayUntilOthersNothing) {
  EXPECT_FALSE(handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}));
  const auto d = handle({"api\0"s, "ACCEPTED", "k", ms(0), ""});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->domain, "api");
  EXPECT_EQ(d->identifier, "k");
  EXPECT_EQ(d->next_ms, clock_.wall_ms() + 100);
  EXPECT_EQ(d->interval_ms, 100);
  EXPECT_FALSE(handle({"api\0"s, "ACCEPTED", "other", ms(0), ""})) << "identifiers are apart";
  EXPECT_EQ(ingest_.states().tracked(), 2u);
}

// Pace share (pace_share.hpp): a held client's DELAY_UNTIL carries the
// rule's interval times the gatekeepers whose uses and reservations left it
// held (an effective number: (sum n)^2 / sum n^2 of their messages in the
// last second), told apart by the name their connections give, not by the
// connections.
class IngestPaceShare : public Ingest {
protected:
  IngestPaceShare() {
    cfg_.pace_share = true;
    for (auto& d : cfg_.domains) d.algorithm = config::algorithm_kind::gcra;
    ingest_.reconfigure(cfg_);
  }
};

// An exactly logged rule's next allowed time never goes back to a slot a
// share left free (ingest.cpp): its gatekeepers pace at the rule's
// interval. A counted one (a burst over k_exact_burst) has an arrival time,
// as GCRA: shared.
TEST_F(Ingest, AnExactlyLoggedRuleIsNotShared) {
  cfg_.pace_share = true;
  ingest_.reconfigure(cfg_);
  handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}, 1, 0xa00);
  EXPECT_EQ(handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}, 1, 0xa00)->interval_ms, 100);
  EXPECT_EQ(handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}, 3, 0xb00)->interval_ms, 100);
  EXPECT_NE(registry_.render().find("smockron_master_paced_identifiers 0\n"), std::string::npos);

  cfg_.domains[0].rules[0].burst = rules::k_exact_burst + 1;
  ingest_.reconfigure(cfg_);
  const auto use = [&](std::uint64_t peer, std::uint64_t gk) {
    return handle({"api\0"s, "ACCEPTED", "c", ms(0), "", "cost=" + std::to_string(rules::k_exact_burst)}, peer, gk);
  };
  EXPECT_FALSE(use(1, 0xa00));
  EXPECT_EQ(use(1, 0xa00)->interval_ms, 100);
  EXPECT_EQ(use(3, 0xb00)->interval_ms, 200) << "two gatekeepers alike: each paces half the rate";
}

TEST_F(Ingest, WithoutPaceShareTheIntervalIsTheRules) {
  cfg_.pace_share = false;
  ingest_.reconfigure(cfg_);
  handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}, 1, 0xa00);
  EXPECT_EQ(handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}, 1, 0xa00)->interval_ms, 100);
  EXPECT_EQ(handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}, 3, 0xb00)->interval_ms, 100);
}

TEST_F(IngestPaceShare, AHeldClientsIntervalIsSharedByItsGatekeepers) {
  const auto use = [&](std::uint64_t peer, std::uint64_t gk) {
    return handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}, peer, gk);
  };
  EXPECT_FALSE(use(1, 0xa00));  // the burst (2)
  EXPECT_EQ(use(1, 0xa00)->interval_ms, 100);
  EXPECT_EQ(use(2, 0xa00)->interval_ms, 100) << "a second connection of the same gatekeeper (another worker)";
  EXPECT_EQ(use(3, 0xb00)->interval_ms, 180) << "a second gatekeeper, 2 messages and 1: (2 + 1)^2 / 5";
  EXPECT_EQ(use(3, 0xb00)->interval_ms, 200) << "alike: each paces half the rate";
  EXPECT_EQ(use(4, 0)->interval_ms, 200) << "a connection that names none (an older proxy's worker) is not counted";
  // Refusals follow demand, not pacing, and a correction is not a request: neither counts.
  const auto refused = handle({"api\0"s, "REJECTED", "k", ms(0), ""}, 6, 0xc00);
  if (refused) {
    EXPECT_EQ(refused->interval_ms, 200);
  }
  const auto corrected = handle({"api\0"s, "REJECTED", "k", ms(0), "", "adjust=1"}, 6, 0xc00);
  ASSERT_TRUE(corrected);
  EXPECT_EQ(corrected->interval_ms, 200);
  EXPECT_EQ(handle({"api\0"s, "DELAYED", "k", ms(0), ms(900), ""}, 6, 0xc00)->interval_ms, 278)
      << "a reservation counts: (2 + 2 + 1)^2 / 9";
  EXPECT_EQ(handle({"api\0"s, "ACCEPTED", "j", ms(0), ""}, 3, 0xb00), std::nullopt);
  EXPECT_EQ(handle({"api\0"s, "ACCEPTED", "j", ms(0), ""}, 3, 0xb00)->interval_ms, 100) << "clients are apart";
  // Gatekeepers silent for two windows no longer count, and the sweep forgets a silent client.
  clock_.advance(std::chrono::milliseconds(2'500));
  EXPECT_FALSE(use(1, 0xa00)) << "its debt paid back";
  ASSERT_TRUE(use(1, 0xa00));
  EXPECT_EQ(use(1, 0xa00)->interval_ms, 100);
  ingest_.sweep(clock_.wall_us());
  EXPECT_NE(registry_.render().find("smockron_master_paced_identifiers 1\n"), std::string::npos)
      << "the sweep forgot j";
}

// A gatekeeper whose last connection closed (a proxy killed or restarted:
// it comes back under a new name) no longer counts at once, not after the
// two windows its messages would take to age out: the others pace at the
// whole rate again.
TEST_F(IngestPaceShare, AGatekeeperGoneWithItsLastConnectionNoLongerCounts) {
  const auto use = [&](std::uint64_t peer, std::uint64_t gk) {
    return handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}, peer, gk);
  };
  EXPECT_FALSE(use(1, 0xa00));  // the burst (2)
  ASSERT_TRUE(use(1, 0xa00));
  EXPECT_EQ(use(3, 0xb00)->interval_ms, 200);
  ingest_.peer_closed(2, clock_.wall_us());  // another connection, no gatekeeper gone
  EXPECT_EQ(use(1, 0xa00)->interval_ms, 180) << "2 messages and 1: (2 + 1)^2 / 5";
  ingest_.peer_closed(3, clock_.wall_us(), 0xb00);
  EXPECT_EQ(use(1, 0xa00)->interval_ms, 100) << "b is gone: a alone holds k";
  ingest_.peer_closed(1, clock_.wall_us(), 0xa00);
  EXPECT_NE(registry_.render().find("smockron_master_paced_identifiers 0\n"), std::string::npos)
      << "no gatekeeper holds k";
}

TEST_F(Ingest, RefusalsAreCountedByReason) {
  EXPECT_FALSE(handle({"api\0"s, "ACCEPTED", "k", "soon", ""}));
  EXPECT_FALSE(handle({"nobody\0"s, "ACCEPTED", "k", ms(0), ""}));
  std::vector<std::string_view> one = {"api\0"s};
  EXPECT_FALSE(ingest_.handle(one, true, clock_.wall_us())) << "a truncated message is malformed";
  const auto text = registry_.render();
  EXPECT_NE(text.find("smockron_master_decode_errors_total{reason=\"timestamp_not_numeric\"} 1"), std::string::npos);
  EXPECT_NE(text.find("smockron_master_decode_errors_total{reason=\"frame_count\"} 1"), std::string::npos);
  EXPECT_NE(text.find("smockron_master_unknown_domain_total 1"), std::string::npos);
  EXPECT_EQ(ingest_.states().tracked(), 0u);
}

TEST_F(Ingest, ReconfigureKeepsStatesOfDomainsThatStay) {
  handle({"api\0"s, "ACCEPTED", "k", ms(0), ""});
  auto next = cfg_;
  next.domains.erase(next.domains.begin() + 1);  // drop "slow"
  auto extra = next.domains[0];
  extra.name = "new";
  next.domains.push_back(extra);
  const auto changes = ingest_.reconfigure(next);
  EXPECT_EQ(changes.added, std::vector<std::string>{"new"});
  EXPECT_EQ(changes.removed, std::vector<std::string>{"slow"});
  EXPECT_TRUE(ingest_.find("new"));
  EXPECT_FALSE(ingest_.find("slow"));
  EXPECT_TRUE(handle({"api\0"s, "ACCEPTED", "k", ms(0), ""})) << "the first use was kept: the second throttles";
}

TEST_F(Ingest, SweepExpiresIdleStates) {
  handle({"slow\0"s, "ACCEPTED", "k", ms(0), ""});
  EXPECT_EQ(ingest_.states().tracked(), 1u);
  clock_.advance(std::chrono::seconds(10));
  ingest_.sweep(clock_.wall_us());
  EXPECT_EQ(ingest_.states().tracked(), 0u);
  EXPECT_NE(registry_.render().find("smockron_master_expirations_total 1"), std::string::npos);
}

}  // namespace

// /status/DOMAIN/IDENTIFIER: rules, recorded uses and the throttle, from a state.
TEST(IdentifierStatus, RulesUsesAndThrottle) {
  smockron::rules::limits l;
  l.rules = {{100'000, 2}};  // 10/s burst 2
  smockron::rules::state st;
  const std::int64_t now = 1'700'000'000'000'000;
  st.times = {now - 50'000, now - 10'000};
  auto doc = nlohmann::json::parse(smockron::master::identifier_status_json("api", "k\xff", l, false, &st, now));
  EXPECT_EQ(doc["identifier"], "k\xef\xbf\xbd") << "invalid UTF-8 replaced, never thrown";
  EXPECT_EQ(doc["algorithm"], "sliding-log");
  EXPECT_EQ(doc["rules"][0]["interval_ms"], 100.0);
  EXPECT_EQ(doc["uses_ms"], nlohmann::json::array({(now - 50'000) / 1000, (now - 10'000) / 1000}));
  EXPECT_TRUE(doc["throttled"]);
  EXPECT_EQ(doc["next_allowed_ms"], (now + 100'000) / 1000) << "the spec's max(now, last) + 1/rate";
  doc = nlohmann::json::parse(smockron::master::identifier_status_json("api", "new", l, false, nullptr, now));
  EXPECT_FALSE(doc["tracked"]);
  EXPECT_FALSE(doc["throttled"]);
  EXPECT_FALSE(doc.contains("next_allowed_ms"));
}

// The query protocol's over_limit is a use in the same state as the
// gatekeepers' accounting; get_stats and get_size report on it.
TEST_F(Ingest, QueriesShareTheLimitWithAccounting) {
  struct asked {
    std::string answer;
    std::optional<wire::delay_until> publish;
  };
  const auto ask = [&](std::string_view datagram) -> std::optional<asked> {
    const auto parsed = query::parse(datagram);
    EXPECT_TRUE(parsed.req) << datagram;
    std::string out;
    const auto r = ingest_.answer(*parsed.req, clock_.wall_us(), out);
    if (!r.answered) return std::nullopt;
    return asked{out, r.publish};
  };
  // One HTTP use of "k" (api: 10/s burst 2), then the UDP uses.
  EXPECT_FALSE(handle({"api\0"s, "ACCEPTED", "k", ms(0), ""}));
  auto a = ask("7 over_limit api k");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->answer, "7 ok N 2.0 2.0 1") << "the second use of the burst of 2, in a 200 ms window (1 s, rounded up)";
  ASSERT_TRUE(a->publish) << "the burst is used up: gatekeepers hold k's HTTP requests too";
  EXPECT_EQ(a->publish->identifier, "k");
  EXPECT_EQ(a->publish->next_ms, clock_.wall_ms() + 100);
  a = ask("8 over_limit api k");
  EXPECT_EQ(a->answer, "8 ok Y 2.0 2.0 1");
  EXPECT_FALSE(a->publish) << "over the limit: nothing recorded";
  // A REJECTED from a gatekeeper counts as over too.
  handle({"api\0"s, "REJECTED", "k", ms(0), ""});
  EXPECT_EQ(ask("get_stats api k")->answer, "n_req=4 n_over=2 last_max_rate=2 key=api k");
  EXPECT_EQ(ask("get_stats api nobody")->answer, "n_req=0 n_over=0 last_max_rate=0 key=api nobody");
  clock_.advance(std::chrono::milliseconds(250));  // past the window: this use is the only one in it
  EXPECT_EQ(ask("over_limit api k")->answer, "ok N 1.0 2.0 1");
  EXPECT_TRUE(ask("9 get_size")->answer.starts_with("9 size="));
  EXPECT_TRUE(ask("get_size")->answer.ends_with(" keys=1"));
  EXPECT_FALSE(ask("over_limit nope k")) << "a domain this master does not own: ignored";
  const std::string m = registry_.render();
  EXPECT_NE(m.find("smockron_master_query_ignored_total{reason=\"unknown_domain\"} 1"), std::string::npos);
  EXPECT_NE(m.find("smockron_master_queries_total{command=\"over_limit\"} 3"), std::string::npos);
}

// LEASE messages go to the lease book under the identifier's concurrency rule
// (an override's own), and their GRANTs come out once per turn; a closed
// connection frees its slots for the one waiting.
TEST(IngestLeases, LeasesFollowTheConcurrencyRules) {
  auto r = config::load_string(R"(
[master]
[master.domains.llm]
rules = [ { concurrency = 2 } ]
overrides = [ { identifier = "batch", rules = [ { concurrency = 5 } ] } ]
)",
                               "test");
  ASSERT_TRUE(r.cfg);
  manual_clock clock;
  metrics::registry reg;
  master::ingest in(*r.cfg->master, clock, reg);
  const auto lease = [&](std::uint64_t peer, const std::string& id, const std::string& numbers) {
    const std::vector<std::string> f{"llm\0"s, "LEASE", id, numbers};
    const std::vector<std::string_view> v(f.begin(), f.end());
    EXPECT_FALSE(in.handle(v, false, clock.wall_us(), peer));
  };
  std::vector<wire::grant> out;
  std::vector<std::string> names;  // the grants' views outlive take_grants in these
  const auto take = [&] {
    out.clear();
    in.take_grants([&](const wire::grant& g) {
      out.push_back(g);
      names.emplace_back(g.identifier);
    });
  };
  lease(1, "k", "0000000000000001 9 0 0");
  lease(1, "batch", "0000000000000001 9 0 0");
  take();
  ASSERT_EQ(out.size(), 2u);
  for (const auto& g : out) EXPECT_EQ(g.held, g.identifier == "batch" ? 5 : 2);
  lease(2, "k", "0000000000000002 1 0 0");  // waits: the first holder is asked down to its share
  take();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].holder, 1u);
  EXPECT_EQ(out[0].cap, 1);
  EXPECT_EQ(in.lease_book().held(), 7);
  in.peer_closed(1, clock.wall_us());
  take();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].holder, 2u);
  EXPECT_EQ(out[0].held, 1);
  EXPECT_EQ(in.lease_book().held(), 1);
  // Malformed and unknown-domain LEASEs are counted, never kept.
  lease(3, "k", "1 2 3");
  const std::vector<std::string> other{"nobody\0"s, "LEASE", "k", "0000000000000003 1 0 0"};
  const std::vector<std::string_view> v(other.begin(), other.end());
  in.handle(v, false, clock.wall_us(), 3);
  take();
  EXPECT_TRUE(out.empty());
  const std::string text = reg.render();
  EXPECT_NE(text.find("smockron_master_decode_errors_total{reason=\"lease_invalid\"} 1"), std::string::npos);
  EXPECT_NE(text.find("smockron_master_lease_slots_released_total 7"), std::string::npos);
  EXPECT_NE(text.find("smockron_master_lease_slots_held 1"), std::string::npos);
}

// A request's tier (its accounting message's "tier=NAME") selects the rules
// its identifier is judged by: the tier's, an override's before it, the
// domain's for no tier or an unknown one. A change of tier takes effect with
// the first message that names the new one; a reload keeps each identifier
// with its tier.
TEST(IngestTiers, TheTierAMessageNamesSelectsTheRules) {
  const std::string text = R"(
[master]
[master.domains.api]
rules = [ { rate = "1/s", burst = 1 } ]
overrides = [ { identifier = "vip", rules = [ { rate = "1/s", burst = 5 } ] } ]
[master.domains.api.tiers.pro]
rules = [ { rate = "1/s", burst = 3 } ]
[master.domains.api.tiers.free]
rules = [ { rate = "1/s", burst = 2 }, { rate = "100/d", burst = 100 } ]
)";
  auto r = config::load_string(text, "test");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : config::format(r.errors[0]));
  manual_clock clock;
  metrics::registry reg;
  master::ingest in(*r.cfg->master, clock, reg);
  // How many uses at one instant follow the first before the master says
  // wait (it says so with the use that reaches the burst).
  const auto burst = [&](const std::string& id, const std::string& loginfo) {
    for (int n = 1; n <= 10; ++n) {
      std::vector<std::string> f{"api\0"s, "ACCEPTED", id, std::to_string(clock.wall_ms()), ""};
      if (!loginfo.empty()) f.push_back(loginfo);
      const std::vector<std::string_view> v(f.begin(), f.end());
      if (in.handle(v, false, clock.wall_us())) return n - 1;
    }
    return 10;
  };
  EXPECT_EQ(burst("a", ""), 0);                  // no tier: the domain's rules (burst 1)
  EXPECT_EQ(burst("b", "tier=pro"), 2);          // pro (burst 3)
  EXPECT_EQ(burst("c", "cost=1 tier=gold"), 0);  // a tier the domain does not have: the domain's
  EXPECT_EQ(burst("vip", "tier=pro"), 4);        // an override before the tier (burst 5)
  EXPECT_EQ(&in.states().current_limits(0, "b"), in.states().limits(0).find_tier("pro"));
  // The client's plan changes: its next message judges it by the new tier.
  // Rules of the same shape (one rule each): its use is kept (afresh: 2).
  EXPECT_EQ(burst("a", "tier=pro"), 1);
  // Another shape (free has two rules): it starts afresh (kept: 0).
  EXPECT_EQ(burst("b", "tier=free"), 1);
  EXPECT_EQ(&in.states().current_limits(0, "b"), in.states().limits(0).find_tier("free"));
  // A reload keeps it with its tier by name.
  auto again = config::load_string(text, "test");
  in.reconfigure(*again.cfg->master);
  EXPECT_EQ(&in.states().current_limits(0, "b"), in.states().limits(0).find_tier("free"));
  EXPECT_EQ(in.states().limits(0).tier_of(&in.states().current_limits(0, "b")), "free");
  // Refusals keep the tier in force; a use with no tier goes back to the domain's.
  const std::vector<std::string> rej{"api\0"s, "REJECTED", "b", std::to_string(clock.wall_ms()), ""};
  in.handle(std::vector<std::string_view>(rej.begin(), rej.end()), false, clock.wall_us());
  EXPECT_EQ(in.states().limits(0).tier_of(&in.states().current_limits(0, "b")), "free");
  clock.advance(std::chrono::seconds(10));
  EXPECT_EQ(burst("b", ""), 0);
  // A malformed tier is refused and counted.
  const std::vector<std::string> bad{"api\0"s, "ACCEPTED", "d", std::to_string(clock.wall_ms()), "", "tier=a/b"};
  EXPECT_FALSE(in.handle(std::vector<std::string_view>(bad.begin(), bad.end()), false, clock.wall_us()));
  EXPECT_NE(reg.render().find("smockron_master_decode_errors_total{reason=\"tier_invalid\"} 1"), std::string::npos);
}

// A LEASE naming a tier is granted up to that tier's concurrency limit.
TEST(IngestTiers, ALeaseIsLimitedByItsTier) {
  auto r = config::load_string(R"(
[master]
[master.domains.llm]
rules = [ { concurrency = 1 } ]
[master.domains.llm.tiers.pro]
rules = [ { concurrency = 4 } ]
)",
                               "test");
  ASSERT_TRUE(r.cfg);
  manual_clock clock;
  metrics::registry reg;
  master::ingest in(*r.cfg->master, clock, reg);
  const auto lease = [&](const std::string& id, const std::string& tier) {
    std::vector<std::string> f{"llm\0"s, "LEASE", id, "0000000000000001 9 0 0"};
    if (!tier.empty()) f.push_back(tier);
    in.handle(std::vector<std::string_view>(f.begin(), f.end()), false, clock.wall_us(), 1);
    std::int64_t held = -1;
    in.take_grants([&](const wire::grant& g) { held = g.held; });
    return held;
  };
  EXPECT_EQ(lease("a", ""), 1);
  EXPECT_EQ(lease("b", "pro"), 4);
  EXPECT_EQ(lease("c", "gold"), 1);
}

// The DELAY_UNTIL of a client with several limits says which one set it (a
// LIMIT message goes with it): a rule by its place in the client's POLICY, a
// quota by its place in QUOTA, a share with its rate. One limit: nothing to name.
TEST(IngestLimits, TheLimitThatSetTheTimeIsNamed) {
  auto r = config::load_string(R"(
[master]
[master.domains.one]
rules = [ { rate = "10/s", burst = 2 } ]
[master.domains.two]
rules = [ { rate = "100/s", burst = 5 }, { rate = "1/s", burst = 2 } ]
[master.domains.quota]
rules = [ { rate = "100/s", burst = 100 }, { quota = 3, per = "day" } ]
overrides = [ { identifier = "vip", rules = [ { rate = "100/s", burst = 100 }, { quota = 5, per = "day" } ] } ]
[master.domains.wide]
rules = [ { rate = "1/d", burst = 1000000 }, { rate = "100/s", burst = 50 }, { rate = "1/s", burst = 2 } ]
[master.domains.pool]
rules = [ { rate = "100/s", burst = 100 } ]
shared = [ { rate = "10/s", burst = 10 } ]
)",
                               "test");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : config::format(r.errors[0]));
  manual_clock clock;
  metrics::registry reg;
  master::ingest in(*r.cfg->master, clock, reg);
  // The first DELAY_UNTIL for `id` in `domain`, uses at one instant.
  std::vector<std::string> kept;
  const auto first_delay = [&](const std::string& domain, const std::string& id) -> std::optional<wire::delay_until> {
    for (int n = 0; n < 50; ++n) {
      kept = {domain + '\0', "ACCEPTED", id, std::to_string(clock.wall_ms()), ""};
      const std::vector<std::string_view> v(kept.begin(), kept.end());
      if (auto d = in.handle(v, false, clock.wall_us())) return d;
    }
    return std::nullopt;
  };
  using kind = wire::limit_ref::kind;
  const auto named = [&](const std::string& domain, const std::string& id) {
    const auto d = first_delay(domain, id);
    EXPECT_TRUE(d) << domain;
    return d ? d->limit : wire::limit_ref{};
  };
  const auto rule_or_quota = [](const wire::limit_ref& l) { return std::pair{l.by, int{l.index}}; };
  EXPECT_EQ(named("one", "a").by, kind::none) << "one limit: a refusal names it untold";
  EXPECT_EQ(rule_or_quota(named("two", "a")), std::pair(kind::rule, 1)) << "the second rule (burst 2) binds first";
  EXPECT_EQ(rule_or_quota(named("quota", "a")), std::pair(kind::quota, 0));
  EXPECT_EQ(named("quota", "vip").by, kind::none) << "an override's quotas are not published: nothing to name";
  // The first rule's window is past POLICY's bound: gatekeepers do not have
  // it, and the third rule is their second.
  EXPECT_EQ(rule_or_quota(named("wide", "a")), std::pair(kind::rule, 1));
  const auto share = named("pool", "a");
  EXPECT_EQ(share.by, kind::share);
  EXPECT_GE(share.share_burst, 1);
  EXPECT_LE(share.share_burst, 10) << "a part of the shared burst";
  EXPECT_TRUE(wire::policy_fits(share.share_interval_us, share.share_burst));
}
