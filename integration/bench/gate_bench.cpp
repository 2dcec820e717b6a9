// Google Benchmark of the per-request gate path: route match + identifier
// extraction + control-memory lookup + accounting encode. Goal: < 1 us.
#include <benchmark/benchmark.h>

#include "proxy/codec/path.hpp"
#include "proxy/gate/gate.hpp"
#include "proxy/identify/identify.hpp"
#include "proxy/request/cost.hpp"
#include "proxy/request/routes.hpp"
#include "shared/protocol/wire.hpp"

using namespace smockron;
using namespace smockron::proxy;

namespace {
config::proxy_config bench_config() {
  auto r = config::load_string(R"(
[proxy.upstreams.app]
servers = ["127.0.0.1:9000"]
[[proxy.routes]]
host = "static.example.com"
path = "/"
domain = "static"
upstream = "app"
[[proxy.routes]]
path = "/api/"
domain = "api"
upstream = "app"
identify = ["header:X-API-Key", "ip"]
[[proxy.routes]]
path = "/search/"
domain = "search"
upstream = "app"
identify = ["header:X-API-Key", "ip"]
cost = "header:X-Cost"
[[proxy.routes]]
path = "/v1/"
domain = "llm"
upstream = "app"
identify = ["header:X-API-Key", "ip"]
cost = "response_header:X-Tokens-Used"
cost_estimate = "json:max_tokens"
)",
                               "bench");
  return *r.cfg->proxy;
}

// One request's gate path: route, identifier, decision, accounting message.
std::pair<gate_decision, std::optional<wire::encoded>> one_request(
    const route_table& routes, gate& g, const http1::header_list& headers, const ip_address& peer,
    const std::vector<cidr>& trusted, const gate_limits& limits, std::int64_t now, wire::scratch& scratch) {
  const route* r = routes.match(*headers.first("Host"), "/api/orders");
  const auto found = identify(r->identify, headers, "/api/orders?page=2", peer, {&trusted, nullptr, now / 1'000'000});
  const std::string_view who = found.who ? std::string_view(found.who->value) : std::string_view("-");
  const auto d = g.decide(static_cast<std::uint32_t>(r->domain_index), who, now, limits);
  return {d, wire::encode(wire::accounting{r->domain, wire::status::accepted, who, now / 1000, 0, {}}, scratch)};
}

// What every gate-path benchmark runs against: the routes, a control memory
// of 100k throttled identifiers of domain `busy` (the request's own key is
// not among them), the peer and the limits.
struct gate_bench_setup {
  explicit gate_bench_setup(std::uint32_t busy) : cfg(bench_config()), routes(cfg) {
    for (int i = 0; i < 100'000; ++i) g.update(busy, "key-" + std::to_string(i), now + 60'000'000, 100'000, now);
  }
  config::proxy_config cfg;
  route_table routes;
  gate g;
  const std::int64_t now = 1'700'000'000'000'000;
  const ip_address peer = *parse_ip("192.0.2.10");
  const std::vector<cidr> trusted;
  const gate_limits limits{5'000'000, 10'000};
  wire::scratch scratch;
};

// route + identifier + control lookup + accounting encode.
void gate_path(benchmark::State& state, bool with_key) {
  gate_bench_setup b(1);
  http1::header_list headers;
  headers.insert("Host", "api.example.com");
  headers.insert("User-Agent", "bench/1.0");
  if (with_key) headers.insert("X-API-Key", "customer-4711");  // else the "ip" source answers
  for (auto _ : state) {
    const auto [d, enc] = one_request(b.routes, b.g, headers, b.peer, b.trusted, b.limits, b.now, b.scratch);
    benchmark::DoNotOptimize(d);
    benchmark::DoNotOptimize(enc);
  }
}
// The same path on a route whose cost is a request field: the cost read,
// charged by the gate, and carried by the accounting message.
void BM_GateDecisionHeaderCost(benchmark::State& state) {
  gate_bench_setup b(2);
  http1::request_head req;
  req.headers.insert("Host", "api.example.com");
  req.headers.insert("User-Agent", "bench/1.0");
  req.headers.insert("X-API-Key", "customer-4711");
  req.headers.insert("X-Cost", "37");
  for (auto _ : state) {
    const route* r = b.routes.match(*req.headers.first("Host"), "/search/q");
    const auto found =
        identify(r->identify, req.headers, "/search/q?w=1", b.peer, {&b.trusted, nullptr, b.now / 1'000'000});
    const std::string_view who = found.who ? std::string_view(found.who->value) : std::string_view("-");
    const auto cost = cost_at_admission(*r, req);
    const auto d = b.g.decide(static_cast<std::uint32_t>(r->domain_index), who, b.now, b.limits, cost->units);
    wire::accounting m{r->domain, wire::status::accepted, who, b.now / 1000, 0, {}};
    m.cost = cost->units;
    const auto enc = wire::encode(m, b.scratch);
    benchmark::DoNotOptimize(d);
    benchmark::DoNotOptimize(enc);
  }
}
BENCHMARK(BM_GateDecisionHeaderCost);

// The same path on a route whose cost comes from the response and whose
// estimate is read from the JSON body (an LLM call of ~600 bytes, max_tokens
// last): the estimate found, charged by the gate, the reservation encoded.
void BM_GateDecisionJsonEstimate(benchmark::State& state) {
  gate_bench_setup b(3);
  http1::request_head req;
  req.headers.insert("Host", "api.example.com");
  req.headers.insert("X-API-Key", "customer-4711");
  req.headers.insert("Content-Type", "application/json");
  const std::string body = R"({"model":"some-model-2026","messages":[{"role":"system","content":")" +
                           std::string(200, 's') + R"("},{"role":"user","content":")" + std::string(300, 'u') +
                           R"("}],"temperature":0.2,"stream":false,"max_tokens":512})";
  for (auto _ : state) {
    const route* r = b.routes.match(*req.headers.first("Host"), "/v1/chat/completions");
    const auto found =
        identify(r->identify, req.headers, "/v1/chat/completions", b.peer, {&b.trusted, nullptr, b.now / 1'000'000});
    const std::string_view who = found.who ? std::string_view(found.who->value) : std::string_view("-");
    const auto estimate = estimate_at_admission(*r, req, body);
    const auto d = b.g.decide(static_cast<std::uint32_t>(r->domain_index), who, b.now, b.limits, estimate->units);
    wire::accounting m{r->domain, wire::status::accepted, who, b.now / 1000, 0, {}};
    m.cost = estimate->units;
    m.reserve = true;
    const auto enc = wire::encode(m, b.scratch);
    benchmark::DoNotOptimize(d);
    benchmark::DoNotOptimize(enc);
  }
}
BENCHMARK(BM_GateDecisionJsonEstimate);

