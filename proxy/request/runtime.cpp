// One configuration generation (see runtime.hpp).
#include "proxy/request/runtime.hpp"

#include <boost/asio/ip/address.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace smockron::proxy {
namespace {

// Host names are resolved once here (control plane), never per connection.
// `hosts` gets the configured host of each address.
std::vector<tcp::endpoint> resolve(const config::upstream_config& u, std::vector<std::string>& hosts) {
  std::vector<tcp::endpoint> eps;
  for (const auto& s : u.servers) {
    boost::system::error_code ec;
    const auto addr = asio::ip::make_address(s.host, ec);
    if (!ec) {
      eps.emplace_back(addr, s.port);
      hosts.push_back(s.host);
      continue;
    }
    // A name stands for every address it resolves to (as nginx's server
    // directive): each is a server of the round robin, marked down on its own.
    asio::io_context tmp;
    tcp::resolver resolver(tmp);
    const auto results = resolver.resolve(s.host, std::to_string(s.port), ec);
    if (ec || results.empty()) throw std::runtime_error("cannot resolve upstream server " + s.to_string());
    for (const auto& r : results) {
      if (std::find(eps.begin(), eps.end(), r.endpoint()) != eps.end()) continue;
      eps.push_back(r.endpoint());
      hosts.push_back(s.host);
    }
  }
  return eps;
}

}  // namespace

runtime::runtime(const config::proxy_config& c, domain_registry& domains, proxy_metrics& m, std::uint64_t gen,
                 const runtime* resolved_again)
    : cfg(c), routes(c), generation(gen) {
  for (const auto& d : routes.domains()) {
    gate_domain.push_back(domains.id(d));
    decisions.push_back(m.decisions(d));
    shadow_decisions.push_back(m.shadow_decisions(d));
  }
  for (const auto& u : cfg.upstreams) {
    servers.push_back(resolve(u, server_hosts.emplace_back()));
    upstream_metrics.push_back(m.upstream(u.name));
  }
  if (resolved_again) {
    listener_tls = resolved_again->listener_tls;
    upstream_tls = resolved_again->upstream_tls;
  } else {
    if (cfg.tls()) listener_tls = std::make_shared<tls_server>(cfg);
    for (const auto& u : cfg.upstreams) {
      upstream_tls.push_back(u.tls ? make_upstream_tls(u) : nullptr);
    }
  }
  std::string error;
  jwt = jwt_verifier::create(cfg.jwt, error);
  if (!jwt) throw std::runtime_error("proxy.jwt: " + error);
  limits.max_delay_us = cfg.max_delay.count();
  limits.max_held = cfg.max_held;
  limits.pacing_fresh_us = cfg.control_fresh.count();
  route_held = std::make_unique<std::atomic<std::int64_t>[]>(cfg.routes.size());
  for (std::size_t i = 0; i < cfg.routes.size(); ++i) {
    const auto& rc = cfg.routes[i];
    gate_limits l = limits;
    if (rc.max_delay) l.max_delay_us = rc.max_delay->count();
    l.fit_after = rc.cost.type == config::route_config::cost_source::kind::request_bytes && rc.cost_estimate;
    if (rc.max_held) {
      l.route_held = &route_held[i];
      l.route_max_held = *rc.max_held;
    }
    route_limits.push_back(l);
  }
  for (const auto& rc : cfg.routes) {
    for (const auto& src : rc.identify) {
      if (src.type != config::identifier_source::kind::query || !src.hash) continue;
      if (std::find(redacted_query.begin(), redacted_query.end(), src.name) == redacted_query.end())
        redacted_query.push_back(src.name);
    }
  }
  normalize_path = cfg.normalize_path;
  json_estimates = std::any_of(routes.routes().begin(), routes.routes().end(), [](const route& r) {
    return r.cost_estimate && r.cost_estimate->type == config::route_config::cost_source::kind::json_body;
  });
  path_options.merge_slashes = cfg.merge_slashes;
  using action = config::proxy_config::escaped_slashes_action;
  path_options.slashes = cfg.escaped_slashes == action::keep       ? path::escaped_slash::keep
                         : cfg.escaped_slashes == action::unescape ? path::escaped_slash::unescape
                                                                   : path::escaped_slash::reject;
  // Half the shortest deadline any operation sets (respond() writes within
  // 10 s, refuse() lingers 5 s), so the watchdog is never late by more than that.
  steady::duration t = std::chrono::seconds(10);
  for (const auto d :
       {cfg.header_timeout, cfg.idle_timeout, cfg.connect_timeout, cfg.upstream_timeout, cfg.body_timeout}) {
    t = std::min<steady::duration>(t, d);
  }
  tick = std::max<steady::duration>(t / 2, std::chrono::milliseconds(1));
}

}  // namespace smockron::proxy
