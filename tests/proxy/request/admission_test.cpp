// Admission on a manual clock: identification, fail_closed, the gate's
// verdicts, their counters, and what is accounted to the masters.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include "proxy/request/admission.hpp"
#include "shared/base/clock.hpp"

using namespace smockron;
using namespace smockron::proxy;
using namespace std::string_literals;

namespace {

// `routes`: routes tried before the catch-all one.
config::proxy_config make_config(bool fail_closed, std::string_view unidentified = "shared",
                                 std::string_view routes = "") {
  auto r = config::load_string(std::string(R"(
[proxy]
accounting = []
control = []
)") + (fail_closed ? "fail_closed = true\n" : "") +
                                   R"(
[proxy.upstreams.app]
servers = ["127.0.0.1:1"]
)" + std::string(routes) + R"(
[[proxy.routes]]
path = "/"
domain = "api"
upstream = "app"
identify = ["header:X-Key"]
unidentified = ")" + std::string(unidentified) +
                                   "\"\n",
                               "t");
  EXPECT_TRUE(r.cfg) << r.errors.front().message;
  return *r.cfg->proxy;
}

class Admission : public ::testing::Test {
protected:
  explicit Admission(bool fail_closed = false, std::string_view unidentified = "shared", std::string_view routes = "")
      : rt_(make_config(fail_closed, unidentified, routes), domains_, metrics_, 0),
        sender_(ioc_, {}, 100, counters_),
        env_{gate_, metrics_, sender_} {}

  admission admit_with(std::string head) {
    head_ = std::move(head);
    EXPECT_EQ(http1::parse_request(head_, 8192, req_).status, http1::parse_status::complete);
    const route* r = rt_.routes.match(req_.host, req_.target);
    route_ = r;
    return admit(env_, rt_, *r, req_, *parse_ip(peer_), clock_.wall_us());
  }
  double metric(const std::string& line) const {
    const std::string text = registry_.render();
    const auto at = text.find("\n" + line + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size() + 2));
  }
  double decisions(std::string_view d) const {
    return metric("smockron_proxy_requests_total{domain=\"api\",decision=\"" + std::string(d) + "\"}");
  }

  manual_clock clock_;
  metrics::registry registry_;
  proxy_metrics metrics_{registry_};
  domain_registry domains_;
  gate gate_;
  runtime rt_;
  boost::asio::io_context ioc_;
  accounting_sender::counters counters_{registry_};
  accounting_sender sender_;
  admission_env env_;
  std::string head_;
  http1::request_head req_;
  const route* route_ = nullptr;
  std::string peer_ = "10.0.0.1";
};

TEST_F(Admission, UnidentifiedRequestsShareOneIdentifierByDefault) {
  auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::accepted);
  ASSERT_TRUE(a.who);
  EXPECT_EQ(a.who->value, k_shared_identifier);
  EXPECT_EQ(metric("smockron_proxy_unidentified_total{action=\"shared\"}"), 1);
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), k_shared_identifier, now + 60'000'000, 100'000, now);
  a = admit_with("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected) << "all of them are limited together";
  EXPECT_EQ(admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k9\r\n\r\n").outcome, decision::accepted);
}

class RejectUnidentified : public Admission {
protected:
  RejectUnidentified() : Admission(false, "reject") {}
};

TEST_F(RejectUnidentified, AreRefused) {
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected);
  EXPECT_TRUE(a.unidentified);
  EXPECT_EQ(metric("smockron_proxy_rejects_total{reason=\"unidentified\"}"), 1);
  EXPECT_EQ(metric("smockron_proxy_unidentified_total{action=\"reject\"}"), 1);
}

class AllowUnidentified : public Admission {
protected:
  AllowUnidentified() : Admission(false, "allow") {}
};

TEST_F(AllowUnidentified, PassUnlimitedAndUnaccounted) {
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::unidentified);
  EXPECT_FALSE(a.who);
  EXPECT_EQ(decisions("unidentified"), 1);
  EXPECT_EQ(metric("smockron_proxy_unidentified_total{action=\"allow\"}"), 1);
  sender_.flush();
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 0) << "nothing accounted";
}

TEST_F(Admission, AcceptedIsAccountedInTheBatch) {
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::accepted);
  ASSERT_TRUE(a.who);
  EXPECT_EQ(a.who->value, "k1");
  EXPECT_EQ(decisions("accepted"), 1);
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 0) << "still in the batch";
  sender_.flush();
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 1) << "no master connected: unsent, counted";
}

