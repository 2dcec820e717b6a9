// Configuration: the full schema, defaults, and every error path with its
// key path and line:column.
#include "shared/config/config.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <set>

#include "smockron/embedded_config.hpp"

using namespace smockron;
using namespace smockron::config;
using namespace std::chrono;

namespace {
load_result load(const std::string& text) { return load_string(text, "test.toml"); }

// The single error of a config, formatted.
std::string one_error(const std::string& text) {
  auto r = load(text);
  EXPECT_FALSE(r.cfg);
  EXPECT_EQ(r.errors.size(), 1u);
  std::string all;
  for (const auto& e : r.errors) all += format(e) + "\n";
  return r.errors.size() == 1 ? format(r.errors[0]) : all;
}
}  // namespace

TEST(Config, FullSchemaParses) {
  auto r = load(R"(
[master]
accounting = "tcp://127.0.0.1:20004"
control    = "tcp://127.0.0.1:20005"
admin      = "127.0.0.1:9205"
store      = "redis"
redis      = "redis://127.0.0.1:6380/1"
redis_timeout = "250ms"
max_identifiers = 5000
max_clock_skew = "10s"
startup_backlog = 0
max_accounting_peers = 64
max_control_peers = 32
sweep_interval = "50ms"
log_level = "debug"

[master.domains.api]
rules = [ { rate = "10/s", burst = 20 }, { rate = "1000/h", burst = 100 } ]
algorithm = "gcra"

[master.domains.login]
rules = [ { rate = "5/min" } ]

[proxy]
listen = "0.0.0.0:8081"
admin = "127.0.0.1:9206"
threads = 2
accounting = ["tcp://10.0.0.1:10004", "tcp://10.0.0.2:10004"]
control = "tcp://10.0.0.1:10005"
max_delay = "2s"
max_held = 50
trusted_proxies = ["10.0.0.0/8", "::1"]
header_timeout = "5s"
body_timeout = "30s"
idle_timeout = "30s"
connect_timeout = "1s"
upstream_timeout = "20s"
grace_period = "3s"
max_header_bytes = "8KiB"
max_body_bytes = "1GiB"
rejected_sample = 0.25
accounting_flush = "5ms"
access_log = true
fail_closed = false
ipv6_prefix = 56
normalize_path = true
merge_slashes = false
escaped_slashes = "unescape"
path_parameters = "strip"
real_ip_header = "Forwarded"
proxy_protocol = true
max_control_entries = 5000
control_fresh = "750ms"

[proxy.jwt]
hs256_secret = "s3cret"
issuer = "https://idp.example"
audience = "orders"
leeway = "5s"

[proxy.upstreams.app]
servers = ["127.0.0.1:9000", "127.0.0.1:9001"]
fail_timeout = "5s"
keepalive = 16

[[proxy.routes]]
host = "*.example.com"
path = "/api/"
domain = "api"
upstream = "app"
identify = ["header:X-API-Key", "jwt:sub", "ip"]
unidentified = "reject"

[[proxy.routes]]
domain = "login"
upstream = "app"
)");
  for (const auto& e : r.errors) ADD_FAILURE() << format(e);
  ASSERT_TRUE(r.cfg);
  const auto& m = *r.cfg->master;
  EXPECT_EQ(m.accounting, "tcp://127.0.0.1:20004");
  EXPECT_EQ(m.admin, (host_port{"127.0.0.1", 9205}));
  EXPECT_EQ(m.store, store_kind::redis);
  EXPECT_EQ(m.redis_target.address, (host_port{"127.0.0.1", 6380}));
  EXPECT_EQ(m.redis_target.db, 1);
  EXPECT_EQ(m.redis_timeout, milliseconds(250));
  EXPECT_EQ(m.max_identifiers, 5000u);
  EXPECT_EQ(m.max_clock_skew, seconds(10));
  EXPECT_EQ(m.startup_backlog, 0);
  EXPECT_EQ(m.max_accounting_peers, 64u);
  EXPECT_EQ(m.max_control_peers, 32u);
  EXPECT_EQ(m.sweep_interval, milliseconds(50));
  ASSERT_EQ(m.domains.size(), 2u);
  const auto* api = m.find_domain("api");
  ASSERT_TRUE(api);
  EXPECT_EQ(api->algorithm, config::algorithm_kind::gcra);
  ASSERT_EQ(api->rules.size(), 2u);
  EXPECT_EQ(api->rules[0].r, (rate{10, seconds(1)}));
  EXPECT_EQ(api->rules[0].burst, 20);
  EXPECT_EQ(api->rules[1].r, (rate{1000, hours(1)}));
  EXPECT_EQ(m.find_domain("login")->rules[0].burst, 1);  // default burst
  EXPECT_EQ(m.find_domain("login")->algorithm, config::algorithm_kind::sliding_log);
  EXPECT_EQ(api->rules[0].r.interval_us(), 100'000);
  EXPECT_EQ(m.max_clock_skew, seconds(10));

  const auto& p = *r.cfg->proxy;
  EXPECT_EQ(p.listen, (host_port{"0.0.0.0", 8081}));
  EXPECT_EQ(p.threads, 2);
  EXPECT_EQ(p.accounting.size(), 2u);
  ASSERT_EQ(p.control.size(), 1u);  // a single string is a one-element list
  EXPECT_EQ(p.max_delay, seconds(2));
  EXPECT_EQ(p.max_held, 50);
  ASSERT_EQ(p.trusted_proxies.size(), 2u);
  EXPECT_TRUE(p.trusted_proxies[0].contains(*parse_ip("10.1.2.3")));
  EXPECT_EQ(p.header_timeout, seconds(5));
  EXPECT_EQ(p.body_timeout, seconds(30));
  EXPECT_EQ(p.grace_period, seconds(3));
  EXPECT_EQ(p.max_header_bytes, 8u * 1024);
  EXPECT_EQ(p.max_body_bytes, 1024ull * 1024 * 1024);
  EXPECT_DOUBLE_EQ(p.rejected_sample, 0.25);
  EXPECT_EQ(p.accounting_flush, milliseconds(5));
  EXPECT_TRUE(p.access_log);
  EXPECT_EQ(p.ipv6_prefix, 56);
  EXPECT_TRUE(p.normalize_path);
  EXPECT_FALSE(p.merge_slashes);
  EXPECT_EQ(p.escaped_slashes, config::proxy_config::escaped_slashes_action::unescape);
  EXPECT_EQ(p.path_parameters, config::proxy_config::path_parameters_action::strip);
  EXPECT_EQ(p.real_ip_header, config::proxy_config::real_ip_header_kind::forwarded);
  EXPECT_TRUE(p.proxy_protocol);
  EXPECT_EQ(p.max_control_entries, 5000);
  EXPECT_EQ(p.control_fresh, milliseconds(750));
  EXPECT_EQ(p.jwt.hs256_secret, "s3cret");
  EXPECT_TRUE(p.jwt.verify());
  EXPECT_EQ(p.jwt.leeway, seconds(5));
  EXPECT_EQ(p.jwt.issuer, "https://idp.example");
  EXPECT_EQ(p.jwt.audience, "orders");
  ASSERT_EQ(p.upstreams.size(), 1u);
  EXPECT_EQ(p.upstreams[0].servers.size(), 2u);
  EXPECT_EQ(p.upstreams[0].fail_timeout, seconds(5));
  EXPECT_EQ(p.upstreams[0].keepalive, 16);
  ASSERT_EQ(p.routes.size(), 2u);
  EXPECT_EQ(p.routes[0].host, "*.example.com");
  EXPECT_EQ(p.routes[0].path, "/api/");
  ASSERT_EQ(p.routes[0].identify.size(), 3u);
  EXPECT_EQ(p.routes[0].unidentified, config::route_config::unidentified_action::reject);
  EXPECT_EQ(p.routes[0].identify[0], (identifier_source{identifier_source::kind::header, "X-API-Key"}));
  EXPECT_EQ(p.routes[0].identify[1], (identifier_source{identifier_source::kind::jwt, "sub"}));
  EXPECT_EQ(p.routes[1].host, "*");
  EXPECT_EQ(p.routes[1].path, "/");
  ASSERT_EQ(p.routes[1].identify.size(), 1u);  // default: ip
  EXPECT_EQ(p.routes[1].identify[0].type, identifier_source::kind::ip);
}

TEST(Config, DefaultsWhenTablesAreEmpty) {
  auto r = load("[master]\n[proxy]\n");
  ASSERT_TRUE(r.cfg);
  EXPECT_EQ(r.cfg->master->accounting, "tcp://127.0.0.1:10004");
  EXPECT_EQ(r.cfg->master->control, "tcp://127.0.0.1:10005");
  EXPECT_EQ(r.cfg->master->admin, (host_port{"127.0.0.1", 9105}));
  EXPECT_EQ(r.cfg->master->store, store_kind::memory);
  EXPECT_EQ(r.cfg->master->max_identifiers, 1'000'000u);
  EXPECT_TRUE(r.cfg->master->pace_share);
  EXPECT_FALSE(load("[master]\npace_share = false\n").cfg->master->pace_share);
  EXPECT_EQ(r.cfg->proxy->listen, (host_port{"0.0.0.0", 8080}));
  EXPECT_EQ(r.cfg->proxy->max_delay, seconds(5));
  EXPECT_EQ(r.cfg->proxy->max_held, 10'000);
  EXPECT_EQ(r.cfg->proxy->header_timeout, seconds(10));
  EXPECT_EQ(r.cfg->proxy->idle_timeout, seconds(60));
  EXPECT_EQ(r.cfg->proxy->connect_timeout, seconds(2));
  EXPECT_EQ(r.cfg->proxy->upstream_timeout, seconds(60));
  EXPECT_EQ(r.cfg->proxy->max_header_bytes, 16u * 1024);
  EXPECT_FALSE(load("").cfg->master);
}

TEST(Config, EmbeddedDefaultsAndShippedConfigAreValid) {
  auto r = load_string(embedded_config, "<embedded>");
  for (const auto& e : r.errors) ADD_FAILURE() << format(e);
  ASSERT_TRUE(r.cfg);
  EXPECT_TRUE(r.cfg->master);
  EXPECT_TRUE(r.cfg->proxy);
}

TEST(Config, SyntaxErrorHasLineAndColumn) {
  const auto e = one_error("[master]\nstore = \n");
  EXPECT_EQ(e.rfind("test.toml:2:", 0), 0u) << e;
}

TEST(Config, UnknownKeysAreErrorsEverywhere) {
  EXPECT_EQ(one_error("[mastr]\n"), "test.toml:1:2: mastr: unknown key (check the spelling; unknown keys are errors)");
  EXPECT_EQ(one_error("[master]\nadmn = \"x\"\n"),
            "test.toml:2:1: master.admn: unknown key (check the spelling; unknown keys are errors)");
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ rate = \"1/s\", brust = 2 }]\n")
                .find("master.domains.a.rules[0].brust: unknown key"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrule = []\n").find("master.domains.a.rule: unknown key"), std::string::npos);
  EXPECT_NE(one_error("[proxy]\nlisten_port = 1\n").find("proxy.listen_port: unknown key"), std::string::npos);
  EXPECT_NE(one_error("[proxy.jwt]\nsecret = \"x\"\n").find("proxy.jwt.secret: unknown key"), std::string::npos);
  EXPECT_NE(
      one_error("[proxy.upstreams.u]\nservers=[\"h:1\"]\nweight=2\n").find("proxy.upstreams.u.weight: unknown key"),
      std::string::npos);
  EXPECT_NE(
      one_error(
          "[proxy.upstreams.u]\nservers=[\"h:1\"]\n[[proxy.routes]]\ndomain=\"d\"\nupstream=\"u\"\nprefix=\"/\"\n")
          .find("proxy.routes[0].prefix: unknown key"),
      std::string::npos);
}

TEST(Config, MasterValueErrors) {
  EXPECT_EQ(one_error("[master]\nstore = \"disk\"\n"),
            "test.toml:2:9: master.store: unknown store \"disk\" (use \"memory\" or \"redis\")");
  EXPECT_NE(one_error("[master]\naccounting = \"10004\"\n").find("master.accounting: invalid endpoint"),
            std::string::npos);
  EXPECT_NE(
      one_error("[proxy]\nescaped_slashes = \"decode\"\n").find("proxy.escaped_slashes: unknown action \"decode\""),
      std::string::npos);
  EXPECT_NE(one_error("[proxy]\npath_parameters = \"drop\"\n")
                .find("proxy.path_parameters: unknown action \"drop\" (use \"keep\", \"strip\" or \"reject\")"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\ntrusted_proxies = [\"10.0.0.0/8\"]\nreal_ip_header = \"X-Real-IP\"\n")
                .find("proxy.real_ip_header: unknown header \"X-Real-IP\" (use \"X-Forwarded-For\" or \"Forwarded\")"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\naccounting_hwm = 5\n").find("master.accounting_hwm: renamed to startup_backlog"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\ncontrol = \"inproc://c\"\n")
                .find("master.control: control travels on tcp:// or ipc:// endpoints"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\naccounting = \"inproc://a\"\n")
                .find("master.accounting: accounting travels on tcp:// or ipc:// endpoints"),
            std::string::npos);
  EXPECT_NE(
      one_error("[master]\nmax_accounting_peers = 0\n").find("master.max_accounting_peers: must be between 1 and"),
      std::string::npos);
  EXPECT_NE(one_error("[master]\ncontrol = 10005\n")
                .find("master.control: expected a ZeroMQ endpoint string, got an integer"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nadmin = \"localhost\"\n").find("master.admin: invalid address"), std::string::npos);
  EXPECT_NE(
      one_error("[master]\nstore = \"redis\"\nredis = \"127.0.0.1:6379\"\n").find("master.redis: expected redis://"),
      std::string::npos);
  EXPECT_NE(one_error("[master]\nstore = \"redis\"\nredis = \"redis://host:6379/db\"\n")
                .find("master.redis: expected redis://"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nstore = \"redis\"\nredis_timeout = \"0s\"\n").find("master.redis_timeout"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nmax_identifiers = 0\n").find("master.max_identifiers: must be between 1 and"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nmax_clock_skew = \"soon\"\n").find("master.max_clock_skew: invalid duration"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nsweep_interval = \"0ms\"\n").find("master.sweep_interval: must be at least 1ms"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\ndomains = 3\n").find("master.domains: expected a table of domains"),
            std::string::npos);
  EXPECT_NE(one_error("master = 1\n").find("master: expected a table, got an integer"), std::string::npos);
}

TEST(Config, DomainAndRuleErrors) {
  EXPECT_NE(one_error("[master.domains.a]\nalgorithm = \"leaky\"\n")
                .find("master.domains.a.algorithm: unknown algorithm \"leaky\""),
            std::string::npos);
  EXPECT_NE(
      one_error("[master.domains.a]\nrules = \"10/s\"\n").find("master.domains.a.rules: expected an array of rules"),
      std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [\"10/s\"]\n").find("master.domains.a.rules[0]: expected a table"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ burst = 2 }]\n").find("master.domains.a.rules[0].rate: missing"),
            std::string::npos);
  EXPECT_EQ(one_error("[master.domains.a]\nrules = [{ rate = \"10/q\" }]\n"),
            "test.toml:2:19: master.domains.a.rules[0].rate: invalid rate \"10/q\" (expected N/s, N/min, N/h, N/d or "
            "N/<duration>): unknown duration unit \"q\" in \"1q\" (use us, ms, s, min, h, d)");
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ rate = \"1/s\", burst = 0 }]\n")
                .find("rules[0].burst: must be between 1"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ rate = \"1/s\", burst = \"2\" }]\n")
                .find("expected an integer, got a string"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains]\na = 1\n").find("master.domains.a: expected a table"), std::string::npos);
  EXPECT_NE(one_error("[master.domains.\"\"]\n").find("domain name must not be empty"), std::string::npos);
}

TEST(Config, PerIdentifierOverrides) {
  auto r = load(R"(
[master.domains.api]
algorithm = "gcra"
rules = [ { rate = "10/s", burst = 20 } ]
overrides = [
  { identifier = "sha256:0123456789abcdef0123456789abcdef", rules = [ { rate = "100/s", burst = 200 }, { rate = "1000/h" } ] },
  { identifier = "10.0.0.7", rules = [] },
]
)");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& d = *r.cfg->master->find_domain("api");
  ASSERT_EQ(d.overrides.size(), 2u);
  EXPECT_EQ(d.overrides[0].identifier, "sha256:0123456789abcdef0123456789abcdef");
  ASSERT_EQ(d.overrides[0].rules.size(), 2u);
  EXPECT_EQ(d.overrides[0].rules[0].burst, 200);
  EXPECT_EQ(d.overrides[1].identifier, "10.0.0.7");
  EXPECT_TRUE(d.overrides[1].rules.empty());    // no limit for that client
  EXPECT_EQ(d.overrides[0].rules[1].burst, 1);  // what the master compiles is tested in limiter_test.cpp

  const std::string head = "[master.domains.a]\n";
  EXPECT_NE(
      one_error(head + "overrides = { identifier = \"x\" }\n").find("master.domains.a.overrides: expected an array"),
      std::string::npos);
  EXPECT_NE(one_error(head + "overrides = [\"x\"]\n").find("master.domains.a.overrides[0]: expected a table"),
            std::string::npos);
  EXPECT_NE(one_error(head + "overrides = [{ rules = [] }]\n").find("overrides[0].identifier: missing"),
            std::string::npos);
  EXPECT_NE(one_error(head + "overrides = [{ identifier = \"x\" }]\n").find("overrides[0].rules: missing"),
            std::string::npos);
  EXPECT_NE(one_error(head + "overrides = [{ identifier = \"\", rules = [] }]\n").find("must not be empty"),
            std::string::npos);
  EXPECT_NE(one_error(head + "overrides = [{ identifier = \"" + std::string(1025, 'k') + "\", rules = [] }]\n")
                .find("longer than 1024 bytes"),
            std::string::npos);
  EXPECT_EQ(one_error(head + "overrides = [{ identifier = \"x\", rules = [] }, { identifier = \"x\", rules = [] }]\n"),
            "test.toml:2:63: master.domains.a.overrides[1].identifier: \"x\" has another override in this domain");
  EXPECT_NE(one_error(head + "overrides = [{ identifier = \"x\", rules = [{ rate = \"1/s\", burst = 0 }] }]\n")
                .find("overrides[0].rules[0].burst: must be between 1"),
            std::string::npos);
  EXPECT_NE(one_error(head + "overrides = [{ identifier = \"x\", rules = [], limit = 3 }]\n")
                .find("overrides[0].limit: unknown key"),
            std::string::npos);
  // The total is bounded: every override is published every second.
  std::string many = head + "overrides = [\n";
  for (std::size_t i = 0; i <= max_overrides; ++i)
    many += "{ identifier = \"c" + std::to_string(i) + "\", rules = [] },\n";
  EXPECT_NE(one_error(many + "]\n").find("10001 overrides; at most 10000"), std::string::npos);
}

TEST(Config, ProxyValueErrors) {
  EXPECT_NE(one_error("[proxy]\nlisten = \"8080\"\n").find("proxy.listen: invalid address"), std::string::npos);
  EXPECT_NE(one_error("[proxy]\nthreads = -1\n").find("proxy.threads: must be between 0 and 1024"), std::string::npos);
  EXPECT_NE(
      one_error("[proxy]\naccounting = [\"inproc://a\"]\n").find("proxy.accounting[0]: accounting travels on tcp://"),
      std::string::npos);
  EXPECT_NE(one_error("[proxy]\naccounting = [\"tcp://master\"]\n").find("expected tcp://host:port"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\naccounting = [\"tcp://master:70000\"]\n").find("expected tcp://host:port"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\naccounting = [\"ipc:///" + std::string(120, 'p') + "\"]\n").find("longer than 107"),
            std::string::npos);
  EXPECT_NE(
      one_error("[proxy]\naccounting = [\"tcp://a:1\", \"udp://b:2\"]\n").find("proxy.accounting[1]: invalid endpoint"),
      std::string::npos);
  EXPECT_NE(one_error("[proxy]\ncontrol = [1]\n").find("proxy.control[0]: expected a string"), std::string::npos);
  EXPECT_NE(one_error("[proxy]\ncontrol = {}\n").find("proxy.control: expected an array of strings"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nmax_delay = 5\n").find("proxy.max_delay: expected a duration string"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nmax_held = -1\n").find("proxy.max_held: must be between"), std::string::npos);
  EXPECT_NE(one_error("[proxy]\ntrusted_proxies = [\"10.0.0.0/40\"]\n").find("proxy.trusted_proxies[0]: invalid CIDR"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nheader_timeout = \"0s\"\n").find("proxy.header_timeout: must be at least 1ms"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nmax_header_bytes = \"16XB\"\n").find("proxy.max_header_bytes: unknown size unit"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nmax_header_bytes = 10\n").find("proxy.max_header_bytes: must be between 256"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\naccounting_flush = \"2s\"\n").find("proxy.accounting_flush: must be at most 1s"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nrejected_sample = 1.5\n").find("proxy.rejected_sample: must be between"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nrejected_sample = \"all\"\n").find("proxy.rejected_sample: expected a number"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\naccess_log = \"yes\"\n").find("proxy.access_log: expected a boolean"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nmax_control_entries = 10\n").find("proxy.max_control_entries: must be between 64"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\ncontrol_fresh = \"0s\"\n").find("proxy.control_fresh: must be at least 1ms"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy.jwt]\npublic_key_file = \"/nonexistent/key.pem\"\n")
                .find("proxy.jwt.public_key_file: cannot read"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy.jwt]\njwks_file = \"/nonexistent/keys.json\"\n").find("proxy.jwt.jwks_file: cannot read"),
            std::string::npos);
}

TEST(Config, UpstreamAndRouteErrors) {
  EXPECT_NE(one_error("[proxy.upstreams.u]\nservers = []\n")
                .find("proxy.upstreams.u.servers: an upstream needs at least one server"),
            std::string::npos);
  EXPECT_NE(
      one_error("[proxy.upstreams.u]\nservers = [\"nohost\"]\n").find("proxy.upstreams.u.servers[0]: invalid server"),
      std::string::npos);
  EXPECT_NE(one_error("[proxy.upstreams]\nu = 1\n").find("proxy.upstreams.u: expected a table"), std::string::npos);
  const std::string up = "[proxy.upstreams.u]\nservers = [\"127.0.0.1:1\"]\n";
  // A route without a domain is not limited: keys that shape limiting would do nothing there.
  EXPECT_TRUE(load(up + "[[proxy.routes]]\npath = \"/healthz\"\nupstream = \"u\"\n").cfg);
  EXPECT_NE(one_error(up + "[[proxy.routes]]\nupstream = \"u\"\nidentify = [\"ip\"]\n")
                .find("proxy.routes[0].identify: has no effect on a route without a domain"),
            std::string::npos);
  EXPECT_NE(one_error(up + "[[proxy.routes]]\nupstream = \"u\"\nmode = \"shadow\"\n")
                .find("proxy.routes[0].mode: has no effect on a route without a domain"),
            std::string::npos);
  EXPECT_NE(one_error(up + "[[proxy.routes]]\ndomain = \"d\"\n").find("proxy.routes[0].upstream: missing"),
            std::string::npos);
  EXPECT_NE(one_error(up + "[[proxy.routes]]\ndomain = \"d\"\nupstream = \"v\"\n")
                .find("proxy.routes[0].upstream: unknown upstream \"v\""),
            std::string::npos);
  EXPECT_NE(
      one_error(up + "[[proxy.routes]]\ndomain = \"d\"\nupstream = \"u\"\npath = \"api\"\n").find("must start with /"),
      std::string::npos);
  EXPECT_NE(one_error(up + "[[proxy.routes]]\ndomain = \"d\"\nupstream = \"u\"\nidentify = [\"mac\"]\n")
                .find("proxy.routes[0].identify[0]: invalid identifier source \"mac\""),
            std::string::npos);
  EXPECT_NE(
      one_error(up + "[[proxy.routes]]\ndomain = \"d\"\nupstream = \"u\"\nidentify = [\"jwt:sub\", \"ip\"]\n")
          .find("proxy.routes[0].identify: a jwt: source needs [proxy.jwt] hs256_secret, public_key_file or jwks_file"),
      std::string::npos);
  EXPECT_NE(one_error(up + "[[proxy.routes]]\ndomain = \"d\"\nupstream = \"u\"\nunidentified = \"drop\"\n")
                .find("proxy.routes[0].unidentified: unknown action \"drop\""),
            std::string::npos);
  EXPECT_NE(one_error(up + "[[proxy.routes]]\ndomain = \"d\"\nupstream = \"u\"\nidentify = []\n")
                .find("needs at least one source"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nroutes = 1\n").find("proxy.routes: expected an array of tables"), std::string::npos);
}

// --check finds what would otherwise fail only at start.
TEST(Config, WhatWouldFailAtStartIsAnError) {
  EXPECT_NE(
      one_error("[proxy]\nlisten = \"localhost:8080\"\n").find("proxy.listen: \"localhost\" is not an IP address"),
      std::string::npos);
  EXPECT_NE(one_error("[proxy]\nadmin = \"admin.internal:9106\"\n").find("proxy.admin: \"admin.internal\" is not"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nadmin = \"example.com:9105\"\n").find("master.admin: \"example.com\" is not"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nlisten = \"127.0.0.1:70000\"\n").find("proxy.listen: invalid address"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nlog_level = \"verbose\"\n").find("proxy.log_level: unknown level \"verbose\""),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nlog_level = \"loud\"\n").find("master.log_level: unknown level"), std::string::npos);
  EXPECT_TRUE(load("[proxy]\nlisten = \"[::]:8080\"\nadmin = \"[::1]:9106\"\nlog_level = \"debug\"\n").cfg);
  const auto r = load("[proxy]\nresolve_interval = \"0s\"\n");
  ASSERT_TRUE(r.cfg);
  EXPECT_EQ(r.cfg->proxy->resolve_interval.count(), 0) << "0: names resolved once";
}

TEST(Config, PerRoutePolicy) {
  const std::string up =
      "[proxy]\nmax_delay = \"5s\"\n[proxy.upstreams.u]\nservers = [\"127.0.0.1:1\"]\n"
      "[[proxy.routes]]\ndomain = \"d\"\nupstream = \"u\"\n";
  auto r = load(up +
                "status = 429\nmax_delay = \"250ms\"\nmax_held = 7\nmode = \"shadow\"\n"
                "exempt = [\"10.0.0.0/8\", \"::1\"]\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& route = r.cfg->proxy->routes[0];
  EXPECT_EQ(route.status, 429);
  EXPECT_EQ(route.max_delay, std::chrono::milliseconds(250));
  EXPECT_EQ(route.max_held, 7);
  EXPECT_EQ(route.mode, route_config::route_mode::shadow);
  ASSERT_EQ(route.exempt.size(), 2u);
  EXPECT_TRUE(route.exempt[0].contains(*parse_ip("10.1.2.3")));
  // Defaults: the spec's 503, the [proxy] limits, enforced, nobody exempt.
  r = load(up);
  ASSERT_TRUE(r.cfg);
  EXPECT_EQ(r.cfg->proxy->routes[0].status, 503);
  EXPECT_FALSE(r.cfg->proxy->routes[0].max_delay);
  EXPECT_FALSE(r.cfg->proxy->routes[0].max_held);
  EXPECT_EQ(r.cfg->proxy->routes[0].mode, route_config::route_mode::enforce);

  EXPECT_NE(one_error(up + "status = 200\n").find("proxy.routes[0].status: must be between 400 and 599"),
            std::string::npos);
  EXPECT_NE(one_error(up + "mode = \"dry-run\"\n").find("proxy.routes[0].mode: unknown mode \"dry-run\""),
            std::string::npos);
  EXPECT_NE(one_error(up + "exempt = [\"10.0.0.0/33\"]\n").find("proxy.routes[0].exempt[0]: invalid CIDR"),
            std::string::npos);
  EXPECT_NE(one_error(up + "max_held = -1\n").find("proxy.routes[0].max_held: must be between 0"), std::string::npos);
}

TEST(Config, AllErrorsAreReportedAtOnceInSourceOrder) {
  auto r = load("[master]\nstore = \"disk\"\nmax_identifiers = 0\n[proxy]\nthreads = -1\nbogus = 1\n");
  ASSERT_EQ(r.errors.size(), 4u);
  EXPECT_EQ(r.errors[0].line, 2u);
  EXPECT_EQ(r.errors[1].line, 3u);
  EXPECT_EQ(r.errors[2].line, 5u);
  EXPECT_EQ(r.errors[3].line, 6u);
  EXPECT_EQ(r.errors[3].key, "proxy.bogus");
}

TEST(Config, IdentifierSources) {
  using k = identifier_source::kind;
  EXPECT_EQ(parse_identifier_source("ip")->type, k::ip);
  EXPECT_EQ(parse_identifier_source("token")->type, k::token);
  EXPECT_EQ(*parse_identifier_source("cookie:sid"), (identifier_source{k::cookie, "sid"}));
  EXPECT_EQ(*parse_identifier_source("query:key"), (identifier_source{k::query, "key"}));
  EXPECT_FALSE(parse_identifier_source("header:"));
  EXPECT_FALSE(parse_identifier_source("ip:x"));
  EXPECT_FALSE(parse_identifier_source(""));
  EXPECT_EQ(to_string(identifier_source{k::jwt, "sub"}), "jwt:sub");
  EXPECT_TRUE(parse_identifier_source("token")->hash) << "bearer tokens are credentials";
  EXPECT_FALSE(parse_identifier_source("header:X-API-Key")->hash);
}

TEST(Config, IdentifierSourcesWithOptions) {
  using k = identifier_source::kind;
  const std::string up =
      "[proxy.upstreams.u]\nservers = [\"127.0.0.1:1\"]\n[[proxy.routes]]\ndomain = \"d\"\n"
      "upstream = \"u\"\n";
  auto r = load(up +
                "identify = [{ source = \"header:X-API-Key\", hash = true }, { source = \"token\", hash = false }, "
                "{ source = \"cookie:sid\" }, \"ip\"]\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& ids = r.cfg->proxy->routes[0].identify;
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[0], (identifier_source{k::header, "X-API-Key", true}));
  EXPECT_EQ(ids[1], (identifier_source{k::token, {}, false}));
  EXPECT_EQ(ids[2], (identifier_source{k::cookie, "sid", false}));
  EXPECT_EQ(ids[3], (identifier_source{k::ip, {}, false}));
  // A single source, string or table, is a one-element list.
  r = load(up + "identify = { source = \"query:key\", hash = true }\n");
  ASSERT_TRUE(r.cfg);
  EXPECT_EQ(r.cfg->proxy->routes[0].identify, (std::vector<identifier_source>{{k::query, "key", true}}));

  EXPECT_NE(one_error(up + "identify = [{ hash = true }]\n").find("proxy.routes[0].identify[0].source: missing"),
            std::string::npos);
  EXPECT_NE(one_error(up + "identify = [{ source = \"mac\" }]\n")
                .find("proxy.routes[0].identify[0].source: invalid identifier source"),
            std::string::npos);
  EXPECT_NE(one_error(up + "identify = [{ source = \"ip\", hash = \"yes\" }]\n")
                .find("proxy.routes[0].identify[0].hash: expected a boolean"),
            std::string::npos);
  EXPECT_NE(one_error(up + "identify = [{ source = \"ip\", salt = \"x\" }]\n")
                .find("proxy.routes[0].identify[0].salt: unknown key"),
            std::string::npos);
  EXPECT_NE(one_error(up + "identify = [7]\n")
                .find("proxy.routes[0].identify[0]: expected a source string or a { source, hash } table"),
            std::string::npos);
}

TEST(Config, KeysWithNoEffectAreErrors) {
  EXPECT_NE(
      one_error("[master]\nredis = \"redis://h/0\"\n").find("master.redis: has no effect unless store = \"redis\""),
      std::string::npos);
  EXPECT_NE(
      one_error("[master]\nstore = \"memory\"\nstartup_backlog = 5\n").find("master.startup_backlog: has no effect"),
      std::string::npos);
  EXPECT_NE(one_error("[proxy]\nnormalize_path = false\nmerge_slashes = true\n")
                .find("proxy.merge_slashes: has no effect with normalize_path = false"),
            std::string::npos);
  EXPECT_NE(
      one_error("[proxy]\nnormalize_path = false\nescaped_slashes = \"keep\"\n").find("escaped_slashes: has no effect"),
      std::string::npos);
  EXPECT_NE(one_error("[proxy]\nreal_ip_header = \"Forwarded\"\n")
                .find("proxy.real_ip_header: has no effect without trusted_proxies"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy.jwt]\nissuer = \"https://idp\"\n").find("proxy.jwt.issuer: has no effect without a key"),
            std::string::npos);
  EXPECT_TRUE(load("[proxy]\ntrusted_proxies = [\"10.0.0.0/8\"]\nreal_ip_header = \"Forwarded\"\n").cfg);
}

TEST(Config, TlsKeys) {
  // The files must exist (what they hold is checked where they are loaded: tls_test, --check).
  const std::string dir = ::testing::TempDir();
  for (const char* f : {"/c.pem", "/k.pem", "/ca.pem"}) std::ofstream(dir + f) << "x";
  const std::string cert = dir + "/c.pem", key = dir + "/k.pem", ca = dir + "/ca.pem";
  auto r = load("[proxy]\ntls_cert = \"" + cert + "\"\ntls_key = \"" + key + "\"\n" + "tls_sni = [ { cert = \"" + cert +
                "\", key = \"" + key + "\" } ]\n" +
                "[proxy.upstreams.app]\nservers = [\"api.internal:443\"]\ntls = true\ntls_ca = \"" + ca +
                "\"\ntls_server_name = \"api.example.com\"\ntls_client_cert = \"" + cert + "\"\ntls_client_key = \"" +
                key + "\"\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& p = *r.cfg->proxy;
  EXPECT_TRUE(p.tls());
  EXPECT_EQ(p.tls_key, key);
  ASSERT_EQ(p.tls_sni.size(), 1u);
  EXPECT_EQ(p.tls_sni[0].cert, cert);
  const auto& u = p.upstreams[0];
  EXPECT_TRUE(u.tls);
  EXPECT_TRUE(u.tls_verify);
  EXPECT_EQ(u.tls_ca, ca);
  EXPECT_EQ(u.tls_server_name, "api.example.com");
  EXPECT_EQ(u.tls_client_key, key);
  EXPECT_FALSE(load("[proxy]\n").cfg->proxy->tls());
  EXPECT_TRUE(p.tls_session_resumption);
  EXPECT_NE(one_error("[proxy]\ntls_session_resumption = false\n")
                .find("proxy.tls_session_resumption: has no effect without tls_cert and tls_key"),
            std::string::npos);

  EXPECT_NE(one_error("[proxy]\ntls_cert = \"" + cert + "\"\n").find("proxy.tls_cert: needs tls_key too"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\ntls_key = \"" + key + "\"\n").find("proxy.tls_key: needs tls_cert too"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\ntls_cert = \"/nonexistent/c.pem\"\ntls_key = \"" + key + "\"\n")
                .find("proxy.tls_cert: cannot read \"/nonexistent/c.pem\""),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\ntls_sni = []\n").find("proxy.tls_sni: has no effect without tls_cert and tls_key"),
            std::string::npos);
  const std::string tls = "[proxy]\ntls_cert = \"" + cert + "\"\ntls_key = \"" + key + "\"\n";
  EXPECT_NE(one_error(tls + "tls_sni = \"x\"\n").find("proxy.tls_sni: expected an array of { cert"), std::string::npos);
  EXPECT_NE(one_error(tls + "tls_sni = [\"x\"]\n").find("proxy.tls_sni[0]: expected a table { cert"),
            std::string::npos);
  EXPECT_NE(one_error(tls + "tls_sni = [ { cert = \"" + cert + "\", key = \"" + key + "\", pem = 1 } ]\n")
                .find("tls_sni[0].pem: unknown key"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\ntls_cert = \"" + cert + "\"\ntls_key = \"" + key + "\"\ntls_sni = [ { cert = \"" +
                      cert + "\" } ]\n")
                .find("proxy.tls_sni[0]: needs both cert and key"),
            std::string::npos);
  const std::string up = "[proxy.upstreams.app]\nservers = [\"127.0.0.1:443\"]\n";
  EXPECT_NE(
      one_error(up + "tls_ca = \"" + ca + "\"\n").find("proxy.upstreams.app.tls_ca: has no effect unless tls = true"),
      std::string::npos);
  EXPECT_NE(one_error(up + "tls_verify = false\n").find("tls_verify: has no effect unless tls = true"),
            std::string::npos);
  EXPECT_NE(one_error(up + "tls = true\ntls_verify = false\ntls_ca = \"" + ca + "\"\n")
                .find("tls_ca: has no effect with tls_verify = false"),
            std::string::npos);
  EXPECT_NE(one_error(up + "tls = true\ntls_client_cert = \"" + cert + "\"\n")
                .find("tls_client_cert: needs tls_client_key too"),
            std::string::npos);
}

TEST(Config, Http2Keys) {
  const auto defaults = load("[proxy]\n");
  const auto& d = *defaults.cfg->proxy;
  EXPECT_TRUE(d.http2);
  EXPECT_EQ(d.http2_max_concurrent_streams, 128);  // nginx's http2_max_concurrent_streams
  EXPECT_EQ(d.http2_reset_burst, 1000);            // nghttp2's stream reset rate limit
  EXPECT_EQ(d.http2_reset_rate, 33);
  EXPECT_EQ(d.http2_max_continuations, 8);
  auto r = load(R"([proxy]
http2_max_concurrent_streams = 16
http2_reset_burst = 10
http2_reset_rate = 2
http2_control_burst = 50
http2_control_rate = 5
http2_max_continuations = 2
[proxy.upstreams.g]
servers = ["127.0.0.1:50051"]
protocol = "h2c"
max_streams = 7
[proxy.upstreams.s]
servers = ["127.0.0.1:443"]
protocol = "h2"
[[proxy.routes]]
path = "/"
domain = "api"
upstream = "g"
grpc_status = 14
)");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& p = *r.cfg->proxy;
  EXPECT_EQ(p.http2_max_concurrent_streams, 16);
  EXPECT_EQ(p.http2_reset_burst, 10);
  EXPECT_EQ(p.http2_reset_rate, 2);
  EXPECT_EQ(p.http2_control_burst, 50);
  EXPECT_EQ(p.http2_control_rate, 5);
  EXPECT_EQ(p.http2_max_continuations, 2);
  using proto = upstream_config::protocol_kind;
  EXPECT_EQ(p.upstreams[0].protocol, proto::h2c);
  EXPECT_EQ(p.upstreams[0].max_streams, 7);
  EXPECT_FALSE(p.upstreams[0].tls);
  EXPECT_EQ(p.upstreams[1].protocol, proto::h2);
  EXPECT_TRUE(p.upstreams[1].tls);  // h2 is over TLS
  EXPECT_EQ(p.routes[0].grpc_status, 14);

  EXPECT_NE(one_error("[proxy]\nhttp2 = false\nhttp2_reset_rate = 5\n")
                .find("proxy.http2_reset_rate: has no effect with http2 = false"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\nhttp2_max_concurrent_streams = 0\n").find("http2_max_concurrent_streams"),
            std::string::npos);
  const std::string up = "[proxy.upstreams.app]\nservers = [\"127.0.0.1:443\"]\n";
  EXPECT_NE(one_error(up + "protocol = \"h3\"\n").find("proxy.upstreams.app.protocol"), std::string::npos);
  EXPECT_NE(one_error(up + "max_streams = 5\n").find("max_streams: has no effect unless protocol"), std::string::npos);
  EXPECT_NE(one_error(up + "protocol = \"h2\"\ntls = false\n").find("is HTTP/2 over TLS"), std::string::npos);
  EXPECT_NE(one_error(up + "protocol = \"h2c\"\ntls = true\n").find("is HTTP/2 in the clear"), std::string::npos);
  const std::string route = up + "[[proxy.routes]]\npath = \"/\"\nupstream = \"app\"\n";
  EXPECT_NE(one_error(route + "domain = \"api\"\ngrpc_status = 3\n").find("expected 8 (RESOURCE_EXHAUSTED) or 14"),
            std::string::npos);
  EXPECT_NE(one_error(route + "grpc_status = 14\n").find("has no effect on a route without a domain"),
            std::string::npos);
}

TEST(Config, Shards) {
  auto r = load(R"([proxy]
accounting = ["tcp://a:10004", "tcp://b1:10004", "tcp://b2:10004"]
[[proxy.shards]]
domain = "api"
masters = ["tcp://a:10004", ["tcp://b1:10004", "tcp://b2:10004"]]
)");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& sh = r.cfg->proxy->shards;
  ASSERT_EQ(sh.size(), 1u);
  EXPECT_EQ(sh[0].domain, "api");
  EXPECT_EQ(sh[0].shares,
            (std::vector<std::vector<std::string>>{{"tcp://a:10004"}, {"tcp://b1:10004", "tcp://b2:10004"}}));
  const std::string head = "[proxy]\naccounting = [\"tcp://a:1\", \"tcp://b:1\"]\n";
  EXPECT_NE(one_error(head + "[[proxy.shards]]\ndomain = \"api\"\nmasters = [\"tcp://c:1\"]\n")
                .find("proxy.shards[0].masters[0]: \"tcp://c:1\" is not one of accounting"),
            std::string::npos);
  EXPECT_NE(one_error(head + "[[proxy.shards]]\ndomain = \"api\"\nmasters = [\"tcp://a:1\", [\"tcp://a:1\"]]\n")
                .find("is in two shares"),
            std::string::npos);
  EXPECT_NE(one_error(head + "shards = 3\n").find("proxy.shards: expected an array of { domain"), std::string::npos);
  EXPECT_NE(one_error(head + "shards = [1]\n").find("proxy.shards[0]: expected a table { domain"), std::string::npos);
  EXPECT_NE(one_error(head + "[[proxy.shards]]\nmasters = [\"tcp://a:1\"]\n").find("proxy.shards[0].domain: missing"),
            std::string::npos);
  EXPECT_NE(one_error(head + "[[proxy.shards]]\ndomain = \"api\"\n").find("proxy.shards[0].masters: expected an array"),
            std::string::npos);
  EXPECT_NE(one_error(head + "[[proxy.shards]]\ndomain = \"api\"\nmasters = [\"tcp://a:1\"]\n[[proxy.shards]]\n"
                             "domain = \"api\"\nmasters = [\"tcp://b:1\"]\n")
                .find("\"api\" is split twice"),
            std::string::npos);
}

TEST(Config, LoadFile) {
  const std::string path = ::testing::TempDir() + "/smockron_config_test.toml";
  std::ofstream(path) << "[master]\nstore = \"memory\"\n";
  auto r = load_file(path);
  ASSERT_TRUE(r.cfg);
  EXPECT_EQ(r.cfg->source, path);
  auto missing = load_file("/nonexistent/smockron.toml");
  ASSERT_EQ(missing.errors.size(), 1u);
  EXPECT_EQ(format(missing.errors[0]), "/nonexistent/smockron.toml: cannot open file");
}

// Settings a reload cannot change keep their running values, and are named for the log.
TEST(Config, RestartOnlyKeysKeepTheirRunningValues) {
  config::proxy_config running, next;
  running.threads = 2;
  running.listen = {"0.0.0.0", 8080};
  next = running;
  next.threads = 4;
  next.listen = {"0.0.0.0", 9090};
  next.max_delay = std::chrono::seconds(9);  // reloadable: taken as it is
  const std::string changed = config::restart_only<config::proxy_config>(running, next)
                                  .keep(&config::proxy_config::listen, "listen")
                                  .keep(&config::proxy_config::threads, "threads")
                                  .keep(&config::proxy_config::admin, "admin")
                                  .changed();
  EXPECT_EQ(changed, "listen, threads");
  EXPECT_EQ(next.threads, 2);
  EXPECT_EQ(next.listen, running.listen);
  EXPECT_EQ(next.max_delay, std::chrono::seconds(9));
  config::proxy_config same = running;
  EXPECT_EQ(config::restart_only<config::proxy_config>(running, same)
                .keep(&config::proxy_config::threads, "threads")
                .changed(),
            "");
}

TEST(Config, QuotaRules) {
  auto r = load(R"(
[master.domains.llm]
rules = [ { rate = "20000/min", burst = 20000 }, { quota = 1000000, per = "month" },
          { quota = 5000, per = "day", tz = "+05:30" }, { quota = 1, per = "week", tz = "UTC" },
          { quota = 50, per = "10s" } ]
)");
  for (const auto& e : r.errors) ADD_FAILURE() << format(e);
  ASSERT_TRUE(r.cfg);
  const auto* d = r.cfg->master->find_domain("llm");
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(d->rules.size(), 5u);
  EXPECT_FALSE(d->rules[0].is_quota());
  EXPECT_TRUE(d->rules[1].is_quota());
  EXPECT_EQ(d->rules[1].quota, 1'000'000);
  EXPECT_EQ(d->rules[1].per, quota_period::month);
  EXPECT_EQ(d->rules[1].tz_offset_s, 0);
  EXPECT_EQ(d->rules[2].per, quota_period::day);
  EXPECT_EQ(d->rules[2].tz_offset_s, 5 * 3600 + 30 * 60);
  EXPECT_EQ(d->rules[3].per, quota_period::week);
  EXPECT_EQ(d->rules[4].per, quota_period::fixed);
  EXPECT_EQ(d->rules[4].per_length, seconds(10));
}

TEST(Config, QuotaRuleErrors) {
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 10 }]\n").find("rules[0].per: missing"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 10, per = \"year\" }]\n")
                .find("rules[0].per: expected \"day\", \"week\", \"month\" or a duration such as \"1h\""),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 0, per = \"day\" }]\n")
                .find("rules[0].quota: must be between 1"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 5, per = \"day\", rate = \"1/s\" }]\n")
                .find("a rule is a rate ({ rate, burst }) or a quota ({ quota, per }), not both"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 5, per = \"day\", tz = \"Europe/Paris\" }]\n")
                .find("rules[0].tz: invalid time offset \"Europe/Paris\""),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 5, per = \"day\", tz = \"+15:00\" }]\n")
                .find("invalid time offset"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 5, per = \"500ms\" }]\n").find("at least 1s"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 5, per = \"1500ms\" }]\n").find("whole seconds"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 5, per = \"day\", tz = \"+14:30\" }]\n")
                .find("invalid time offset"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 1, per = \"day\" }, { quota = 2, per = \"day\" }, "
                      "{ quota = 3, per = \"day\" }, { quota = 4, per = \"day\" }, { quota = 5, per = \"day\" }]\n")
                .find("master.domains.a.rules: at most 4 quotas"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nrules = [{ quota = 5, per = \"day\", window = 3 }]\n").find("unknown key"),
            std::string::npos);
}

TEST(Config, RouteCost) {
  const auto route_with = [](const std::string& keys) {
    return "[proxy.upstreams.app]\nservers = [\"127.0.0.1:1\"]\n[[proxy.routes]]\ndomain = \"api\"\nupstream = "
           "\"app\"\n" +
           keys + "\n";
  };
  using kind = route_config::cost_source::kind;
  const auto parsed = [&](const std::string& keys) {
    auto r = load(route_with(keys));
    for (const auto& e : r.errors) ADD_FAILURE() << format(e);
    return r.cfg ? r.cfg->proxy->routes.at(0) : route_config{};
  };
  EXPECT_EQ(parsed("").cost.type, kind::constant);
  EXPECT_EQ(parsed("").cost.units, 1);
  EXPECT_EQ(parsed("cost = 5").cost.units, 5);
  EXPECT_EQ(parsed("cost = 0").cost.units, 0);
  EXPECT_EQ(parsed("cost = \"header:X-Cost\"").cost.type, kind::header);
  EXPECT_EQ(parsed("cost = \"header:X-Cost\"").cost.field, "x-cost");
  EXPECT_EQ(parsed("cost = \"request_bytes\"").cost.type, kind::request_bytes);
  const auto tokens = parsed("cost = \"response_header:X-Tokens-Used\"\ncost_max = 50000\ncost_default = 0");
  EXPECT_EQ(tokens.cost.type, kind::response_header);
  EXPECT_TRUE(tokens.cost.after_response());
  EXPECT_EQ(tokens.cost.field, "x-tokens-used");
  EXPECT_EQ(tokens.cost_max, 50'000);
  EXPECT_EQ(tokens.cost_default, 0);

  EXPECT_NE(one_error(route_with("cost = -1")).find("routes[0].cost: must be between 0 and 1000000000000"),
            std::string::npos);
  EXPECT_NE(one_error(route_with("cost_max = 10\ncost = 11")).find("cost_max: has no effect with a constant cost"),
            std::string::npos);
  EXPECT_NE(one_error(route_with("cost_default = 3")).find("cost_default: has no effect with a constant cost"),
            std::string::npos);
  EXPECT_NE(
      one_error(route_with("cost = \"request_bytes\"\ncost_default = 3")).find("has no effect with request_bytes"),
      std::string::npos);
  EXPECT_NE(one_error(route_with("cost = \"header:X\"\ncost_max = 10\ncost_default = 11"))
                .find("cost_default: must be at most cost_max (10)"),
            std::string::npos);
  EXPECT_NE(one_error(route_with("cost = \"tokens\"")).find("unknown cost \"tokens\""), std::string::npos);
  EXPECT_NE(one_error(route_with("cost = \"header:\"")).find("needs a field name"), std::string::npos);
  EXPECT_NE(one_error(route_with("cost = \"header:X Cost\"")).find("needs a field name"), std::string::npos);
  EXPECT_NE(one_error(route_with("cost = 1.5")).find("expected an integer or"), std::string::npos);
  EXPECT_NE(one_error(route_with("cost = \"header:X\"\ncost_max = 0")).find("cost_max: must be between 1"),
            std::string::npos);
  // A late cost's estimate: an integer or a request field, at most cost_max.
  const std::string late = "cost = \"response_header:X-Tokens-Used\"\ncost_max = 5000\n";
  EXPECT_FALSE(parsed(late).cost_estimate);
  const auto fixed = parsed(late + "cost_estimate = 300");
  ASSERT_TRUE(fixed.cost_estimate);
  EXPECT_EQ(fixed.cost_estimate->type, kind::constant);
  EXPECT_EQ(fixed.cost_estimate->units, 300);
  const auto field = parsed(late + "cost_estimate = \"header:X-Max-Tokens\"");
  ASSERT_TRUE(field.cost_estimate);
  EXPECT_EQ(field.cost_estimate->type, kind::header);
  EXPECT_EQ(field.cost_estimate->field, "x-max-tokens");
  EXPECT_NE(
      one_error(route_with(late + "cost_estimate = 5001")).find("cost_estimate: must be between 0 and cost_max (5000)"),
      std::string::npos);
  EXPECT_NE(one_error(route_with(late + "cost_estimate = \"header:\"")).find("needs a field name"), std::string::npos);
  const auto json = parsed(late + "cost_estimate = \"json:max_tokens\"");
  ASSERT_TRUE(json.cost_estimate);
  EXPECT_EQ(json.cost_estimate->type, kind::json_body);
  EXPECT_EQ(json.cost_estimate->field, "max_tokens");
  EXPECT_NE(one_error(route_with(late + "cost_estimate = \"json:\"")).find("needs a member name"), std::string::npos);
  EXPECT_NE(one_error(route_with(late + "cost_estimate = 'json:a\"b'")).find("needs a member name"), std::string::npos);
  EXPECT_NE(one_error(route_with(late + "cost_estimate = \"body:x\"")).find("expected an integer, \"header:NAME\""),
            std::string::npos);
  EXPECT_NE(one_error(route_with("cost = \"header:X\"\ncost_estimate = 3")).find("cost_estimate: has no effect unless"),
            std::string::npos);
  // A body's size as the cost: an integer, what a body without a length reserves.
  const auto body = parsed("cost = \"request_bytes\"\ncost_max = 5000\ncost_estimate = 4096");
  ASSERT_TRUE(body.cost_estimate);
  EXPECT_EQ(body.cost_estimate->units, 4096);
  EXPECT_NE(one_error(route_with("cost = \"request_bytes\"\ncost_estimate = \"header:X-Size\""))
                .find("with request_bytes, expected an integer"),
            std::string::npos);
  EXPECT_NE(one_error(route_with("cost = \"request_bytes\"\ncost_max = 10\ncost_estimate = 11"))
                .find("must be between 0 and cost_max (10)"),
            std::string::npos);
  EXPECT_NE(one_error(route_with("cost_estimate = 3")).find("cost_estimate: has no effect unless"), std::string::npos);
  // A route without a domain is not limited: a cost would do nothing.
  EXPECT_NE(one_error("[proxy.upstreams.app]\nservers = [\"127.0.0.1:1\"]\n[[proxy.routes]]\nupstream = \"app\"\n"
                      "cost = 3\n")
                .find("has no effect on a route without a domain"),
            std::string::npos);
}

TEST(Config, ConcurrencyRules) {
  auto r = load(R"(
[master.domains.llm]
rules = [ { rate = "10/s", burst = 20 }, { concurrency = 4 } ]
overrides = [
  { identifier = "batch", rules = [ { concurrency = 16 } ] },
  { identifier = "vip", rules = [ { rate = "100/s", burst = 100 } ] },
]
)");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& d = *r.cfg->master->find_domain("llm");
  EXPECT_EQ(d.concurrency, 4);
  ASSERT_EQ(d.rules.size(), 1u);  // the rate rule alone: a concurrency rule is not one of the rules over time
  EXPECT_EQ(d.overrides[0].concurrency, 16);
  EXPECT_TRUE(d.overrides[0].rules.empty());
  EXPECT_EQ(d.overrides[1].concurrency, 0);  // an override's rules replace the domain's: no concurrency limit
  const std::string head = "[master.domains.a]\n";
  EXPECT_NE(one_error(head + "rules = [{ concurrency = 0 }]\n").find("rules[0].concurrency: must be between 1"),
            std::string::npos);
  EXPECT_NE(one_error(head + "rules = [{ concurrency = 1000001 }]\n").find("must be between 1"), std::string::npos);
  EXPECT_NE(one_error(head + "rules = [{ concurrency = 2, rate = \"1/s\" }]\n").find("has no other key"),
            std::string::npos);
  EXPECT_NE(one_error(head + "rules = [{ concurrency = 2 }, { concurrency = 3 }]\n").find("at most one concurrency"),
            std::string::npos);
  EXPECT_NE(one_error(head + "rules = [{ concurrency = \"2\" }]\n").find("expected an integer"), std::string::npos);
}

TEST(Config, OverrideRulesFromTheApi) {
  auto ok = config::parse_override_rules("vip", "rules = [ { rate = \"100/s\", burst = 20 }, { concurrency = 8 } ]");
  ASSERT_TRUE(std::holds_alternative<config::override_config>(ok));
  const auto& o = std::get<config::override_config>(ok);
  EXPECT_EQ(o.identifier, "vip");
  ASSERT_EQ(o.rules.size(), 1u);
  EXPECT_EQ(o.rules[0].burst, 20);
  EXPECT_EQ(o.concurrency, 8);
  const auto error = [](std::string_view text) {
    auto r = config::parse_override_rules("vip", text);
    return std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : std::string("(accepted)");
  };
  EXPECT_EQ(error("rules = []"), "(accepted)");  // no limit for this client
  EXPECT_NE(error("rules = [ { rate = \"1/s\", burst = 0 } ]").find("rules[0].burst: must be between 1"),
            std::string::npos);
  EXPECT_NE(error("rules = [").find("not TOML"), std::string::npos);
  EXPECT_NE(error("").find("missing rules"), std::string::npos);
  EXPECT_NE(error("rules = []\nlimit = 3").find("unknown key"), std::string::npos);
  EXPECT_NE(std::get<std::string>(config::parse_override_rules("", "rules = []")).find("1 to 1024 bytes"),
            std::string::npos);
}

TEST(Config, AdminTokenFile) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/token-good", weak = dir + "/token-weak";
  std::ofstream(good) << "  a-token-of-sufficient-length\n";
  std::ofstream(weak) << "short\n";
  auto r = load("[master]\nadmin_token_file = \"" + good + "\"\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  EXPECT_EQ(r.cfg->master->admin_token, "a-token-of-sufficient-length");
  EXPECT_NE(one_error("[master]\nadmin_token_file = \"" + weak + "\"\n").find("at least 16 characters"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nadmin_token_file = \"/nonexistent/token\"\n").find("cannot read"), std::string::npos);
}

TEST(Config, CurveKeys) {
  const std::string dir = ::testing::TempDir();
  const auto master = zmtp::curve::generate(), gk = zmtp::curve::generate(), previous = zmtp::curve::generate();
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const auto m_key = write("m.key", zmtp::curve::z85_encode(master.secret_key) + "\n");
  const auto m_old = write("m-old.key", zmtp::curve::z85_encode(previous.secret_key) + "\n");
  const auto m_pub = write("m.pub", zmtp::curve::z85_encode(master.public_key) + "\n");
  const auto g_key = write("g.key", zmtp::curve::z85_encode(gk.secret_key) + "\n");
  const auto allowed = write("allowed", zmtp::curve::z85_encode(gk.public_key) + " gk-1\n");

  auto r = load("[master]\ncurve_secret_key = [\"" + m_key + "\", \"" + m_old + "\"]\ncurve_allowed_keys = \"" +
                allowed + "\"\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& keys = *r.cfg->master->curve;
  ASSERT_EQ(keys.own.size(), 2u);
  EXPECT_EQ(keys.own[0].public_key, master.public_key) << "the first is current";
  EXPECT_EQ(keys.allowed, std::set<zmtp::curve::key>{gk.public_key});
  EXPECT_FALSE(load("[master]\n").cfg->master->curve) << "plaintext by default";

  // The proxy: one key for every endpoint, or one per endpoint.
  r = load(
      "[proxy]\naccounting = [\"tcp://10.0.0.1:10004\"]\ncontrol = [\"tcp://10.0.0.1:10005\"]\n"
      "curve_secret_key = \"" +
      g_key + "\"\ncurve_master_key = \"" + m_pub + "\"\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto acc = r.cfg->proxy->curve_for("tcp://10.0.0.1:10004");
  ASSERT_TRUE(acc);
  EXPECT_EQ(acc->server, master.public_key);
  EXPECT_EQ(acc->own.public_key, gk.public_key);
  EXPECT_EQ(r.cfg->proxy->curve_for("tcp://10.0.0.1:10005"), acc);
  r = load(
      "[proxy]\naccounting = [\"tcp://10.0.0.1:10004\"]\ncontrol = [\"tcp://10.0.0.1:10005\"]\n"
      "curve_secret_key = \"" +
      g_key + "\"\ncurve_master_key = { \"tcp://10.0.0.1:10004\" = \"" + m_pub + "\", \"tcp://10.0.0.1:10005\" = \"" +
      zmtp::curve::z85_encode(previous.public_key) + "\" }\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  EXPECT_EQ(r.cfg->proxy->curve_for("tcp://10.0.0.1:10005")->server, previous.public_key);

  const auto err = [&](const std::string& text, std::string_view want) {
    const std::string e = one_error(text);
    EXPECT_NE(e.find(want), std::string::npos) << e;
  };
  err("[master]\ncurve_secret_key = \"" + m_key + "\"\n", "needs curve_allowed_keys too");
  err("[master]\ncurve_allowed_keys = \"" + allowed + "\"\n", "needs curve_secret_key too");
  err("[master]\ncurve_secret_key = [\"" + m_key + "\", \"" + m_key + "\", \"" + m_key +
          "\"]\ncurve_allowed_keys = \"" + allowed + "\"\n",
      "one or two keys");
  // Keys named but empty: an error, not plaintext links without a word.
  err("[master]\ncurve_secret_key = []\ncurve_allowed_keys = \"" + allowed + "\"\n", "one or two keys");
  err("[master]\ncurve_secret_key = \"" + m_key + "\"\ncurve_allowed_keys = \"\"\n",
      "expected the path of the gatekeepers' key list");
  err("[proxy]\ncurve_secret_key = \"\"\ncurve_master_key = \"" + m_pub + "\"\n", "cannot read key file");
  err("[master]\ncurve_secret_key = \"/nonexistent\"\ncurve_allowed_keys = \"" + allowed + "\"\n",
      "cannot read key file");
  err("[master]\ncurve_secret_key = \"" + m_key + "\"\ncurve_allowed_keys = \"" + write("bad", "nope\n") + "\"\n",
      "not a Z85 public key");
  err("[proxy]\ncurve_secret_key = \"" + g_key + "\"\n", "needs curve_master_key too");
  err("[proxy]\ncurve_secret_key = \"" + g_key + "\"\ncurve_master_key = { \"tcp://127.0.0.1:10004\" = \"" + m_pub +
          "\" }\n",
      "names no key for the endpoint \"tcp://127.0.0.1:10005\"");
  err("[proxy]\ncurve_secret_key = \"" + g_key + "\"\ncurve_master_key = { \"tcp://elsewhere:1\" = \"" + m_pub +
          "\" }\n",
      "not one of the accounting or control endpoints");
  err("[proxy]\ncurve_secret_key = \"" + g_key + "\"\ncurve_master_key = 5\n", "expected a key");
  err("[proxy]\ncurve_secret_key = \"" + m_pub + "x\"\ncurve_master_key = \"" + m_pub + "\"\n", "cannot read key file");
}

TEST(Config, PlaintextLinksOffThisHostAreWarnedOf) {
  auto r = load(
      "[master]\naccounting = \"tcp://0.0.0.0:10004\"\ncontrol = \"ipc:///run/c\"\n"
      "[proxy]\naccounting = [\"tcp://127.0.0.1:10004\", \"tcp://10.1.2.3:10004\"]\n"
      "control = [\"tcp://[::1]:10005\"]\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto w = config::warnings(*r.cfg);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_TRUE(w[0].starts_with("[master] accounting tcp://0.0.0.0:10004 is not loopback")) << w[0];
  EXPECT_TRUE(w[1].starts_with("[proxy] accounting tcp://10.1.2.3:10004")) << w[1];
  EXPECT_TRUE(config::warnings(*load("[master]\n").cfg).empty()) << "the loopback defaults";

  // A secret key file others can read.
  const std::string dir = ::testing::TempDir();
  const auto kp = zmtp::curve::generate();
  const std::string key = dir + "/open.key", list = dir + "/open.allowed";
  std::ofstream(key) << zmtp::curve::z85_encode(kp.secret_key) << "\n";
  std::ofstream(list) << zmtp::curve::z85_encode(kp.public_key) << "\n";
  ::chmod(key.c_str(), 0644);
  const std::string text = "[master]\ncurve_secret_key = \"" + key + "\"\ncurve_allowed_keys = \"" + list + "\"\n";
  auto open = config::warnings(*load(text).cfg);
  ASSERT_EQ(open.size(), 1u);
  EXPECT_NE(open[0].find("readable by its group or others"), std::string::npos) << open[0];
  ::chmod(key.c_str(), 0600);
  EXPECT_TRUE(config::warnings(*load(text).cfg).empty());
}

TEST(Config, SharedConcurrency) {
  auto r = load("[master.domains.llm]\nrules = [ { concurrency = 4 } ]\nshared = [ { concurrency = 64 } ]\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  EXPECT_EQ(r.cfg->master->find_domain("llm")->shared_concurrency, 64);
  EXPECT_EQ(r.cfg->master->find_domain("llm")->concurrency, 4);
  EXPECT_NE(one_error("[master.domains.a]\nshared = [ { quota = 10, per = \"day\" } ]\n")
                .find("a shared limit is a rate or a concurrency limit"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\nshared = [ { concurrency = 0 } ]\n").find("must be between 1"),
            std::string::npos);
}

TEST(Config, Tiers) {
  auto r = load(R"(
[master.domains.api]
rules = [ { rate = "10/s", burst = 20 } ]
[master.domains.api.tiers.pro]
rules = [ { rate = "100/s", burst = 200 }, { concurrency = 16 }, { quota = 1000000, per = "month" } ]
[master.domains.api.tiers.enterprise]
rules = []
)");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& d = *r.cfg->master->find_domain("api");
  ASSERT_EQ(d.tiers.size(), 2u);
  EXPECT_EQ(d.tiers[0].name, "enterprise");  // sorted by name
  EXPECT_TRUE(d.tiers[0].rules.empty());
  EXPECT_EQ(d.tiers[1].name, "pro");
  ASSERT_EQ(d.tiers[1].rules.size(), 2u);
  EXPECT_EQ(d.tiers[1].rules[0].burst, 200);
  EXPECT_TRUE(d.tiers[1].rules[1].is_quota());
  EXPECT_EQ(d.tiers[1].concurrency, 16);
  const std::string head = "[master.domains.a]\n";
  EXPECT_NE(one_error(head + "tiers = 3\n").find("master.domains.a.tiers: expected a table of tiers"),
            std::string::npos);
  EXPECT_NE(one_error(head + "[master.domains.a.tiers.\"a b\"]\nrules = []\n").find("a tier's name is 1 to 64"),
            std::string::npos);
  EXPECT_NE(one_error(head + "[master.domains.a.tiers.pro]\n").find("master.domains.a.tiers.pro.rules: missing"),
            std::string::npos);
  EXPECT_NE(one_error(head + "[master.domains.a.tiers.pro]\nrules = []\nlimit = 2\n").find("unknown key"),
            std::string::npos);
  EXPECT_NE(one_error(head + "[master.domains.a.tiers.pro]\nrules = [{ rate = \"1/s\", burst = 0 }]\n")
                .find("master.domains.a.tiers.pro.rules[0].burst: must be between 1"),
            std::string::npos);
  std::string many = head;
  for (int i = 0; i <= 64; ++i) many += "[master.domains.a.tiers.t" + std::to_string(i) + "]\nrules = []\n";
  EXPECT_NE(one_error(many).find("at most 64 tiers"), std::string::npos);
}

TEST(Config, RouteTier) {
  const std::string up = "[proxy.upstreams.u]\nservers = [\"127.0.0.1:1\"]\n";
  const std::string route = "[[proxy.routes]]\ndomain = \"d\"\nupstream = \"u\"\n";
  auto r = load(up + route + "tier = \"header:X-Plan\"\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& tier = r.cfg->proxy->routes[0].tier;
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->type, config::identifier_source::kind::header);
  EXPECT_EQ(tier->name, "X-Plan");
  EXPECT_FALSE(tier->hash);
  auto j = load("[proxy.jwt]\nhs256_secret = \"s3cret\"\n" + up + route + "tier = \"jwt:plan\"\n");
  ASSERT_TRUE(j.cfg) << (j.errors.empty() ? "" : format(j.errors[0]));
  EXPECT_EQ(j.cfg->proxy->routes[0].tier->type, config::identifier_source::kind::jwt);
  EXPECT_FALSE(load(up + route).cfg->proxy->routes[0].tier);
  EXPECT_NE(one_error(up + route + "tier = \"jwt:plan\"\n").find("a jwt: tier needs [proxy.jwt]"), std::string::npos);
  EXPECT_NE(one_error(up + route + "tier = \"ip\"\n").find("proxy.routes[0].tier: expected \"jwt:CLAIM\""),
            std::string::npos);
  EXPECT_NE(one_error(up + route + "tier = \"token\"\n").find("expected \"jwt:CLAIM\""), std::string::npos);
  EXPECT_NE(one_error(up + "[[proxy.routes]]\nupstream = \"u\"\ntier = \"header:X-Plan\"\n")
                .find("proxy.routes[0].tier: has no effect on a route without a domain"),
            std::string::npos);
}

TEST(Config, SharedRate) {
  auto r = load(
      "[master.domains.llm]\nrules = [ { rate = \"100/s\", burst = 100 } ]\n"
      "shared = [ { rate = \"1000/s\", burst = 2000 }, { concurrency = 64 } ]\nshare_window = \"30s\"\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& d = *r.cfg->master->find_domain("llm");
  ASSERT_TRUE(d.shared_rate);
  EXPECT_EQ(d.shared_rate->r.interval_us(), 1000);
  EXPECT_EQ(d.shared_rate->burst, 2000);
  EXPECT_EQ(d.shared_concurrency, 64);
  EXPECT_EQ(d.share_window, std::chrono::seconds(30));
  EXPECT_EQ(load("[master.domains.a]\nrules = []\n").cfg->master->find_domain("a")->share_window,
            std::chrono::seconds(10));
  const std::string head = "[master.domains.a]\n";
  EXPECT_NE(one_error(head + "shared = [ { rate = \"1/s\", burst = 1 }, { rate = \"60/min\", burst = 1 } ]\n")
                .find("at most one shared rate"),
            std::string::npos);
  EXPECT_NE(one_error(head + "share_window = \"5s\"\n").find("has no effect without a shared rate"), std::string::npos);
  EXPECT_NE(
      one_error(head + "shared = [ { rate = \"1/s\", burst = 1 } ]\nshare_window = \"11m\"\n").find("at most 10m"),
      std::string::npos);
  EXPECT_NE(
      one_error(head + "shared = [ { rate = \"1/s\", burst = 1 } ]\nshare_window = \"10ms\"\n").find("share_window"),
      std::string::npos);
}

TEST(Config, EnvoyRateLimitServices) {
  auto r = load(R"(
[master]
rls = "127.0.0.1:10007"
rls_allow = ["10.0.0.0/8"]
rls_unknown_domain = "deny"
rlqs_max_buckets = 500
[master.domains.api]
rules = []
descriptor_keys = ["tenant", "api_key"]
descriptor_separator = ":"
envoy_mode = "shadow"
)");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& m = *r.cfg->master;
  ASSERT_TRUE(m.rls);
  EXPECT_EQ(m.rls->port, 10007);
  EXPECT_EQ(m.rls_allow.size(), 1u);
  EXPECT_TRUE(m.rls_deny_unknown);
  EXPECT_EQ(m.rlqs_max_buckets, 500u);
  const auto& d = *m.find_domain("api");
  EXPECT_EQ(d.descriptor_keys, (std::vector<std::string>{"tenant", "api_key"}));
  EXPECT_EQ(d.descriptor_separator, ":");
  EXPECT_TRUE(d.envoy_shadow);
  // Defaults: off, allow, every entry joined by "|", enforce.
  const auto def = load("[master.domains.a]\nrules = []\n");
  EXPECT_FALSE(def.cfg->master->rls);
  EXPECT_FALSE(def.cfg->master->rls_deny_unknown);
  EXPECT_EQ(def.cfg->master->find_domain("a")->descriptor_separator, "|");
  EXPECT_FALSE(def.cfg->master->find_domain("a")->envoy_shadow);
  for (const char* k : {"rls_allow = []", "rls_unknown_domain = \"deny\"", "rlqs_max_buckets = 5"}) {
    EXPECT_NE(one_error(std::string("[master]\n") + k + "\n").find("has no effect without rls"), std::string::npos)
        << k;
  }
  EXPECT_NE(one_error("[master]\nrls = \"127.0.0.1:1\"\nrls_unknown_domain = \"maybe\"\n")
                .find("unknown answer \"maybe\" (use \"allow\" or \"deny\")"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\nrls = \"localhost:1\"\n").find("is not an IP address"), std::string::npos);
  const std::string head = "[master.domains.a]\nrules = []\n";
  EXPECT_NE(one_error(head + "descriptor_keys = [\"\"]\n").find("an entry key is not empty"), std::string::npos);
  EXPECT_NE(one_error(head + "descriptor_separator = \"123456789\"\n").find("at most 8 bytes"), std::string::npos);
  EXPECT_NE(one_error(head + "envoy_mode = \"loud\"\n").find("unknown mode \"loud\""), std::string::npos);
  std::string many = "descriptor_keys = [";
  for (int i = 0; i < 17; ++i) many += "\"k" + std::to_string(i) + "\",";
  EXPECT_NE(one_error(head + many + "]\n").find("at most 16 keys"), std::string::npos);
}

TEST(Config, WeightsOfOverridesAndTiers) {
  auto r = load(R"(
[master.domains.llm]
rules = []
shared = [ { concurrency = 64 } ]
overrides = [ { identifier = "big", rules = [], weight = 4 } ]
[master.domains.llm.tiers.pro]
rules = []
weight = 3
)");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& d = *r.cfg->master->find_domain("llm");
  EXPECT_EQ(d.overrides[0].weight, 4);
  EXPECT_EQ(d.tiers[0].weight, 3);
  EXPECT_NE(one_error("[master.domains.a]\noverrides = [ { identifier = \"x\", rules = [], weight = 0 } ]\n")
                .find("weight: must be between 1 and 1000"),
            std::string::npos);
  EXPECT_NE(one_error("[master.domains.a]\noverrides = [ { identifier = \"x\", rules = [], weight = 2 } ]\n")
                .find("a weight has no effect without shared limits"),
            std::string::npos);
  auto api = config::parse_override_rules("vip", "rules = []\nweight = 5");
  ASSERT_TRUE(std::holds_alternative<config::override_config>(api));
  EXPECT_EQ(std::get<config::override_config>(api).weight, 5);
}

TEST(Config, MastersFoundByDns) {
  auto r = load(
      "[proxy]\naccounting = [\"srv+tcp://_acc._tcp.masters\", \"tcp://127.0.0.1:10004\"]\n"
      "control = [\"dns+tcp://masters.default.svc:10005\"]\n"
      "dns_servers = [\"10.96.0.10\", \"127.0.0.1:5353\", \"[::1]:53\"]\ndns_min_ttl = \"2s\"\ndns_max_ttl = \"30s\"\n"
      "dns_max_masters = 8\n"
      "[[proxy.shards]]\ndomain = \"api\"\nmasters = [\"srv+tcp://_acc._tcp.masters\", \"tcp://127.0.0.1:10004\"]\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  const auto& p = *r.cfg->proxy;
  EXPECT_TRUE(p.discovers_masters());
  EXPECT_EQ(p.dns_servers.size(), 3u);
  EXPECT_EQ(p.dns_min_ttl, std::chrono::seconds(2));
  EXPECT_EQ(p.dns_max_ttl, std::chrono::seconds(30));
  EXPECT_EQ(p.dns_max_masters, 8);
  const auto w = config::warnings(*r.cfg);
  ASSERT_EQ(w.size(), 2u) << "names are not loopback: plaintext to them is warned of";
  EXPECT_TRUE(w[0].starts_with("[proxy] accounting srv+tcp://_acc._tcp.masters is not loopback")) << w[0];
  EXPECT_FALSE(load("[proxy]\naccounting = [\"tcp://127.0.0.1:1\"]\n").cfg->proxy->discovers_masters());

  EXPECT_NE(one_error("[proxy]\naccounting = [\"dns+tcp://masters\"]\n")
                .find("invalid endpoint \"dns+tcp://masters\" (expected dns+tcp://name:port or srv+tcp://name)"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\ncontrol = [\"srv+tcp://a..b\"]\n").find("invalid endpoint"), std::string::npos);
  EXPECT_NE(one_error("[proxy]\ndns_max_ttl = \"10s\"\n")
                .find("has no effect without a dns+tcp:// or srv+tcp:// accounting or control endpoint"),
            std::string::npos);
  const std::string named = "[proxy]\naccounting = [\"srv+tcp://m\"]\n";
  EXPECT_NE(one_error(named + "dns_min_ttl = \"10s\"\ndns_max_ttl = \"5s\"\n").find("dns_max_ttl is below dns_min_ttl"),
            std::string::npos);
  EXPECT_NE(one_error(named + "dns_min_ttl = \"2m\"\n").find("dns_min_ttl is above dns_max_ttl (60s unless given)"),
            std::string::npos);
  EXPECT_NE(one_error(named + "dns_min_ttl = \"10ms\"\n").find("must be at least"), std::string::npos);
  EXPECT_NE(one_error(named + "dns_servers = [\"kube-dns.kube-system:53\"]\n").find("invalid DNS server"),
            std::string::npos);
  EXPECT_NE(one_error(named + "dns_servers = [\"dns.example\"]\n").find("invalid DNS server \"dns.example\""),
            std::string::npos);
  EXPECT_NE(one_error(named + "dns_max_masters = 0\n").find("must be between 1"), std::string::npos);
}

TEST(Config, Traces) {
  auto r = load(
      "[master]\ntrace_endpoint = \"http://otel-collector:4318\"\ntrace_sample = 0.25\n"
      "[proxy]\ntrace_endpoint = \"http://127.0.0.1:4318/v1/traces\"\ntrace_max_queued = 500\n"
      "trace_interval = \"200ms\"\n");
  ASSERT_TRUE(r.cfg) << (r.errors.empty() ? "" : format(r.errors[0]));
  EXPECT_EQ(r.cfg->master->trace.to, (http_url{"otel-collector", 4318, "/v1/traces"}));
  EXPECT_EQ(r.cfg->master->trace.sample, 0.25);
  EXPECT_EQ(r.cfg->proxy->trace.max_queued, 500);
  EXPECT_EQ(r.cfg->proxy->trace.interval, std::chrono::milliseconds(200));
  EXPECT_FALSE(load("[proxy]\n").cfg->proxy->trace.on()) << "off unless asked for";
  EXPECT_NE(one_error("[proxy]\ntrace_endpoint = \"https://c:4318\"\n").find("expected an OTLP/HTTP URL"),
            std::string::npos);
  EXPECT_NE(one_error("[master]\ntrace_sample = 0.5\n").find("has no effect without trace_endpoint"),
            std::string::npos);
  EXPECT_NE(one_error("[proxy]\ntrace_endpoint = \"http://c\"\ntrace_sample = 2\n").find("between"), std::string::npos);
}
