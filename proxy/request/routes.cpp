// Route matching.
#include "proxy/request/routes.hpp"

#include "proxy/codec/path.hpp"

#include <algorithm>

namespace smockron::proxy {

namespace {

// The host as servers read it: without its port (an IPv6 literal keeps its
// brackets) and without the trailing dot of a fully qualified name
// ("limited.example." is "limited.example", as nginx matches server_name).
std::string_view host_name(std::string_view host) {
  if (!host.empty() && host.front() == '[') {
    const auto close = host.find(']');
    return host.substr(0, close == std::string_view::npos ? host.size() : close + 1);
  }
  if (const auto colon = host.rfind(':'); colon != std::string_view::npos) host = host.substr(0, colon);
  if (host.size() > 1 && host.back() == '.') host.remove_suffix(1);
  return host;
}

constexpr char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

// `host` (any case) equals `lower` (already lower case), ASCII case-insensitively.
bool equals_lower(std::string_view host, std::string_view lower) {
  return host.size() == lower.size() &&
         std::equal(host.begin(), host.end(), lower.begin(), [](char a, char b) { return ascii_lower(a) == b; });
}

}  // namespace

std::string normalize_host(std::string_view host) {
  std::string out(host_name(host));
  std::transform(out.begin(), out.end(), out.begin(), ascii_lower);
  return out;
}

route_table::route_table(const config::proxy_config& cfg) {
  for (const auto& rc : cfg.routes) {
    route r;
    const std::string host = normalize_host(rc.host);
    if (host == "*" || host.empty()) {
      r.host_kind = route::host_match::any;
    } else if (host.starts_with("*.")) {
      r.host_kind = route::host_match::suffix;
      r.host = host.substr(1);
    } else {
      r.host_kind = route::host_match::exact;
      r.host = host;
    }
    r.path = rc.path;
    r.index = routes_.size();
    r.domain = rc.domain;
    if (!rc.domain.empty()) {
      auto d = std::find(domains_.begin(), domains_.end(), rc.domain);
      r.domain_index = static_cast<std::size_t>(d - domains_.begin());
      if (d == domains_.end()) domains_.push_back(rc.domain);
    }
    for (std::size_t u = 0; u < cfg.upstreams.size(); ++u) {
      if (cfg.upstreams[u].name == rc.upstream) r.upstream_index = u;
    }
    r.identify = rc.identify;
    r.unidentified = rc.unidentified;
    r.status = static_cast<unsigned>(rc.status);
    r.shadow = rc.mode == config::route_config::route_mode::shadow;
    r.exempt = rc.exempt;
    r.ratelimit_headers = rc.ratelimit_headers;
    r.explain = rc.explain;
    r.grpc_status = static_cast<unsigned>(rc.grpc_status);
    r.cost = rc.cost;
    r.cost_max = rc.cost_max;
    r.cost_default = rc.cost_default;
    r.cost_estimate = rc.cost_estimate;
    if (rc.tier) r.tier.push_back(*rc.tier);
    routes_.push_back(std::move(r));
  }
}

const route* route_table::match(std::string_view host_header, std::string_view path) const {
  // Compared in place, case-insensitively: no copy per request.
  const std::string_view host = host_name(host_header);
  for (const auto& r : routes_) {
    switch (r.host_kind) {
      case route::host_match::any: break;
      case route::host_match::exact:
        if (!equals_lower(host, r.host)) continue;
        break;
      case route::host_match::suffix:
        if (host.size() <= r.host.size() || !equals_lower(host.substr(host.size() - r.host.size()), r.host)) continue;
        break;
    }
    if (path::under(path, r.path)) return &r;
  }
  return nullptr;
}

}  // namespace smockron::proxy
