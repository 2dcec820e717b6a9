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

using detail::check_accounting_endpoint;
using detail::check_domain_name;
using detail::check_log_level;
using detail::check_pair;
using detail::check_readable;
using detail::check_zmq_endpoint;
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

// `identify`: sources in order, each "KIND[:NAME]" or a table
// { source = "KIND[:NAME]", hash = BOOL } (hash: the value is replaced by
// "sha256:" + 32 hex digits before it is used, logged or sent anywhere).
std::vector<identifier_source> read_identify(const toml::node& n, const std::string& key, sink& errors) {
  std::vector<identifier_source> out;
  const auto one = [&](const toml::node& item, const std::string& item_key) {
    const toml::node* text = &item;
    const toml::table* options = item.as_table();
    if (options != nullptr) {
      reader tr(*options, item_key, errors);
      text = tr.get("source");
      bool hash = false;
      tr.boolean("hash", hash);
      if (text == nullptr) {
        errors.add(item, item_key + ".source", "missing (e.g. source = \"header:X-API-Key\")");
        return;
      }
      const auto* s = text->as_string();
      auto src = s ? parse_identifier_source(s->get()) : std::nullopt;
      if (!src) {
        errors.add(*text, item_key + ".source",
                   "invalid identifier source (use ip, header:NAME, cookie:NAME, query:NAME, token, jwt:CLAIM)");
        return;
      }
      if (options->contains("hash")) src->hash = hash;
      out.push_back(*src);
      return;
    }
    const auto* s = item.as_string();
    auto src = s ? parse_identifier_source(s->get()) : std::nullopt;
    if (!src) {
      errors.add(item, item_key,
                 s ? "invalid identifier source \"" + s->get() +
                         "\" (use ip, header:NAME, cookie:NAME, query:NAME, token, jwt:CLAIM)"
                   : "expected a source string or a { source, hash } table, got " + std::string(type_name(item)));
      return;
    }
    out.push_back(*src);
  };
  if (const auto* a = n.as_array()) {
    for (std::size_t i = 0; i < a->size(); ++i) one((*a)[i], key + "[" + std::to_string(i) + "]");
  } else {
    one(n, key);  // a single source is accepted as a one-element list
  }
  return out;
}

