// The [master] table: endpoints, store, domains with their rules and
// per-identifier overrides, and what the rules compile to.
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "shared/config/config.hpp"
#include "shared/config/config_reader.hpp"
#include "shared/protocol/wire.hpp"
#include "shared/protocol/wire_lease.hpp"

namespace smockron::config {
namespace {

using detail::both_or_neither;
using detail::check_domain_name;
using detail::check_log_level;
using detail::check_stream_endpoint;
using detail::check_trace;
using detail::each_table;
using detail::reader;
using detail::sink;
using detail::type_name;

// A weight in the shared limits: this many even shares at most.
constexpr std::int64_t k_max_weight = 1000;

// `tz` of a quota: "UTC" or a fixed offset "+HH:MM" / "-HH:MM" (no zone
// database: an offset that changes with daylight saving is not expressible).
std::optional<std::int64_t> parse_tz(std::string_view tz) {
  if (tz == "UTC" || tz == "Z") return 0;
  if (tz.size() != 6 || (tz[0] != '+' && tz[0] != '-') || tz[3] != ':') return std::nullopt;
  const auto digit = [&](std::size_t i) { return tz[i] >= '0' && tz[i] <= '9'; };
  if (!digit(1) || !digit(2) || !digit(4) || !digit(5)) return std::nullopt;
  const int hours = (tz[1] - '0') * 10 + (tz[2] - '0');
  const int minutes = (tz[4] - '0') * 10 + (tz[5] - '0');
  if (hours > 14 || minutes > 59 || (hours == 14 && minutes > 0)) return std::nullopt;
  return (tz[0] == '-' ? -1 : 1) * (hours * 3600 + minutes * 60);
}

void read_quota(reader& r, sink& s, rule_config& rule) {
  r.integer("quota", rule.quota, 1, wire::max_quota_limit);  // what QUOTA can describe
  constexpr std::array<std::string_view, 3> periods{"day", "week", "month"};
  const auto* per = r.typed<toml::value<std::string>>("per", "\"day\", \"week\", \"month\" or a duration");
  if (per == nullptr) {
    if (!r.table().contains("per")) {
      s.add(r.table(), r.key("per"), "missing (a quota needs per = \"day\", \"week\", \"month\" or a duration)");
    }
  } else if (const auto it = std::find(periods.begin(), periods.end(), per->get()); it != periods.end()) {
    rule.per = static_cast<quota_period>(it - periods.begin());
  } else {
    auto parsed = parse_duration(per->get());
    if (auto* err = std::get_if<std::string>(&parsed)) {
      s.add(*per, r.key("per"), "expected \"day\", \"week\", \"month\" or a duration such as \"1h\": " + *err);
    } else if (const auto length = std::get<microseconds>(parsed);
               length < std::chrono::seconds(1) || length % std::chrono::seconds(1) != microseconds(0) ||
               length > std::chrono::seconds(wire::max_quota_length_s)) {
      s.add(*per, r.key("per"),
            "a quota's window is whole seconds, at least 1s and at most " + std::to_string(wire::max_quota_length_s) +
                "s");
    } else {
      rule.per = quota_period::fixed;
      rule.per_length = std::get<microseconds>(parsed);
    }
  }
  std::string tz;
  r.string("tz", tz);
  if (!tz.empty()) {
    if (auto offset = parse_tz(tz)) rule.tz_offset_s = *offset;
    else s.add(*r.get("tz"), r.key("tz"), "invalid time offset \"" + tz + "\" (use \"UTC\" or \"+HH:MM\")");
  }
}

void read_rule(const toml::node& n, const std::string& path, sink& s, std::vector<rule_config>& out,
               std::int64_t& concurrency) {
  const auto* t = n.as_table();
  if (!t) {
    s.add(n, path,
          "expected a table { rate = \"10/s\", burst = 20 }, { quota = 1000000, per = \"month\" } or "
          "{ concurrency = 4 }, got " +
              std::string(type_name(n)));
    return;
  }
  reader r(*t, path, s);
  rule_config rule;
  if (t->contains("concurrency")) {
    if (t->size() > 1) {
      s.add(n, path, "a concurrency rule has no other key ({ concurrency = N })");
      for (const auto& [k, v] : *t) r.get(k.str());  // reported above, not again as unknown keys
    }
    if (concurrency > 0) s.add(n, path, "at most one concurrency rule");
    std::int64_t limit = 0;
    r.integer("concurrency", limit, 1, wire::max_concurrency);
    if (limit > 0 && concurrency == 0) concurrency = limit;
    return;
  }
  if (t->contains("quota")) {
    if (t->contains("rate") || t->contains("burst")) {
      s.add(n, path, "a rule is a rate ({ rate, burst }) or a quota ({ quota, per }), not both");
      r.get("rate");  // reported above, not again as unknown keys
      r.get("burst");
    }
    read_quota(r, s, rule);
    if (rule.is_quota()) out.push_back(rule);
    return;
  }
  if (auto* rate_node = r.typed<toml::value<std::string>>("rate", "a rate string such as \"10/s\"")) {
    auto parsed = parse_rate(rate_node->get());
    if (auto* err = std::get_if<std::string>(&parsed)) s.add(*rate_node, r.key("rate"), *err);
    else rule.r = std::get<rate>(parsed);
  } else if (!t->contains("rate")) {
    s.add(n, r.key("rate"), "missing (every rule needs a rate, or a quota)");
  }
  r.integer("burst", rule.burst, 1, 1'000'000);
  if (rule.r.count > 0) out.push_back(rule);
}

// A `rules` array (a domain's, or an override's): `n` is the node, if any.
// `concurrency`: set by a { concurrency = N } rule.
void read_rules(const toml::node* n, const std::string& path, sink& s, std::vector<rule_config>& out,
                std::int64_t& concurrency) {
  if (!n) return;
  if (const auto* arr = n->as_array()) {
    for (std::size_t i = 0; i < arr->size(); ++i) {
      read_rule((*arr)[i], path + "[" + std::to_string(i) + "]", s, out, concurrency);
    }
    // Every quota is described to the gatekeepers (QUOTA carries at most max_quota_items).
    if (std::count_if(out.begin(), out.end(), [](const rule_config& r) { return r.is_quota(); }) >
        static_cast<std::ptrdiff_t>(wire::max_quota_items)) {
      s.add(*n, path, "at most " + std::to_string(wire::max_quota_items) + " quotas");
    }
  } else {
    s.add(*n, path, "expected an array of rules, got " + std::string(type_name(*n)));
  }
}

// `shared`: limits over all the domain's identifiers together: a concurrency
// limit (its slots split max-min among the identifiers that want them) and a
// rate (its units split max-min among the identifiers active in the last
// share_window).
void read_shared(reader& r, sink& s, domain_config& d) {
  const toml::node* n = r.get("shared");
  std::vector<rule_config> over_time;
  if (n) read_rules(n, r.key("shared"), s, over_time, d.shared_concurrency);
  if (std::any_of(over_time.begin(), over_time.end(), [](const rule_config& c) { return c.is_quota(); })) {
    s.add(*n, r.key("shared"), "a shared limit is a rate or a concurrency limit (shared quotas are not supported)");
  } else if (over_time.size() > 1) {
    s.add(*n, r.key("shared"), "at most one shared rate");
  } else if (over_time.size() == 1) {
    d.shared_rate = over_time.front();
  }
  if (r.table().contains("share_window")) {
    r.duration("share_window", d.share_window, std::chrono::seconds(1));
    if (d.share_window > std::chrono::minutes(10)) {
      s.add(*r.get("share_window"), r.key("share_window"), "at most 10m");
    } else if (!d.shared_rate) {
      s.add(*r.get("share_window"), r.key("share_window"), "has no effect without a shared rate");
    }
  }
}

void read_overrides(reader& r, sink& s, std::vector<override_config>& out) {
  const toml::node* n = r.get("overrides");
  if (!n) return;
  std::set<std::string, std::less<>> seen;
  each_table(*n, r.key("overrides"), s, "{ identifier = \"...\", rules = [...] }",
             [&](const toml::node& item, reader& orr) {
               override_config oc;
               if (auto* id = orr.typed<toml::value<std::string>>("identifier", "a string")) {
                 oc.identifier = id->get();
                 if (oc.identifier.empty()) s.add(*id, orr.key("identifier"), "must not be empty");
                 else if (oc.identifier.size() > wire::max_identifier_bytes) {
                   s.add(*id, orr.key("identifier"), "longer than 1024 bytes (no gatekeeper sends such an identifier)");
                 } else if (!seen.insert(oc.identifier).second) {
                   s.add(*id, orr.key("identifier"), "\"" + oc.identifier + "\" has another override in this domain");
                 }
               } else if (!orr.table().contains("identifier")) {
                 s.add(item, orr.key("identifier"), "missing (every override names the identifier it is for)");
               }
               orr.integer("weight", oc.weight, 1, k_max_weight);
               if (const toml::node* rules = orr.get("rules")) {
                 read_rules(rules, orr.key("rules"), s, oc.rules, oc.concurrency);
               } else {
                 s.add(item, orr.key("rules"), "missing (rules = [] for no limit)");
               }
               out.push_back(std::move(oc));
             });
}

// `tiers`: a table of rule sets by name ([master.domains.X.tiers.NAME] rules = [...]).
void read_tiers(reader& r, sink& s, domain_config& d) {
  const toml::node* n = r.get("tiers");
  if (!n) return;
  const auto* t = n->as_table();
  if (!t) {
    s.add(*n, r.key("tiers"),
          "expected a table of tiers ([master.domains.X.tiers.NAME]), got " + std::string(type_name(*n)));
    return;
  }
  if (t->size() > max_tiers) {
    s.add(*n, r.key("tiers"), "at most " + std::to_string(max_tiers) + " tiers (each is published every second)");
  }
  for (auto&& [k, v] : *t) {
    const std::string path = r.key("tiers") + "." + std::string(k.str());
    tier_config tc;
    tc.name = std::string(k.str());
    if (!wire::valid_tier_name(tc.name)) {
      s.add(v, path, "a tier's name is 1 to " + std::to_string(wire::max_tier_bytes) + " of A-Z a-z 0-9 . _ -");
    }
    const auto* tt = v.as_table();
    if (!tt) {
      s.add(v, path, "expected a table { rules = [...] }, got " + std::string(type_name(v)));
      continue;
    }
    reader tr(*tt, path, s);
    tr.integer("weight", tc.weight, 1, k_max_weight);
    if (const toml::node* rules = tr.get("rules")) read_rules(rules, tr.key("rules"), s, tc.rules, tc.concurrency);
    else s.add(v, tr.key("rules"), "missing (rules = [] for no limit)");
    d.tiers.push_back(std::move(tc));
  }
  std::sort(d.tiers.begin(), d.tiers.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
}

void read_domain(std::string_view name, const toml::node& n, const std::string& path, sink& s,
                 std::vector<domain_config>& out) {
  domain_config d;
  d.name = std::string(name);
  if (auto msg = check_domain_name(name); !msg.empty()) s.add(n, path, msg);
  const auto* t = n.as_table();
  if (!t) {
    s.add(n, path, "expected a table, got " + std::string(type_name(n)));
    return;
  }
  reader r(*t, path, s);
  std::string algo = "sliding-log";
  if (auto* a = r.typed<toml::value<std::string>>("algorithm", "a string")) {
    algo = a->get();
    if (algo == "sliding-log") d.algorithm = algorithm_kind::sliding_log;
    else if (algo == "gcra") d.algorithm = algorithm_kind::gcra;
    else s.add(*a, r.key("algorithm"), "unknown algorithm \"" + algo + "\" (use \"sliding-log\" or \"gcra\")");
  }
  read_rules(r.get("rules"), r.key("rules"), s, d.rules, d.concurrency);
  read_shared(r, s, d);
  read_overrides(r, s, d.overrides);
  read_tiers(r, s, d);
  r.string_list("descriptor_keys", d.descriptor_keys, [](std::string_view k) {
    return k.empty() ? std::string("an entry key is not empty") : std::string();
  });
  if (d.descriptor_keys.size() > 16) s.add(*r.get("descriptor_keys"), r.key("descriptor_keys"), "at most 16 keys");
  r.string("descriptor_separator", d.descriptor_separator);
  if (d.descriptor_separator.size() > 8) {
    s.add(*r.get("descriptor_separator"), r.key("descriptor_separator"), "at most 8 bytes");
  }
  enum class envoy_mode : std::uint8_t { enforce, shadow };
  envoy_mode mode = envoy_mode::enforce;
  r.choice("envoy_mode", std::array<std::string_view, 2>{"enforce", "shadow"}, "mode", mode);
  d.envoy_shadow = mode == envoy_mode::shadow;
  enum class admission_mode : std::uint8_t { local, exact };
  admission_mode admission = admission_mode::local;
  r.choice("admission", std::array<std::string_view, 2>{"local", "exact"}, "admission", admission);
  d.exact = admission == admission_mode::exact;
  // A weight splits the shared limits: without any it would do nothing.
  if (!d.shared_rate && d.shared_concurrency == 0) {
    const bool weighted =
        std::any_of(d.overrides.begin(), d.overrides.end(), [](const auto& o) { return o.weight != 1; }) ||
        std::any_of(d.tiers.begin(), d.tiers.end(), [](const auto& t) { return t.weight != 1; });
    if (weighted) s.add(n, path, "a weight has no effect without shared limits (shared = [...])");
  }
  out.push_back(std::move(d));
}

// admin_token_file: the override API's bearer token, read now (a reload reads it again).
// OpenTelemetry: a span per decision that throttled (master/server/service.cpp).
void read_master_trace(reader& r, master_config& m) {
  r.string("trace_endpoint", m.trace.endpoint);
  r.real("trace_sample", m.trace.sample, 0.0, 1.0);
  r.integer("trace_max_queued", m.trace.max_queued, 1, 10'000'000);
  r.duration("trace_interval", m.trace.interval, std::chrono::milliseconds(10), std::chrono::minutes(1));
  check_trace(r, m.trace);
}

void read_admin_token(reader& r, sink& s, master_config& m) {
  auto* f = r.typed<toml::value<std::string>>("admin_token_file", "a file path");
  if (!f) return;
  m.admin_token_file = f->get();
  std::ifstream in(m.admin_token_file);
  std::stringstream text;
  if (in) text << in.rdbuf();
  std::string token = text.str();
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!token.empty() && blank(token.back())) token.pop_back();
  while (!token.empty() && blank(token.front())) token.erase(0, 1);
  if (!in) s.add(*f, "master.admin_token_file", "cannot read \"" + m.admin_token_file + "\"");
  else if (token.size() < 16) s.add(*f, "master.admin_token_file", "the token must be at least 16 characters");
  else m.admin_token = std::move(token);
}

// CURVE: the master's secret key files (one, or the current and the
// previous during a rotation) and the gatekeepers' keys, read now (a reload
// reads them again).
void read_master_curve(reader& r, sink& s, master_config& m) {
  r.string_list("curve_secret_key", m.curve_secret_key,
                [](std::string_view f) { return f.empty() ? std::string("expected a file path") : std::string(); });
  r.string("curve_allowed_keys", m.curve_allowed_keys);
  if (!both_or_neither(r, "curve_secret_key", "curve_allowed_keys")) return;
  const toml::node* secret = r.get("curve_secret_key");
  const toml::node* allowed = r.get("curve_allowed_keys");
  // Keys given but empty would leave the links plaintext without a word.
  if (m.curve_secret_key.empty() || m.curve_secret_key.size() > 2) {
    s.add(*secret, "master.curve_secret_key", "one or two keys (the current one and the previous one)");
    return;
  }
  if (m.curve_allowed_keys.empty()) {
    s.add(*allowed, "master.curve_allowed_keys", "expected the path of the gatekeepers' key list");
    return;
  }
  auto keys = std::make_shared<zmtp::curve::server_keys>();
  try {
    for (const auto& f : m.curve_secret_key) keys->own.push_back(zmtp::curve::read_secret_key(f));
  } catch (const std::runtime_error& e) {
    s.add(*secret, "master.curve_secret_key", e.what());
    return;
  }
  try {
    keys->allowed = zmtp::curve::read_key_list(m.curve_allowed_keys);
  } catch (const std::runtime_error& e) {
    s.add(*allowed, "master.curve_allowed_keys", e.what());
    return;
  }
  m.curve = std::move(keys);
}

// `rls`: the gRPC endpoint of Envoy's rate limit services, and what goes with it.
void read_rls(reader& r, sink& s, master_config& m) {
  if (r.table().contains("rls")) {
    host_port h{"127.0.0.1", 10007};
    r.bind_address("rls", h);
    m.rls = h;
  }
  r.cidr_list("rls_allow", m.rls_allow);
  enum class unknown : std::uint8_t { allow, deny };
  unknown u = unknown::allow;
  r.choice("rls_unknown_domain", std::array<std::string_view, 2>{"allow", "deny"}, "answer", u);
  m.rls_deny_unknown = u == unknown::deny;
  std::int64_t buckets = static_cast<std::int64_t>(m.rlqs_max_buckets);
  r.integer("rlqs_max_buckets", buckets, 1, 10'000'000);
  m.rlqs_max_buckets = static_cast<std::uint64_t>(buckets);
  if (!m.rls) {
    for (const char* k : {"rls_allow", "rls_unknown_domain", "rlqs_max_buckets"}) {
      if (const toml::node* n = r.table().get(k)) s.add(*n, "master." + std::string(k), "has no effect without rls");
    }
  }
}

}  // namespace

std::variant<override_config, std::string> parse_override_rules(std::string_view identifier, std::string_view text) {
  override_config oc;
  oc.identifier = std::string(identifier);
  if (oc.identifier.empty() || oc.identifier.size() > wire::max_identifier_bytes) {
    return std::string("the identifier must be 1 to 1024 bytes");
  }
  toml::table t;
  try {
    t = toml::parse(text, std::string_view("override"));
  } catch (const toml::parse_error& e) {
    return "not TOML: " + std::string(e.description());
  }
  sink s("override");
  {
    reader r(t, "", s);  // unknown keys are reported when it goes
    r.integer("weight", oc.weight, 1, k_max_weight);
    if (const toml::node* rules = r.get("rules")) read_rules(rules, "rules", s, oc.rules, oc.concurrency);
    else return std::string("missing rules (rules = [] for no limit)");
  }
  if (!s.errors().empty()) return s.errors().front().key + ": " + s.errors().front().message;
  return oc;
}

master_config detail::read_master(const toml::table& t, sink& s) {
  master_config m;
  reader r(t, "master", s);
  if (auto* e = r.typed<toml::value<std::string>>("accounting", "a ZeroMQ endpoint string")) {
    if (auto msg = check_stream_endpoint(e->get(), "accounting"); !msg.empty()) s.add(*e, "master.accounting", msg);
    else m.accounting = e->get();
  }
  if (auto* e = r.typed<toml::value<std::string>>("control", "a ZeroMQ endpoint string")) {
    if (auto msg = check_stream_endpoint(e->get(), "control"); !msg.empty()) s.add(*e, "master.control", msg);
    else m.control = e->get();
  }
  r.bind_address("admin", m.admin);
  if (r.table().contains("query")) {
    host_port q{"127.0.0.1", 10006};
    r.bind_address("query", q);
    m.query = q;
  }
  r.cidr_list("query_allow", m.query_allow);
  if (!m.query && !m.query_allow.empty()) {
    s.add(*r.table().get("query_allow"), "master.query_allow", "has no effect without query");
  }
  read_rls(r, s, m);
  r.cidr_list("accounting_allow", m.accounting_allow);
  r.cidr_list("admin_allow", m.admin_allow);
  read_admin_token(r, s, m);
  read_master_trace(r, m);
  r.cidr_list("control_allow", m.control_allow);
  read_master_curve(r, s, m);
  r.choice("store", std::array<std::string_view, 2>{"memory", "redis"}, "store", m.store);
  if (auto* rd = r.typed<toml::value<std::string>>("redis", "a redis:// URL")) {
    if (auto u = parse_redis_url(rd->get())) {
      m.redis = rd->get();
      m.redis_target = std::move(*u);
    } else {
      s.add(*rd, "master.redis",
            "expected redis://[:password@]host[:port][/db] or "
            "redis-sentinel://[:password@]host[:port][,host[:port]...]/primary_name[/db] or "
            "redis-cluster://[:password@]host[:port][,host[:port]...], got \"" +
                rd->get() + "\"");
    }
  }
  r.duration("redis_timeout", m.redis_timeout, std::chrono::milliseconds(1));
  r.unsigned_integer("max_identifiers", m.max_identifiers, 1, 1'000'000'000);
  r.unsigned_integer("top_identifiers", m.top_identifiers, 1, 10'000);
  r.boolean("pace_share", m.pace_share);
  r.duration("max_clock_skew", m.max_clock_skew);
  r.duration("reservation_timeout", m.reservation_timeout, std::chrono::seconds(1));
  r.integer("startup_backlog", m.startup_backlog, 0, 1'000'000'000);
  r.unsigned_integer("max_accounting_peers", m.max_accounting_peers, 1, 1'000'000);
  r.unsigned_integer("max_control_peers", m.max_control_peers, 1, 1'000'000);
  r.integer("control_hwm", m.control_hwm, 0, 1'000'000'000);
  r.duration("sweep_interval", m.sweep_interval, std::chrono::milliseconds(1));
  r.string("log_level", m.log_level);
  check_log_level(r, m.log_level);
  if (const toml::node* domains = r.get("domains")) {
    if (const auto* dt = domains->as_table()) {
      for (auto&& [k, v] : *dt) read_domain(k.str(), v, "master.domains." + std::string(k.str()), s, m.domains);
    } else {
      s.add(*domains, "master.domains", "expected a table of domains, got " + std::string(type_name(*domains)));
    }
  }
  std::sort(m.domains.begin(), m.domains.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  if (m.store != store_kind::redis) {
    for (const char* k : {"redis", "redis_timeout", "startup_backlog"}) {
      if (const toml::node* n = r.table().get(k))
        s.add(*n, std::string("master.") + k, "has no effect unless store = \"redis\"");
    }
  }
  std::size_t overrides = 0;
  for (const auto& d : m.domains) overrides += d.overrides.size();
  if (overrides > max_overrides) {
    s.add(t, "master.domains",
          std::to_string(overrides) + " overrides; at most " + std::to_string(max_overrides) +
              " (each is published to every gatekeeper every second)");
  }
  return m;
}

const domain_config* master_config::find_domain(std::string_view name) const {
  auto it = std::lower_bound(domains.begin(), domains.end(), name,
                             [](const domain_config& d, std::string_view n) { return d.name < n; });
  return it != domains.end() && it->name == name ? &*it : nullptr;
}

}  // namespace smockron::config
