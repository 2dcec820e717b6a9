// The [proxy] table: the listener, the masters, upstreams, routes with their
// identifier sources, shards, TLS, and the bounds.
#include <toml++/toml.h>

#include <cctype>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "shared/config/config.hpp"
#include "shared/config/config_reader.hpp"
#include "shared/protocol/wire.hpp"

namespace smockron::config {
namespace {

using detail::both_or_neither;
using detail::check_domain_name;
using detail::check_log_level;
using detail::check_pair;
using detail::check_readable;
using detail::check_stream_endpoint;
using detail::check_trace;
using detail::each_table;
using detail::reader;
using detail::sink;
using detail::type_name;

void read_upstreams(reader& r, proxy_config& p) {
  const toml::node* n = r.get("upstreams");
  if (!n) return;
  const auto* t = n->as_table();
  if (!t) {
    r.errors().add(*n, "proxy.upstreams", "expected a table of upstreams, got " + std::string(type_name(*n)));
    return;
  }
  for (auto&& [k, v] : *t) {
    const std::string path = "proxy.upstreams." + std::string(k.str());
    const auto* ut = v.as_table();
    if (!ut) {
      r.errors().add(v, path, "expected a table with servers = [\"host:port\"], got " + std::string(type_name(v)));
      continue;
    }
    reader ur(*ut, path, r.errors());
    upstream_config u;
    u.name = std::string(k.str());
    std::vector<std::string> servers;
    ur.string_list("servers", servers, [](std::string_view s) {
      return parse_host_port(s) ? std::string() : "invalid server \"" + std::string(s) + "\" (expected host:port)";
    });
    for (const auto& s : servers) {
      if (auto hp = parse_host_port(s)) u.servers.push_back(*hp);
    }
    if (servers.empty()) r.errors().add(v, path + ".servers", "an upstream needs at least one server");
    ur.duration("fail_timeout", u.fail_timeout);
    ur.integer("keepalive", u.keepalive, 0, 100'000);
    ur.boolean("tls", u.tls);
    ur.string("tls_ca", u.tls_ca);
    ur.boolean("tls_verify", u.tls_verify);
    ur.string("tls_server_name", u.tls_server_name);
    ur.string("tls_client_cert", u.tls_client_cert);
    ur.string("tls_client_key", u.tls_client_key);
    ur.choice("protocol", std::array<std::string_view, 3>{"http1", "h2c", "h2"}, "protocol", u.protocol);
    ur.integer("max_streams", u.max_streams, 1, 100'000);
    using proto = upstream_config::protocol_kind;
    if (u.protocol == proto::h2) {
      if (const toml::node* tn = ut->get("tls"); tn != nullptr && !u.tls)
        r.errors().add(*tn, path + ".tls", "protocol = \"h2\" is HTTP/2 over TLS (use \"h2c\" in the clear)");
      u.tls = true;
    } else if (u.protocol == proto::h2c && u.tls) {
      r.errors().add(*ut->get("tls"), path + ".tls", "protocol = \"h2c\" is HTTP/2 in the clear (use \"h2\" with TLS)");
    }
    if (!u.http2()) {
      if (const toml::node* kn = ut->get("max_streams"))
        r.errors().add(*kn, path + ".max_streams", "has no effect unless protocol is \"h2c\" or \"h2\"");
    }
    if (!u.tls) {
      for (const char* key : {"tls_ca", "tls_verify", "tls_server_name", "tls_client_cert", "tls_client_key"}) {
        if (const toml::node* kn = ut->get(key))
          r.errors().add(*kn, path + "." + key, "has no effect unless tls = true");
      }
    } else if (!u.tls_verify && !u.tls_ca.empty()) {
      r.errors().add(*ut->get("tls_ca"), path + ".tls_ca", "has no effect with tls_verify = false");
    }
    check_pair(ur, "tls_client_cert", u.tls_client_cert, "tls_client_key", u.tls_client_key);
    check_readable(ur, {"tls_ca", "tls_client_cert", "tls_client_key"});
    p.upstreams.push_back(std::move(u));
  }
}

// http2 and its abuse bounds (each has no effect with http2 = false).
void read_http2(reader& r, proxy_config& p) {
  r.boolean("http2", p.http2);
  r.integer("http2_max_concurrent_streams", p.http2_max_concurrent_streams, 1, 1'000'000);
  r.integer("http2_reset_burst", p.http2_reset_burst, 1, 1'000'000'000);
  r.integer("http2_reset_rate", p.http2_reset_rate, 1, 1'000'000'000);
  r.integer("http2_control_burst", p.http2_control_burst, 1, 1'000'000'000);
  r.integer("http2_control_rate", p.http2_control_rate, 1, 1'000'000'000);
  r.integer("http2_max_continuations", p.http2_max_continuations, 0, 1'000'000);
  if (!p.http2) {
    for (const char* k : {"http2_max_concurrent_streams", "http2_reset_burst", "http2_reset_rate",
                          "http2_control_burst", "http2_control_rate", "http2_max_continuations"}) {
      if (const toml::node* n = r.table().get(k))
        r.errors().add(*n, std::string("proxy.") + k, "has no effect with http2 = false");
    }
  }
}

// How paths are prepared before routing.
void read_paths(reader& r, proxy_config& p) {
  r.boolean("normalize_path", p.normalize_path);
  r.boolean("merge_slashes", p.merge_slashes);
  r.choice("escaped_slashes", std::array<std::string_view, 3>{"reject", "keep", "unescape"}, "action",
           p.escaped_slashes);
  r.choice("path_parameters", std::array<std::string_view, 3>{"keep", "strip", "reject"}, "action", p.path_parameters);
  if (!p.normalize_path) {
    for (const char* k : {"merge_slashes", "escaped_slashes"}) {
      if (const toml::node* n = r.table().get(k))
        r.errors().add(*n, std::string("proxy.") + k, "has no effect with normalize_path = false");
    }
  }
}

// [proxy.jwt]: the key a JWT identifier is verified with, and its claims' checks.
void read_jwt(reader& r, proxy_config& p) {
  if (auto* jt = r.typed<toml::table>("jwt", "a table")) {
    reader jr(*jt, "proxy.jwt", r.errors());
    jr.string("hs256_secret", p.jwt.hs256_secret);
    jr.string("public_key_file", p.jwt.public_key_file);
    jr.string("jwks_file", p.jwt.jwks_file);
    jr.string("issuer", p.jwt.issuer);
    jr.string("audience", p.jwt.audience);
    jr.duration("leeway", p.jwt.leeway);
    if (!p.jwt.verify()) {
      for (const char* k : {"issuer", "audience", "leeway"}) {
        if (const toml::node* n = jr.table().get(k)) {
          r.errors().add(*n, std::string("proxy.jwt.") + k,
                         "has no effect without a key (hs256_secret, public_key_file or jwks_file)");
        }
      }
    }
    for (const auto& [key, file] :
         {std::pair<const char*, const std::string&>{"public_key_file", p.jwt.public_key_file},
          {"jwks_file", p.jwt.jwks_file}}) {
      if (!file.empty() && !std::ifstream(file)) {
        r.errors().add(*jt->get(key), std::string("proxy.jwt.") + key, "cannot read \"" + file + "\"");
      }
    }
  }
}

// The listener's TLS: a certificate, resumption, certificates by SNI.
void read_tls(reader& r, proxy_config& p) {
  r.string("tls_cert", p.tls_cert);
  r.string("tls_key", p.tls_key);
  check_pair(r, "tls_cert", p.tls_cert, "tls_key", p.tls_key);
  check_readable(r, {"tls_cert", "tls_key"});
  r.boolean("tls_session_resumption", p.tls_session_resumption);
  if (!p.tls()) {
    if (const toml::node* n = r.table().get("tls_session_resumption")) {
      r.errors().add(*n, "proxy.tls_session_resumption", "has no effect without tls_cert and tls_key");
    }
  }
  if (const toml::node* n = r.get("tls_sni")) {
    if (!p.tls()) r.errors().add(*n, "proxy.tls_sni", "has no effect without tls_cert and tls_key");
    each_table(*n, "proxy.tls_sni", r.errors(), "{ cert = \"...\", key = \"...\" }",
               [&](const toml::node& item, reader& sr) {
                 proxy_config::tls_certificate c;
                 sr.string("cert", c.cert);
                 sr.string("key", c.key);
                 if (c.cert.empty() || c.key.empty()) r.errors().add(item, sr.path(), "needs both cert and key");
                 check_readable(sr, {"cert", "key"});
                 p.tls_sni.push_back(std::move(c));
               });
  }
}

}  // namespace

namespace {
// CURVE: the gatekeeper's secret key and its masters' public keys, read now.
// `curve_master_key` is one key for every endpoint, or a table naming each
// accounting and control endpoint.
void read_proxy_curve(reader& r, sink& s, proxy_config& p) {
  r.string("curve_secret_key", p.curve_secret_key);
  if (!both_or_neither(r, "curve_secret_key", "curve_master_key")) return;
  const toml::node* secret = r.get("curve_secret_key");
  const toml::node* master = r.get("curve_master_key");
  bool ok = true;
  if (const auto* one = master->as_string()) {
    p.curve_master_key[""] = one->get();
  } else if (const auto* each = master->as_table()) {
    for (auto&& [k, v] : *each) {
      const std::string endpoint(k.str());
      const auto* text = v.as_string();
      const bool known = std::find(p.accounting.begin(), p.accounting.end(), endpoint) != p.accounting.end() ||
                         std::find(p.control.begin(), p.control.end(), endpoint) != p.control.end();
      if (!text) {
        s.add(v, "proxy.curve_master_key." + endpoint, "expected a key file path or a Z85 key");
        ok = false;
      } else if (!known) {
        s.add(v, "proxy.curve_master_key." + endpoint, "not one of the accounting or control endpoints");
        ok = false;
      } else {
        p.curve_master_key[endpoint] = text->get();
      }
    }
  } else {
    s.add(*master, "proxy.curve_master_key",
          "expected a key (file path or Z85) or a table of endpoint = key, got " + std::string(type_name(*master)));
    return;
  }
  if (!ok) return;
  zmtp::curve::keypair own;
  try {
    own = zmtp::curve::read_secret_key(p.curve_secret_key);
  } catch (const std::runtime_error& e) {
    s.add(*secret, "proxy.curve_secret_key", e.what());
    return;
  }
  std::vector<std::string> endpoints = p.accounting;
  endpoints.insert(endpoints.end(), p.control.begin(), p.control.end());
  std::map<std::string, std::shared_ptr<const zmtp::curve::client_keys>, std::less<>> by_key_text;
  for (const auto& endpoint : endpoints) {
    auto it = p.curve_master_key.find(endpoint);
    if (it == p.curve_master_key.end()) it = p.curve_master_key.find("");
    if (it == p.curve_master_key.end()) {
      s.add(*master, "proxy.curve_master_key", "names no key for the endpoint \"" + endpoint + "\"");
      continue;
    }
    auto& shared = by_key_text[it->second];  // one key object per distinct key
    if (!shared) {
      try {
        auto keys = std::make_shared<zmtp::curve::client_keys>();
        keys->own = own;
        keys->server = zmtp::curve::read_public_key(it->second);
        shared = std::move(keys);
      } catch (const std::runtime_error& e) {
        s.add(*master, "proxy.curve_master_key", e.what());
        return;
      }
    }
    p.curve[endpoint] = shared;
  }
}

// OpenTelemetry: a span per held or refused request (proxy/request/request_steps.cpp).
void read_proxy_trace(reader& r, proxy_config& p) {
  r.string("trace_endpoint", p.trace.endpoint);
  r.real("trace_sample", p.trace.sample, 0.0, 1.0);
  r.integer("trace_max_queued", p.trace.max_queued, 1, 10'000'000);
  r.duration("trace_interval", p.trace.interval, std::chrono::milliseconds(10), std::chrono::minutes(1));
  check_trace(r, p.trace);
}

// A master's endpoint in the proxy: as the master binds it, or a DNS name
// standing for several masters (proxy/cluster/master_discovery.hpp).
std::string check_master_endpoint(std::string_view e, std::string_view what) {
  if (!e.starts_with("dns+tcp://") && !e.starts_with("srv+tcp://")) return check_stream_endpoint(e, what);
  if (parse_dns_endpoint(e)) return {};
  return "invalid endpoint \"" + std::string(e) + "\" (expected dns+tcp://name:port or srv+tcp://name)";
}

// How names of masters are looked up; only with a dns+tcp:// or srv+tcp:// endpoint.
void read_dns(reader& r, sink& s, proxy_config& p) {
  r.string_list("dns_servers", p.dns_servers, [](std::string_view e) -> std::string {
    // c-ares takes addresses only: a name here would need a DNS server to find the DNS server.
    if (const auto hp = parse_host_port(e); parse_ip(e) || (hp && parse_ip(hp->host))) return {};
    return "invalid DNS server \"" + std::string(e) + "\" (expected an IP address, or address:port)";
  });
  r.duration("dns_min_ttl", p.dns_min_ttl, std::chrono::milliseconds(100), std::chrono::hours(24));
  r.duration("dns_max_ttl", p.dns_max_ttl, std::chrono::milliseconds(100), std::chrono::hours(24));
  r.integer("dns_max_masters", p.dns_max_masters, 1, 1024);
  if (p.dns_min_ttl > p.dns_max_ttl) {
    const bool max_given = r.table().contains("dns_max_ttl");
    s.add(*r.table().get(max_given ? "dns_max_ttl" : "dns_min_ttl"),
          max_given ? "proxy.dns_max_ttl" : "proxy.dns_min_ttl",
          max_given ? "dns_max_ttl is below dns_min_ttl"
                    : "dns_min_ttl is above dns_max_ttl (60s unless given): set dns_max_ttl too");
  }
  if (p.discovers_masters()) return;
  for (const char* k : {"dns_servers", "dns_min_ttl", "dns_max_ttl", "dns_max_masters"}) {
    if (const toml::node* n = r.table().get(k))
      s.add(*n, std::string("proxy.") + k,
            "has no effect without a dns+tcp:// or srv+tcp:// accounting or control endpoint");
  }
}
}  // namespace

proxy_config detail::read_proxy(const toml::table& t, sink& s) {
  proxy_config p;
  reader r(t, "proxy", s);
  r.bind_address("listen", p.listen);
  r.bind_address("admin", p.admin);
  r.integer("threads", p.threads, 0, 1024);
  r.string_list("accounting", p.accounting, [](std::string_view e) { return check_master_endpoint(e, "accounting"); });
  r.string_list("control", p.control, [](std::string_view e) { return check_master_endpoint(e, "control"); });
  read_dns(r, s, p);
  read_proxy_trace(r, p);
  read_proxy_curve(r, s, p);
  r.duration("max_delay", p.max_delay);
  r.integer("max_held", p.max_held, 0, 10'000'000);
  r.cidr_list("trusted_proxies", p.trusted_proxies);
  r.cidr_list("admin_allow", p.admin_allow);
  const auto ms = [](int v) { return microseconds(std::chrono::milliseconds(v)); };
  r.duration("header_timeout", p.header_timeout, ms(1));
  r.duration("body_timeout", p.body_timeout, ms(1));
  r.duration("idle_timeout", p.idle_timeout, ms(1));
  r.duration("connect_timeout", p.connect_timeout, ms(1));
  r.duration("resolve_interval", p.resolve_interval);
  r.duration("upstream_timeout", p.upstream_timeout, ms(1));
  r.duration("grace_period", p.grace_period);
  r.size("max_header_bytes", p.max_header_bytes, 256, 1024 * 1024);
  r.size("max_body_bytes", p.max_body_bytes, 0, UINT64_MAX >> 1);
  r.size("cost_estimate_bytes", p.cost_estimate_bytes, 1, 65'535);
  r.real("rejected_sample", p.rejected_sample, 0.0, 1.0);
  r.boolean("access_log", p.access_log);
  r.choice("access_log_format", std::array<std::string_view, 2>{"text", "json"}, "format", p.access_log_format);
  r.string("access_log_path", p.access_log_path);
  if (!p.access_log) {
    for (const char* k : {"access_log_format", "access_log_path"}) {
      if (const toml::node* n = t.get(k))
        s.add(*n, std::string("proxy.") + k, "has no effect unless access_log = true");
    }
  }
  r.boolean("fail_closed", p.fail_closed);
  read_http2(r, p);
  r.boolean("proxy_protocol", p.proxy_protocol);
  r.choice("real_ip_header", std::array<std::string_view, 2>{"X-Forwarded-For", "Forwarded"}, "header",
           p.real_ip_header);
  r.integer("ipv6_prefix", p.ipv6_prefix, 1, 128);
  read_paths(r, p);
  if (p.trusted_proxies.empty()) {
    if (const toml::node* n = r.table().get("real_ip_header")) {
      s.add(*n, "proxy.real_ip_header", "has no effect without trusted_proxies (only they may name the client)");
    }
  }
  r.integer("accounting_hwm", p.accounting_hwm, 0, 1'000'000'000);
  r.duration("accounting_flush", p.accounting_flush, microseconds(0), std::chrono::seconds(1));
  r.integer("max_control_entries", p.max_control_entries, 64, 1'000'000'000);
  r.duration("control_fresh", p.control_fresh, ms(1));
  r.string("log_level", p.log_level);
  check_log_level(r, p.log_level);
  read_jwt(r, p);
  read_tls(r, p);
  read_upstreams(r, p);
  read_routes(r, p);
  read_shards(r, p);
  return p;
}

bool proxy_config::discovers_masters() const {
  const auto dns = [](const std::string& e) { return parse_dns_endpoint(e).has_value(); };
  return std::any_of(accounting.begin(), accounting.end(), dns) || std::any_of(control.begin(), control.end(), dns);
}

const upstream_config* proxy_config::find_upstream(std::string_view name) const {
  for (const auto& u : upstreams) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

}  // namespace smockron::config
