// The [proxy] table's routes (with their identifier sources and cost) and
// shards; the text form of an identifier source.
#include <toml++/toml.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "shared/config/config.hpp"
#include "shared/config/config_reader.hpp"
#include "shared/protocol/wire.hpp"

namespace smockron::config {
namespace {

using detail::check_domain_name;
using detail::check_log_level;
using detail::check_pair;
using detail::check_readable;
using detail::each_table;
using detail::reader;
using detail::sink;
using detail::type_name;

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

// A response_header cost's `cost_estimate`: an integer, "header:NAME" or
// "json:FIELD", at most cost_max; a request_bytes cost's: an integer (what a
// body without a length reserves).
void read_cost_estimate(reader& rr, const std::string& path, route_config& route) {
  using kind = route_config::cost_source::kind;
  const toml::node* n = rr.get("cost_estimate");
  if (n == nullptr) return;
  const std::string key = path + ".cost_estimate";
  if (route.cost.type != kind::response_header && route.cost.type != kind::request_bytes) {
    rr.errors().add(*n, key,
                    "has no effect unless cost is \"response_header:NAME\" or \"request_bytes\" (a cost known at "
                    "admission is charged as it is)");
    return;
  }
  if (route.cost.type == kind::request_bytes && n->as_integer() == nullptr) {
    rr.errors().add(*n, key,
                    "with request_bytes, expected an integer: the bytes a body without a length reserves (the "
                    "body itself is its cost)");
    return;
  }
  route_config::cost_source e;
  if (const auto* v = n->as_integer()) {
    if (v->get() < 0 || v->get() > route.cost_max) {
      rr.errors().add(*n, key, "must be between 0 and cost_max (" + std::to_string(route.cost_max) + ")");
      return;
    }
    e.units = v->get();
  } else if (const auto* t = n->as_string(); t != nullptr && t->get().starts_with("header:")) {
    e.type = kind::header;
    e.field = field_name(std::string_view(t->get()).substr(7));
    if (e.field.empty()) {
      rr.errors().add(*n, key, "\"header:\" needs a field name (a token, e.g. \"header:X-Max-Tokens\")");
      return;
    }
  } else if (t != nullptr && t->get().starts_with("json:")) {
    e.type = kind::json_body;
    e.field = t->get().substr(5);
    // A member name as written in the body, without escapes (json_field.hpp).
    const bool plain = !e.field.empty() && std::all_of(e.field.begin(), e.field.end(), [](char ch) {
      return static_cast<unsigned char>(ch) >= 0x20 && ch != '"' && ch != '\\' && ch != 0x7f;
    });
    if (!plain) {
      rr.errors().add(*n, key,
                      "\"json:\" needs a member name without quotes or backslashes (e.g. \"json:max_tokens\")");
      return;
    }
  } else {
    rr.errors().add(*n, key, "expected an integer, \"header:NAME\" or \"json:FIELD\"");
    return;
  }
  route.cost_estimate = std::move(e);
}

// Where a route applies and where it goes: host, path prefix, domain (or
// none: then no key that shapes limiting is accepted), upstream.
void read_route_place(reader& rr, const toml::node& at, const std::string& path, const proxy_config& p,
                      route_config& route) {
  rr.string("host", route.host);
  if (route.host.empty()) route.host = "*";
  if (auto* pth = rr.typed<toml::value<std::string>>("path", "a path prefix string")) {
    if (pth->get().empty() || pth->get()[0] != '/')
      rr.errors().add(*pth, path + ".path", "path prefix must start with /");
    else route.path = pth->get();
  }
  if (auto* d = rr.typed<toml::value<std::string>>("domain", "a domain name")) {
    if (auto msg = check_domain_name(d->get()); !msg.empty()) rr.errors().add(*d, path + ".domain", msg);
    route.domain = d->get();
  } else if (!rr.table().contains("domain")) {
    // Not limited: every key that shapes limiting would do nothing, so none is accepted.
    for (const char* k :
         {"identify", "unidentified", "status", "max_delay", "max_held", "mode", "exempt", "ratelimit_headers",
          "explain", "grpc_status", "cost", "cost_max", "cost_default", "cost_estimate", "tier"}) {
      if (const toml::node* kn = rr.table().get(k)) {
        rr.errors().add(*kn, path + "." + k, "has no effect on a route without a domain (it is not limited)");
      }
    }
  }
  if (auto* u = rr.typed<toml::value<std::string>>("upstream", "an upstream name")) {
    route.upstream = u->get();
    if (!p.find_upstream(route.upstream)) {
      rr.errors().add(*u, path + ".upstream",
                      "unknown upstream \"" + route.upstream + "\" (define [proxy.upstreams." + route.upstream + "])");
    }
  } else if (!rr.table().contains("upstream")) {
    rr.errors().add(at, path + ".upstream", "missing (every route needs an upstream)");
  }
}

// How a limited route limits: who the client is, the answer past the limit,
// the hold's bounds, shadow mode, exemptions.
void read_route_limits(reader& rr, const std::string& path, const proxy_config& p, route_config& route) {
  if (const toml::node* n = rr.get("identify")) {
    route.identify = read_identify(*n, path + ".identify", rr.errors());
    if (const auto* a = n->as_array(); a != nullptr && a->empty()) {
      rr.errors().add(*n, path + ".identify", "needs at least one source");
    }
    const bool jwt = std::any_of(route.identify.begin(), route.identify.end(),
                                 [](const auto& src) { return src.type == identifier_source::kind::jwt; });
    if (jwt && !p.jwt.verify()) {
      rr.errors().add(
          *rr.table().get("identify"), path + ".identify",
          "a jwt: source needs [proxy.jwt] hs256_secret, public_key_file or jwks_file (the claims of an unsigned "
          "token are whatever the client wants)");
    }
  }
  if (auto* t = rr.typed<toml::value<std::string>>("tier", "\"jwt:CLAIM\" or \"header:NAME\"")) {
    auto src = parse_identifier_source(t->get());
    if (!src || (src->type != identifier_source::kind::jwt && src->type != identifier_source::kind::header)) {
      rr.errors().add(*t, path + ".tier",
                      "expected \"jwt:CLAIM\" (a verified token's claim) or \"header:NAME\" (set by a trusted peer "
                      "in front), got \"" +
                          t->get() + "\"");
    } else if (src->type == identifier_source::kind::jwt && !p.jwt.verify()) {
      rr.errors().add(*t, path + ".tier", "a jwt: tier needs [proxy.jwt] hs256_secret, public_key_file or jwks_file");
    } else {
      src->hash = false;  // a tier is a name the master looks up, never a secret
      route.tier = *src;
    }
  }
  rr.choice("unidentified", std::array<std::string_view, 3>{"shared", "reject", "allow"}, "action", route.unidentified);
  rr.integer("status", route.status, 400, 599);
  if (rr.table().contains("max_delay")) {
    microseconds d = p.max_delay;
    rr.duration("max_delay", d);
    route.max_delay = d;
  }
  if (rr.table().contains("max_held")) {
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
      rr.errors().add(*g, path + ".grpc_status", "expected 8 (RESOURCE_EXHAUSTED) or 14 (UNAVAILABLE)");
  }
}

}  // namespace

void detail::read_routes(reader& r, proxy_config& p) {
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
    read_route_place(rr, (*arr)[i], path, p, route);
    read_route_limits(rr, path, p, route);
    read_cost(rr, path, route);
    read_cost_estimate(rr, path, route);
    p.routes.push_back(std::move(route));
  }
}

// [[proxy.shards]]: { domain = "api", masters = ["tcp://a:10004", ["tcp://b1:10004", "tcp://b2:10004"]] };
// a string is a share of one master, an array a share of redundant masters.
void detail::read_shards(reader& r, proxy_config& p) {
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