// A field name as RFC 9110 5.1 allows it (a token), lower-cased; empty if it is not one.
std::string field_name(std::string_view name) {
  std::string out;
  for (const char ch : name) {
    const bool tchar = std::isalnum(static_cast<unsigned char>(ch)) != 0 ||
                       std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos;
    if (!tchar) return {};
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  return out;
}

// A route's `cost` (an integer, or "header:NAME", "request_bytes",
// "response_header:NAME"), `cost_max` and `cost_default`.
void read_cost(reader& rr, const std::string& path, route_config& route) {
  using kind = route_config::cost_source::kind;
  rr.integer("cost_max", route.cost_max, 1, wire::max_cost);
  rr.integer("cost_default", route.cost_default, 0, wire::max_cost);
  if (route.cost_default > route.cost_max) {
    rr.errors().add(*rr.get("cost_default"), path + ".cost_default",
                    "must be at most cost_max (" + std::to_string(route.cost_max) + ")");
  }
  const toml::node* n = rr.get("cost");
  auto& c = route.cost;
  // The keys that do nothing with this cost are errors.
  const auto no_effect = [&](std::string_view key, std::string_view why) {
    if (const toml::node* k = rr.table().get(key)) {
      rr.errors().add(*k, path + "." + std::string(key), "has no effect " + std::string(why));
    }
  };
  if (n == nullptr || n->as_integer() != nullptr) {
    no_effect("cost_max", "with a constant cost");
    no_effect("cost_default", "with a constant cost");
  }
  if (n == nullptr) return;
  if (const auto* v = n->as_integer()) {
    if (v->get() < 0 || v->get() > wire::max_cost) {
      rr.errors().add(*n, path + ".cost", "must be between 0 and " + std::to_string(wire::max_cost));
    }
    c.units = v->get();
    return;
  }
  const auto* text = n->as_string();
  const auto field = [&](std::string_view prefix, kind k) {
    const std::string& t = text->get();
    if (!t.starts_with(prefix)) return false;
    c.type = k;
    c.field = field_name(std::string_view(t).substr(prefix.size()));
    if (c.field.empty()) {
      rr.errors().add(
          *n, path + ".cost",
          "\"" + std::string(prefix) + "\" needs a field name (a token, e.g. \"" + std::string(prefix) + "X-Cost\")");
    }
    return true;
  };
  if (text == nullptr) {
    rr.errors().add(*n, path + ".cost",
                    "expected an integer or \"header:NAME\", \"request_bytes\", \"response_header:NAME\", got " +
                        std::string(type_name(*n)));
  } else if (text->get() == "request_bytes") {
    c.type = kind::request_bytes;
    no_effect("cost_default", "with request_bytes (a body's size is never missing)");
  } else if (!field("header:", kind::header) && !field("response_header:", kind::response_header)) {
    rr.errors().add(*n, path + ".cost",
                    "unknown cost \"" + text->get() +
                        "\" (use an integer, \"header:NAME\", \"request_bytes\" or \"response_header:NAME\")");
  }
}

void read_routes(reader& r, proxy_config& p) {
  const toml::node* n = r.get("routes");
  if (!n) return;
  const auto* arr = n->as_array();
  if (!arr) {
    r.errors().add(*n, "proxy.routes",
                   "expected an array of tables ([[proxy.routes]]), got " + std::string(type_name(*n)));
    return;
  }
  for (std::size_t i = 0; i < arr->size(); ++i) {
    const std::string path = "proxy.routes[" + std::to_string(i) + "]";
    const auto* rt = (*arr)[i].as_table();
    if (!rt) {
      r.errors().add((*arr)[i], path, "expected a table, got " + std::string(type_name((*arr)[i])));
      continue;
    }
    reader rr(*rt, path, r.errors());
    route_config route;
    rr.string("host", route.host);
    if (route.host.empty()) route.host = "*";
    if (auto* pth = rr.typed<toml::value<std::string>>("path", "a path prefix string")) {
      if (pth->get().empty() || pth->get()[0] != '/')
        r.errors().add(*pth, path + ".path", "path prefix must start with /");
      else route.path = pth->get();
    }
    if (auto* d = rr.typed<toml::value<std::string>>("domain", "a domain name")) {
      if (auto msg = check_domain_name(d->get()); !msg.empty()) r.errors().add(*d, path + ".domain", msg);
      route.domain = d->get();
    } else if (!rt->contains("domain")) {
      // Not limited: every key that shapes limiting would do nothing, so none is accepted.
      for (const char* k : {"identify", "unidentified", "status", "max_delay", "max_held", "mode", "exempt",
                            "ratelimit_headers", "explain", "grpc_status", "cost", "cost_max", "cost_default"}) {
        if (const toml::node* kn = rt->get(k)) {
          r.errors().add(*kn, path + "." + k, "has no effect on a route without a domain (it is not limited)");
        }
      }
    }
    if (auto* u = rr.typed<toml::value<std::string>>("upstream", "an upstream name")) {
      route.upstream = u->get();
      if (!p.find_upstream(route.upstream)) {
        r.errors().add(*u, path + ".upstream",
                       "unknown upstream \"" + route.upstream + "\" (define [proxy.upstreams." + route.upstream + "])");
      }
    } else if (!rt->contains("upstream")) {
      r.errors().add((*arr)[i], path + ".upstream", "missing (every route needs an upstream)");
    }
    if (const toml::node* n = rr.get("identify")) {
      route.identify = read_identify(*n, path + ".identify", r.errors());
      if (const auto* a = n->as_array(); a != nullptr && a->empty()) {
        r.errors().add(*n, path + ".identify", "needs at least one source");
      }
      const bool jwt = std::any_of(route.identify.begin(), route.identify.end(),
                                   [](const auto& src) { return src.type == identifier_source::kind::jwt; });
      if (jwt && !p.jwt.verify()) {
        r.errors().add(
            *rt->get("identify"), path + ".identify",
            "a jwt: source needs [proxy.jwt] hs256_secret, public_key_file or jwks_file (the claims of an unsigned "
            "token are whatever the client wants)");
      }
    }
    rr.choice("unidentified", std::array<std::string_view, 3>{"shared", "reject", "allow"}, "action",
              route.unidentified);
    rr.integer("status", route.status, 400, 599);
    if (rt->contains("max_delay")) {
      microseconds d = p.max_delay;
      rr.duration("max_delay", d);
      route.max_delay = d;
    }
    if (rt->contains("max_held")) {
      std::int64_t h = 0;
      rr.integer("max_held", h, 0, 10'000'000);
      route.max_held = h;
    }
    rr.choice("mode", std::array<std::string_view, 2>{"enforce", "shadow"}, "mode", route.mode);
    rr.cidr_list("exempt", route.exempt);
    rr.boolean("ratelimit_headers", route.ratelimit_headers);
    rr.boolean("explain", route.explain);
    if (const toml::node* g = rr.get("grpc_status")) {
      rr.integer("grpc_status", route.grpc_status, 1, 16);
      if (route.grpc_status != 8 && route.grpc_status != 14)
        r.errors().add(*g, path + ".grpc_status", "expected 8 (RESOURCE_EXHAUSTED) or 14 (UNAVAILABLE)");
    }
    read_cost(rr, path, route);
    p.routes.push_back(std::move(route));
  }
}

// [[proxy.shards]]: { domain = "api", masters = ["tcp://a:10004", ["tcp://b1:10004", "tcp://b2:10004"]] };
// a string is a share of one master, an array a share of redundant masters.
void read_shards(reader& r, proxy_config& p) {
  const toml::node* n = r.get("shards");
  if (!n) return;
  std::set<std::string, std::less<>> domains;
  each_table(*n, "proxy.shards", r.errors(), "{ domain = \"...\", masters = [...] }",
             [&](const toml::node& item, reader& hr) {
               proxy_config::shard_config sc;
               hr.string("domain", sc.domain);
               if (sc.domain.empty())
                 r.errors().add(item, hr.key("domain"), "missing (the domain split across masters)");
               else if (!domains.insert(sc.domain).second) {
                 r.errors().add(*hr.table().get("domain"), hr.key("domain"), "\"" + sc.domain + "\" is split twice");
               }
               const toml::node* masters = hr.get("masters");
               const auto* list = masters ? masters->as_array() : nullptr;
               if (!list) {
                 r.errors().add(masters ? *masters : item, hr.key("masters"),
                                "expected an array of shares: accounting endpoints, or arrays of redundant ones");
                 return;
               }
               std::set<std::string, std::less<>> seen;
               for (std::size_t j = 0; j < list->size(); ++j) {
                 const std::string share_key = hr.key("masters") + "[" + std::to_string(j) + "]";
                 std::vector<std::string> share;
                 const auto add = [&](const toml::node& e) {
                   const auto* v = e.as_string();
                   if (!v) {
                     r.errors().add(e, share_key, "expected an accounting endpoint string");
                     return;
                   }
                   const std::string ep = v->get();
                   if (std::find(p.accounting.begin(), p.accounting.end(), ep) == p.accounting.end()) {
                     r.errors().add(e, share_key, "\"" + ep + "\" is not one of accounting (list it there too)");
                   } else if (!seen.insert(ep).second) {
                     r.errors().add(e, share_key, "\"" + ep + "\" is in two shares");
                   }
                   share.push_back(ep);
                 };
                 if (const auto* group = (*list)[j].as_array()) {
                   for (const auto& e : *group) add(e);
                   if (group->empty()) r.errors().add((*list)[j], share_key, "an empty share");
                 } else {
                   add((*list)[j]);
                 }
                 sc.shares.push_back(std::move(share));
               }
               if (sc.shares.empty()) r.errors().add(*masters, hr.key("masters"), "needs at least one share");
               p.shards.push_back(std::move(sc));
             });
}

}  // namespace

