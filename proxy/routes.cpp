// Route matching.
#include "proxy/routes.hpp"

#include <algorithm>
#include <cctype>

namespace smockron::proxy {

std::string normalize_host(std::string_view host) {
  if (!host.empty() && host.front() == '[') {
    const auto close = host.find(']');
    host = host.substr(0, close == std::string_view::npos ? host.size() : close + 1);
  } else if (const auto colon = host.rfind(':'); colon != std::string_view::npos) {
    host = host.substr(0, colon);
  }
  std::string out(host);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
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
    r.domain = rc.domain;
    auto d = std::find(domains_.begin(), domains_.end(), rc.domain);
    r.domain_index = static_cast<std::size_t>(d - domains_.begin());
    if (d == domains_.end()) domains_.push_back(rc.domain);
    for (std::size_t u = 0; u < cfg.upstreams.size(); ++u) {
      if (cfg.upstreams[u].name == rc.upstream) r.upstream_index = u;
    }
    r.identify = rc.identify;
    routes_.push_back(std::move(r));
  }
}

const route* route_table::match(std::string_view host_header, std::string_view path) const {
  const std::string host = normalize_host(host_header);
  for (const auto& r : routes_) {
    switch (r.host_kind) {
      case route::host_match::any: break;
      case route::host_match::exact:
        if (host != r.host) continue;
        break;
      case route::host_match::suffix:
        if (host.size() <= r.host.size() || !host.ends_with(r.host)) continue;
        break;
    }
    if (path.starts_with(r.path)) return &r;
  }
  return nullptr;
}

}  // namespace smockron::proxy