void BM_GateDecision(benchmark::State& state) { gate_path(state, true); }
void BM_GateDecisionIpSource(benchmark::State& state) { gate_path(state, false); }
BENCHMARK(BM_GateDecision);
BENCHMARK(BM_GateDecisionIpSource);

// The same path with the domain's policy known (the gate's first-round-trip
// guard on): one well-behaved client, or one of 100k clients in turn (each
// under its limit: 1 request per µs of a 1/µs burst 10 rule).
void gate_path_guarded(benchmark::State& state, int clients) {
  const auto cfg = bench_config();
  const route_table routes(cfg);
  gate g;
  std::int64_t now = 1'700'000'000'000'000;
  const guard_rule rule{1, 10};
  const auto api = static_cast<std::uint32_t>(routes.match("api.example.com", "/api/orders")->domain_index);
  g.set_policy(api, {&rule, 1}, now);
  std::vector<http1::header_list> heads(static_cast<std::size_t>(clients));
  for (int i = 0; i < clients; ++i) {
    heads[static_cast<std::size_t>(i)].insert("Host", "api.example.com");
    heads[static_cast<std::size_t>(i)].insert("X-API-Key", "customer-" + std::to_string(i));
  }
  const auto peer = *parse_ip("192.0.2.10");
  const std::vector<cidr> trusted;
  const gate_limits limits{5'000'000, 10'000};
  wire::scratch scratch;
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& headers = heads[i];
    if (++i == heads.size()) i = 0;
    if (++now % 1'000'000 == 0) g.set_policy(api, {&rule, 1}, now);  // the master's refresh
    const auto [d, enc] = one_request(routes, g, headers, peer, trusted, limits, now, scratch);
    if (d.v != verdict::accept) state.SkipWithError("a client under its limit was held");
    benchmark::DoNotOptimize(d);
    benchmark::DoNotOptimize(enc);
  }
}
void BM_GateDecisionGuarded(benchmark::State& state) { gate_path_guarded(state, 1); }
void BM_GateDecisionGuarded100kClients(benchmark::State& state) { gate_path_guarded(state, 100'000); }
BENCHMARK(BM_GateDecisionGuarded);
BENCHMARK(BM_GateDecisionGuarded100kClients);

void BM_GateDelayedLookup(benchmark::State& state) {
  gate g;
  const std::int64_t now = 1'700'000'000'000'000;
  g.update(0, "hot", now + 60'000'000, 1, now);
  const gate_limits limits{120'000'000, 1LL << 60};
  for (auto _ : state) {
    auto d = g.decide(0, "hot", now, limits);
    g.release_held({});
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_GateDelayedLookup);

// Path normalization on the request path: a path that needs none (the
// common case: one scan, no allocation) and one that does.
void BM_PathAlreadyNormal(benchmark::State& state) {
  const smockron::proxy::path::options o;
  for (auto _ : state) {
    benchmark::DoNotOptimize(smockron::proxy::path::already_normal("/api/v1/users/12345/orders", o));
  }
}
BENCHMARK(BM_PathAlreadyNormal);

void BM_PathNormalize(benchmark::State& state) {
  const smockron::proxy::path::options o;
  std::string_view why;
  for (auto _ : state) {
    benchmark::DoNotOptimize(smockron::proxy::path::normalize("//%61pi/v1/./users/../users/12345/orders", o, why));
  }
}
BENCHMARK(BM_PathNormalize);
}  // namespace

BENCHMARK_MAIN();
