// A route's cost: each source, its bounds and fallbacks (pure functions),
// and what admission accounts for a request whose cost is known now or only
// when it is done.
#include "proxy/request/cost.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include "proxy/request/admission.hpp"
#include "shared/base/clock.hpp"

using namespace smockron;
using namespace smockron::proxy;

namespace {

using kind = config::route_config::cost_source::kind;

route make_route(kind k, std::string field = "", std::int64_t units = 1) {
  route r;
  r.cost.type = k;
  r.cost.field = std::move(field);
  r.cost.units = units;
  r.cost_max = 1'000;
  r.cost_default = 3;
  return r;
}

http1::request_head parse(const std::string& head) {
  static std::string kept;  // the head's views point into it
  kept = head;
  http1::request_head req;
  EXPECT_EQ(http1::parse_request(kept, 8192, req).status, http1::parse_status::complete);
  return req;
}

}  // namespace

TEST(Cost, FieldValues) {
  const route r = make_route(kind::header, "x-cost");
  EXPECT_EQ(cost_of_value(r, "7").units, 7);
  EXPECT_EQ(cost_of_value(r, " 0 ").units, 0);
  EXPECT_EQ(cost_of_value(r, "1000").why, cost_fallback::none);
  // Over cost_max: cost_max, counted.
  EXPECT_EQ(cost_of_value(r, "1001").units, 1'000);
  EXPECT_EQ(cost_of_value(r, "1001").why, cost_fallback::over_max);
  EXPECT_EQ(cost_of_value(r, "99999999999999999999999").why, cost_fallback::over_max);
  // Missing or malformed: cost_default, counted.
  EXPECT_EQ(cost_of_value(r, std::nullopt).units, 3);
  EXPECT_EQ(cost_of_value(r, std::nullopt).why, cost_fallback::missing);
  for (const char* bad : {"", " ", "-1", "+1", "1.5", "1e3", "7 tokens", "0x10", "１"}) {
    EXPECT_EQ(cost_of_value(r, bad).why, cost_fallback::malformed) << bad;
    EXPECT_EQ(cost_of_value(r, bad).units, 3) << bad;
  }
}

TEST(Cost, KnownAtAdmission) {
  EXPECT_EQ(cost_at_admission(make_route(kind::constant, "", 5), parse("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))->units, 5);
  const route header = make_route(kind::header, "x-cost");
  EXPECT_EQ(cost_at_admission(header, parse("GET / HTTP/1.1\r\nHost: a\r\nX-Cost: 12\r\n\r\n"))->units, 12);
  EXPECT_EQ(cost_at_admission(header, parse("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))->why, cost_fallback::missing);
  // Two lines of the field: which would the backend mean? Malformed.
  EXPECT_EQ(cost_at_admission(header, parse("GET / HTTP/1.1\r\nHost: a\r\nX-Cost: 1\r\nx-cost: 900\r\n\r\n"))->why,
            cost_fallback::malformed);
  const route bytes = make_route(kind::request_bytes);
  EXPECT_EQ(cost_at_admission(bytes, parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 300\r\n\r\n"))->units, 300);
  EXPECT_EQ(cost_at_admission(bytes, parse("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))->units, 0);
  EXPECT_EQ(cost_at_admission(bytes, parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n"))->why,
            cost_fallback::over_max);
  // Known only once done: a chunked body's size, a response field.
  EXPECT_FALSE(cost_at_admission(bytes, parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")));
  EXPECT_FALSE(cost_at_admission(make_route(kind::response_header, "x-tokens-used"),
                                 parse("GET / HTTP/1.1\r\nHost: a\r\nX-Tokens-Used: 5\r\n\r\n")));
}

TEST(Cost, KnownWhenDone) {
  const route r = make_route(kind::response_header, "x-tokens-used");
  request_outcome o;
  http1::header_list head;
  head.insert("Content-Type", "text/plain");
  head.insert("X-Tokens-Used", "42");
  note_cost_fields(r, head, o);
  EXPECT_EQ(cost_when_done(r, o).units, 42);
  // In a trailer section as the chunked decoder keeps it.
  request_outcome t;
  note_cost_trailer(r, "X-Checksum: abc\r\nx-tokens-used:  17 \r\n", t);
  EXPECT_EQ(cost_when_done(r, t).units, 17);
  // Twice (head and trailer, or two lines): malformed.
  note_cost_trailer(r, "X-Tokens-Used: 1\r\n", o);
  EXPECT_EQ(cost_when_done(r, o).why, cost_fallback::malformed);
  // None (the upstream failed, or did not say): cost_default.
  EXPECT_EQ(cost_when_done(r, request_outcome{}).why, cost_fallback::missing);
  // The request's body as relayed.
  request_outcome relayed;
  relayed.bytes_in = 640;
  EXPECT_EQ(cost_when_done(make_route(kind::request_bytes), relayed).units, 640);
}

TEST(Cost, ABodyWithoutALengthIsCutOffPastWhatFitsAndChargedThat) {
  request_outcome o;
  EXPECT_FALSE(cut_by_cost(o, 1'000'000)) << "no bound known: nothing is cut";
  o.body_cost_limit = 1000;
  EXPECT_FALSE(cut_by_cost(o, 1000)) << "all that fits";
  EXPECT_FALSE(o.cost_cut);
  EXPECT_TRUE(cut_by_cost(o, 1001));
  EXPECT_TRUE(o.cost_cut);
  // Charged all that fit, however much went upstream before the cut.
  for (const std::uint64_t relayed : {0, 900, 1200}) {
    o.bytes_in = relayed;
    EXPECT_EQ(cost_when_done(make_route(kind::request_bytes), o).units, 1000);
  }
}

namespace {

config::proxy_config cost_config(const std::string& cost) {
  auto r = config::load_string(R"(
[proxy]
accounting = []
control = []
[proxy.upstreams.app]
servers = ["127.0.0.1:1"]
[[proxy.routes]]
path = "/"
domain = "api"
upstream = "app"
identify = ["header:X-Key"]
cost = )" + cost + "\n",
                               "t");
  EXPECT_TRUE(r.cfg) << r.errors.front().message;
  return *r.cfg->proxy;
}

class CostAdmission : public ::testing::TestWithParam<std::string> {
protected:
  CostAdmission()
      : rt_(cost_config(GetParam()), domains_, metrics_, 0),
        sender_(ioc_, {}, 100, counters_),
        env_{gate_, metrics_, sender_} {}

  admission admit_with(const std::string& head) {
    req_ = parse(head);
    return admit(env_, rt_, *rt_.routes.match(req_.host, req_.target), req_, *parse_ip("10.0.0.1"), clock_.wall_us());
  }
  double metric(const std::string& line) const {
    const std::string text = registry_.render();
    const auto at = text.find("\n" + line + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size() + 2));
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
  http1::request_head req_;
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Sources, CostAdmission,
                         ::testing::Values("5", "\"header:X-Cost\"", "\"request_bytes\"",
                                           "\"response_header:X-Tokens-Used\""));

TEST_P(CostAdmission, UnitsAreAccountedNowOrWhenDone) {
  const auto a = admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Cost: 9\r\nContent-Length: 4\r\n\r\n");
  ASSERT_EQ(a.outcome, decision::accepted);
  const bool later = GetParam() == "\"response_header:X-Tokens-Used\"";
  EXPECT_EQ(a.charge_when_done, later);
  // A response-charged request reserves cost_default (1) now.
  const double now_units = GetParam() == "5" ? 5 : GetParam() == "\"header:X-Cost\"" ? 9 : later ? 1 : 4;
  EXPECT_EQ(metric("smockron_proxy_cost_units_total"), now_units);
  if (later) {
    request_outcome o;
    o.cost_field = "250";
    const route& r = *rt_.routes.match(req_.host, req_.target);
    charge_done(env_, rt_, r, a, cost_when_done(r, o), clock_.wall_us());
    EXPECT_EQ(metric("smockron_proxy_cost_units_total"), 250) << "the reservation, then 249 more";
  }
}

class CostEstimate : public CostAdmission {};
INSTANTIATE_TEST_SUITE_P(Estimates, CostEstimate,
                         ::testing::Values("\"response_header:X-Tokens-Used\"\ncost_estimate = \"header:X-Max\""));

TEST_P(CostEstimate, TheEstimateIsReservedAndCorrectedBothWays) {
  const route& r = *rt_.routes.match("x", "/");
  const auto a = admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Max: 300\r\n\r\n");
  ASSERT_EQ(a.outcome, decision::accepted);
  EXPECT_EQ(a.reserved, 300);
  EXPECT_EQ(metric("smockron_proxy_cost_units_total"), 300);
  request_outcome o;
  o.cost_field = "120";
  charge_done(env_, rt_, r, a, cost_when_done(r, o), clock_.wall_us());
  EXPECT_EQ(metric("smockron_proxy_cost_refunded_units_total"), 180);
  // Above the estimate: the difference more.
  const auto b = admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Max: 10\r\n\r\n");
  o.cost_field = "25";
  charge_done(env_, rt_, r, b, cost_when_done(r, o), clock_.wall_us());
  EXPECT_EQ(metric("smockron_proxy_cost_units_total"), 300 + 10 + 15);
  // No cost field at the end (the upstream or the client broke off): the estimate stays.
  const auto c = admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Max: 40\r\n\r\n");
  charge_done(env_, rt_, r, c, cost_when_done(r, request_outcome{}), clock_.wall_us());
  EXPECT_EQ(metric("smockron_proxy_cost_units_total"), 300 + 10 + 15 + 40);
  EXPECT_EQ(metric("smockron_proxy_cost_refunded_units_total"), 180);
  // No estimate field: cost_default (1).
  EXPECT_EQ(admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\n\r\n").reserved, 1);
}

TEST_P(CostEstimate, AnEstimateOverTheBurstIsRefusedAtOnceAndChargesNothing) {
  const std::vector<guard_rule> rules{{600'000, 100}};  // 100/min burst 100
  gate_.set_policy(rt_.gate_domain[0], rules, clock_.wall_us());
  const auto a = admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Max: 101\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected);
  EXPECT_EQ(a.gate.reason, reject_reason::cost_over_limit);
  EXPECT_FALSE(a.charge_when_done);
  EXPECT_EQ(metric("smockron_proxy_rejects_total{reason=\"cost_over_limit\"}"), 1);
  EXPECT_EQ(metric("smockron_proxy_cost_units_total"), 0);
  // The client's standing is untouched: its whole burst is there.
  EXPECT_EQ(admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Max: 100\r\n\r\n").outcome, decision::accepted);
  EXPECT_EQ(admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Max: 1\r\n\r\n").outcome, decision::delayed);
}

TEST_P(CostAdmission, AMissingCostIsChargedAsCostDefaultAndCounted) {
  if (GetParam() != "\"header:X-Cost\"") GTEST_SKIP() << "the request field's own case";
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\n\r\n");
  ASSERT_EQ(a.outcome, decision::accepted);
  EXPECT_EQ(metric("smockron_proxy_cost_fallback_total{reason=\"missing\"}"), 1);
  EXPECT_EQ(metric("smockron_proxy_cost_units_total"), 1) << "cost_default";
  admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Cost: many\r\n\r\n");
  EXPECT_EQ(metric("smockron_proxy_cost_fallback_total{reason=\"malformed\"}"), 1);
  admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nX-Cost: 99999999\r\n\r\n");
  EXPECT_EQ(metric("smockron_proxy_cost_fallback_total{reason=\"over_max\"}"), 1);
  EXPECT_EQ(metric("smockron_proxy_cost_units_total"), 1 + 1 + 1'000'000) << "cost_max";
}

class BodyCost : public CostAdmission {};
INSTANTIATE_TEST_SUITE_P(RequestBytes, BodyCost, ::testing::Values("\"request_bytes\""));

TEST_P(BodyCost, ABodyWithoutALengthMayGrowToWhatFitsWhenItGoes) {
  const std::string chunked = "POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n";
  EXPECT_EQ(admit_with(chunked).body_limit, -1) << "no policy yet: no bound known";
  const std::vector<guard_rule> rules{{60'000, 1000}};  // 1000/min burst 1000
  gate_.set_policy(rt_.gate_domain[0], rules, clock_.wall_us());
  const auto a = admit_with(chunked);
  ASSERT_EQ(a.outcome, decision::accepted);
  EXPECT_TRUE(a.charge_when_done);
  EXPECT_EQ(a.body_limit, 1000) << "the whole burst";
  // 400 bytes used: 600 left for the next one.
  request_outcome o;
  o.bytes_in = 400;
  charge_done(env_, rt_, *rt_.routes.match("x", "/"), a, cost_when_done(*rt_.routes.match("x", "/"), o),
              clock_.wall_us());
  EXPECT_EQ(admit_with(chunked).body_limit, 600);
  // A length known at admission is charged then, and bounds nothing later.
  EXPECT_EQ(admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nContent-Length: 5\r\n\r\n").body_limit, -1);
}

class BodyEstimate : public CostAdmission {};
INSTANTIATE_TEST_SUITE_P(RequestBytes, BodyEstimate, ::testing::Values("\"request_bytes\"\ncost_estimate = 300"));

// A body without a length on a route with an estimate: the estimate is
// reserved at admission (it must fit, and every gatekeeper sees it), the
// body may grow to it and what fits beyond, and the difference to its size
// is corrected when it is done. A body with a length is its own cost.
TEST_P(BodyEstimate, ABodyWithoutALengthReservesTheEstimate) {
  const std::string chunked = "POST / HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n";
  const route& r = *rt_.routes.match("x", "/");
  const std::vector<guard_rule> rules{{60'000, 1000}};  // 1000/min burst 1000
  gate_.set_policy(rt_.gate_domain[0], rules, clock_.wall_us());
  const auto a = admit_with(chunked);
  ASSERT_EQ(a.outcome, decision::accepted);
  EXPECT_TRUE(a.charge_when_done);
  EXPECT_EQ(a.reserved, 300);
  EXPECT_EQ(a.body_limit, 1000) << "the estimate and the 700 that fit after it";
  EXPECT_EQ(metric("smockron_proxy_cost_units_total"), 300);
  request_outcome o;
  o.bytes_in = 120;
  charge_done(env_, rt_, r, a, cost_when_done(r, o), clock_.wall_us());
  EXPECT_EQ(metric("smockron_proxy_cost_refunded_units_total"), 180);
  EXPECT_EQ(admit_with(chunked).body_limit, 880) << "120 used: 300 reserved and 580 more";
  // 720 used: the next 300 do not fit, and wait (here refused: the master
  // has not spoken about the client), as a known cost would.
  EXPECT_EQ(admit_with(chunked).outcome, decision::accepted);
  const auto over = admit_with(chunked);
  EXPECT_EQ(over.outcome, decision::rejected);
  EXPECT_EQ(over.gate.reason, reject_reason::delay_too_long);
  // The master's word binds: 501 units fit by its time (500 intervals after
  // its next allowed one), the estimate's 300 among them, so 201 more.
  const std::int64_t t0 = clock_.wall_us();
  gate_.update(rt_.gate_domain[0], "m", t0 + 1'000, 60'000, t0);
  clock_.advance(std::chrono::microseconds(1'000 + 500 * 60'000));
  EXPECT_EQ(admit_with("POST / HTTP/1.1\r\nHost: x\r\nX-Key: m\r\nTransfer-Encoding: chunked\r\n\r\n").body_limit, 501);
  const auto known = admit_with("POST / HTTP/1.1\r\nHost: y\r\nX-Key: other\r\nContent-Length: 5\r\n\r\n");
  EXPECT_EQ(known.reserved, -1);
  EXPECT_FALSE(known.charge_when_done);
  EXPECT_EQ(known.body_limit, -1);
}