proxy_config detail::read_proxy(const toml::table& t, sink& s) {
  proxy_config p;
  reader r(t, "proxy", s);
  r.bind_address("listen", p.listen);
  r.bind_address("admin", p.admin);
  r.integer("threads", p.threads, 0, 1024);
  r.string_list("accounting", p.accounting, check_accounting_endpoint);
  r.string_list("control", p.control, check_zmq_endpoint);
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
      if (const toml::node* n = t.get(k)) s.add(*n, std::string("proxy.") + k, "has no effect with http2 = false");
    }
  }
  r.boolean("proxy_protocol", p.proxy_protocol);
  r.choice("real_ip_header", std::array<std::string_view, 2>{"X-Forwarded-For", "Forwarded"}, "header",
           p.real_ip_header);
  r.integer("ipv6_prefix", p.ipv6_prefix, 1, 128);
  r.boolean("normalize_path", p.normalize_path);
  r.boolean("merge_slashes", p.merge_slashes);
  r.choice("escaped_slashes", std::array<std::string_view, 3>{"reject", "keep", "unescape"}, "action",
           p.escaped_slashes);
  r.choice("path_parameters", std::array<std::string_view, 3>{"keep", "strip", "reject"}, "action", p.path_parameters);
  if (!p.normalize_path) {
    for (const char* k : {"merge_slashes", "escaped_slashes"}) {
      if (const toml::node* n = r.table().get(k))
        s.add(*n, std::string("proxy.") + k, "has no effect with normalize_path = false");
    }
  }
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
  if (auto* jt = r.typed<toml::table>("jwt", "a table")) {
    reader jr(*jt, "proxy.jwt", s);
    jr.string("hs256_secret", p.jwt.hs256_secret);
    jr.string("public_key_file", p.jwt.public_key_file);
    jr.string("jwks_file", p.jwt.jwks_file);
    jr.string("issuer", p.jwt.issuer);
    jr.string("audience", p.jwt.audience);
    jr.duration("leeway", p.jwt.leeway);
    if (!p.jwt.verify()) {
      for (const char* k : {"issuer", "audience", "leeway"}) {
        if (const toml::node* n = jr.table().get(k)) {
          s.add(*n, std::string("proxy.jwt.") + k,
                "has no effect without a key (hs256_secret, public_key_file or jwks_file)");
        }
      }
    }
    for (const auto& [key, file] :
         {std::pair<const char*, const std::string&>{"public_key_file", p.jwt.public_key_file},
          {"jwks_file", p.jwt.jwks_file}}) {
      if (!file.empty() && !std::ifstream(file)) {
        s.add(*jt->get(key), std::string("proxy.jwt.") + key, "cannot read \"" + file + "\"");
      }
    }
  }
  r.string("tls_cert", p.tls_cert);
  r.string("tls_key", p.tls_key);
  check_pair(r, "tls_cert", p.tls_cert, "tls_key", p.tls_key);
  check_readable(r, {"tls_cert", "tls_key"});
  r.boolean("tls_session_resumption", p.tls_session_resumption);
  if (!p.tls()) {
    if (const toml::node* n = r.table().get("tls_session_resumption")) {
      s.add(*n, "proxy.tls_session_resumption", "has no effect without tls_cert and tls_key");
    }
  }
  if (const toml::node* n = r.get("tls_sni")) {
    if (!p.tls()) s.add(*n, "proxy.tls_sni", "has no effect without tls_cert and tls_key");
    each_table(*n, "proxy.tls_sni", s, "{ cert = \"...\", key = \"...\" }", [&](const toml::node& item, reader& sr) {
      proxy_config::tls_certificate c;
      sr.string("cert", c.cert);
      sr.string("key", c.key);
      if (c.cert.empty() || c.key.empty()) s.add(item, sr.path(), "needs both cert and key");
      check_readable(sr, {"cert", "key"});
      p.tls_sni.push_back(std::move(c));
    });
  }
  read_upstreams(r, p);
  read_routes(r, p);
  read_shards(r, p);
  return p;
}

const upstream_config* proxy_config::find_upstream(std::string_view name) const {
  for (const auto& u : upstreams) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

std::optional<identifier_source> parse_identifier_source(std::string_view text) {
  using k = identifier_source::kind;
  if (text == "ip") return identifier_source{k::ip, {}};
  if (text == "token") return identifier_source{k::token, {}, true};
  const auto colon = text.find(':');
  if (colon == std::string_view::npos || colon + 1 == text.size()) return std::nullopt;
  const auto prefix = text.substr(0, colon);
  const std::string name(text.substr(colon + 1));
  if (prefix == "header") return identifier_source{k::header, name};
  if (prefix == "cookie") return identifier_source{k::cookie, name};
  if (prefix == "query") return identifier_source{k::query, name};
  if (prefix == "jwt") return identifier_source{k::jwt, name};
  return std::nullopt;
}

std::string to_string(const identifier_source& s) {
  using k = identifier_source::kind;
  switch (s.type) {
    case k::ip: return "ip";
    case k::token: return "token";
    case k::header: return "header:" + s.name;
    case k::cookie: return "cookie:" + s.name;
    case k::query: return "query:" + s.name;
    case k::jwt: return "jwt:" + s.name;
  }
  return "?";
}

}  // namespace smockron::config