TEST_F(Admission, DelayedRequestsAreHeldAndReportedAtOnce) {
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), "k1", now + 200'000, 100'000, now);
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::delayed);
  EXPECT_EQ(a.gate.release_us, now + 200'000);
  EXPECT_EQ(gate_.held(), 1);
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 1) << "a reservation leaves at once (no master: unsent)";
  gate_.release_held({});
}

TEST_F(Admission, RequestsBeyondMaxDelayAreRejected) {
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), "k1", now + 60'000'000, 100'000, now);
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected);
  EXPECT_FALSE(a.no_master);
  EXPECT_GE(a.gate.retry_after_s, 55);
  EXPECT_EQ(metric("smockron_proxy_rejects_total{reason=\"delay_too_long\"}"), 1);
  EXPECT_EQ(decisions("rejected"), 1);
}

class FailClosedAdmission : public Admission {
protected:
  FailClosedAdmission() : Admission(true) {}
};

TEST_F(FailClosedAdmission, NoMasterMeansRefusedUntilAPolicyArrives) {
  auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected);
  EXPECT_TRUE(a.no_master);
  EXPECT_EQ(metric("smockron_proxy_rejects_total{reason=\"no_master\"}"), 1);
  gate_.set_policy(domains_.id("api"), {}, clock_.wall_us());
  a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::accepted) << "a master covers the domain";
  clock_.advance(std::chrono::milliseconds(wire::policy_fresh_ms + 1));
  a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_TRUE(a.no_master) << "the policy went stale";
}

class RoutePolicy : public Admission {
protected:
  RoutePolicy()
      : Admission(false, "shared", R"(
[[proxy.routes]]
path = "/healthz"
upstream = "app"
[[proxy.routes]]
path = "/shadow"
domain = "api"
upstream = "app"
identify = ["header:X-Key"]
mode = "shadow"
[[proxy.routes]]
path = "/capped"
domain = "api"
upstream = "app"
identify = ["header:X-Key"]
max_held = 1
max_delay = "100ms"
[[proxy.routes]]
path = "/internal"
domain = "api"
upstream = "app"
identify = ["header:X-Key"]
exempt = ["10.0.0.0/8"]
)") {}
};

TEST_F(RoutePolicy, ARouteWithoutADomainIsExemptAndUnaccounted) {
  const auto a = admit_with("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::exempt);
  EXPECT_FALSE(a.who);
  EXPECT_EQ(metric("smockron_proxy_requests_total{domain=\"\",decision=\"exempt\"}"), 1);
  sender_.flush();
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 0) << "nothing accounted";
}

TEST_F(RoutePolicy, ExemptClientsPassUnlimitedOthersAreLimited) {
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), "k1", now + 60'000'000, 100'000, now);
  EXPECT_EQ(admit_with("GET /internal HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n").outcome, decision::exempt);
  EXPECT_EQ(decisions("exempt"), 1);
  peer_ = "192.0.2.1";
  EXPECT_EQ(admit_with("GET /internal HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n").outcome, decision::rejected);
}

TEST_F(RoutePolicy, ShadowCountsTheWouldBeDecisionAndPassesAsAccepted) {
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), "held", now + 300'000, 100'000, now);
  gate_.update(domains_.id("api"), "over", now + 60'000'000, 100'000, now);
  auto a = admit_with("GET /shadow HTTP/1.1\r\nHost: x\r\nX-Key: held\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::accepted);
  EXPECT_EQ(a.shadow, decision::delayed);
  EXPECT_EQ(gate_.held(), 0) << "nothing is held";
  a = admit_with("GET /shadow HTTP/1.1\r\nHost: x\r\nX-Key: over\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::accepted);
  EXPECT_EQ(a.shadow, decision::rejected);
  a = admit_with("GET /shadow HTTP/1.1\r\nHost: x\r\nX-Key: fresh\r\n\r\n");
  EXPECT_EQ(a.shadow, decision::accepted);
  EXPECT_EQ(metric("smockron_proxy_shadow_decisions_total{domain=\"api\",decision=\"delayed\"}"), 1);
  EXPECT_EQ(metric("smockron_proxy_shadow_decisions_total{domain=\"api\",decision=\"rejected\"}"), 1);
  EXPECT_EQ(metric("smockron_proxy_shadow_decisions_total{domain=\"api\",decision=\"accepted\"}"), 1);
  EXPECT_EQ(metric("smockron_proxy_shadow_delay_seconds_count"), 1);
  EXPECT_EQ(decisions("accepted"), 3) << "what happened: all forwarded";
  sender_.flush();
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 3) << "each accounted (as accepted)";
}

TEST_F(RoutePolicy, ARouteCapsItsOwnHeldRequestsAndMaxDelay) {
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), "a", now + 50'000, 10'000, now);
  gate_.update(domains_.id("api"), "b", now + 50'000, 10'000, now);
  gate_.update(domains_.id("api"), "slow", now + 500'000, 10'000, now);
  auto a = admit_with("GET /capped HTTP/1.1\r\nHost: x\r\nX-Key: a\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::delayed);
  a = admit_with("GET /capped HTTP/1.1\r\nHost: x\r\nX-Key: b\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected);
  EXPECT_EQ(a.gate.reason, reject_reason::held_full) << "the route holds one at most";
  EXPECT_EQ(admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: b\r\n\r\n").outcome, decision::delayed)
      << "other routes are not capped by it";
  gate_.release_held(rt_.route_limits[2]);  // /capped
  gate_.release_held(rt_.route_limits[route_->index]);
  a = admit_with("GET /capped HTTP/1.1\r\nHost: x\r\nX-Key: slow\r\n\r\n");
  EXPECT_EQ(a.gate.reason, reject_reason::delay_too_long) << "500 ms is over the route's max_delay";
  EXPECT_EQ(gate_.held(), 0);
  EXPECT_EQ(rt_.route_held[2].load(), 0);
  EXPECT_EQ(admit_with("GET /capped HTTP/1.1\r\nHost: x\r\nX-Key: b\r\n\r\n").outcome, decision::delayed)
      << "its place is free again";
  gate_.release_held(rt_.route_limits[2]);
}

}  // namespace

// A route's `tier` source names the request's tier: the guard's rules are
// that tier's; a value that is no tier name (or two) names none, counted.
class TierAdmission : public Admission {
protected:
  TierAdmission()
      : Admission(false, "shared", R"(
[[proxy.routes]]
path = "/tiered"
domain = "api"
upstream = "app"
identify = ["header:X-Key"]
tier = "header:X-Plan"
)") {}
};

TEST_F(TierAdmission, TheTierComesFromTheRoutesSourceAndSelectsTheGuardsRules) {
  const auto now = clock_.wall_us();
  const auto api = domains_.id("api");
  ASSERT_TRUE(gate_.set_policy(api, std::vector<guard_rule>{{100'000, 1}}, now));
  ASSERT_TRUE(gate_.set_tier(api, "pro", std::vector<guard_rule>{{100'000, 3}}, now));
  for (int i = 0; i < 3; ++i) {
    const auto a = admit_with("GET /tiered HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nX-Plan: pro\r\n\r\n");
    EXPECT_EQ(a.tier, "pro");
    EXPECT_EQ(a.outcome, decision::accepted) << i;
  }
  EXPECT_EQ(admit_with("GET /tiered HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nX-Plan: pro\r\n\r\n").outcome,
            decision::delayed);
  // No tier: the domain's burst of 1.
  EXPECT_EQ(admit_with("GET /tiered HTTP/1.1\r\nHost: x\r\nX-Key: k2\r\n\r\n").outcome, decision::accepted);
  EXPECT_EQ(admit_with("GET /tiered HTTP/1.1\r\nHost: x\r\nX-Key: k2\r\n\r\n").outcome, decision::delayed);
  // A route without a tier source ignores the field.
  EXPECT_EQ(admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k3\r\nX-Plan: pro\r\n\r\n").tier, "");
  // Not a tier name, or two of them: none, counted.
  EXPECT_EQ(admit_with("GET /tiered HTTP/1.1\r\nHost: x\r\nX-Key: k4\r\nX-Plan: pro plus\r\n\r\n").tier, "");
  EXPECT_EQ(admit_with("GET /tiered HTTP/1.1\r\nHost: x\r\nX-Key: k5\r\nX-Plan: a\r\nX-Plan: b\r\n\r\n").tier, "");
  EXPECT_EQ(metric("smockron_proxy_tier_invalid_total"), 2);
}
