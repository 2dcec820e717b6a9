// One generation of the proxy's configuration, as the request path uses it:
// routes, domain ids and counters resolved, upstream servers resolved to
// addresses, the JWT verifier built, the gate's limits and the watchdog's
// period derived. Built on the control plane (start-up, reload), immutable
// after; workers hold it by shared_ptr and pick up a new generation between
// requests.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "proxy/cluster/domain_registry.hpp"
#include "proxy/codec/path.hpp"
#include "proxy/gate/gate.hpp"
#include "proxy/identify/identify.hpp"
#include "proxy/io/asio_types.hpp"
#include "proxy/io/tls.hpp"
#include "proxy/request/proxy_metrics.hpp"
#include "proxy/request/routes.hpp"
#include "shared/config/config.hpp"

namespace smockron::proxy {

struct runtime {
  /// Throws std::runtime_error when an upstream host does not resolve, the
  /// JWT settings are unusable or a TLS certificate or key does not load.
  /// `resolved_again`: a generation of the same configuration whose upstream
  /// names are being resolved again; its TLS contexts are reused.
  runtime(const config::proxy_config& c, domain_registry& domains, proxy_metrics& m, std::uint64_t gen,
          const runtime* resolved_again = nullptr);

  config::proxy_config cfg;
  route_table routes;
  std::vector<std::uint32_t> gate_domain;                  ///< per routes.domains() index
  std::vector<decision_counters> decisions;                ///< per domain index, by decision
  std::vector<shadow_decision_counters> shadow_decisions;  ///< per domain index
  /// Per upstream, its servers' addresses (a name: every address it resolves to).
  std::vector<std::vector<tcp::endpoint>> servers;
  /// Per upstream, per server address: the host it was configured as (TLS: SNI and the name checked).
  std::vector<std::vector<std::string>> server_hosts;
  std::shared_ptr<tls_server> listener_tls;                       ///< null: plain HTTP
  std::vector<std::shared_ptr<asio::ssl::context>> upstream_tls;  ///< per upstream; null: plain
  std::vector<proxy_metrics::upstream_series> upstream_metrics;   ///< per upstream
  std::unique_ptr<jwt_verifier> jwt;
  gate_limits limits;
  /// Per route: the limits its requests are decided with ([proxy] ones with the
  /// route's overrides), and its held requests when it caps them.
  std::vector<gate_limits> route_limits;
  std::unique_ptr<std::atomic<std::int64_t>[]> route_held;
  bool normalize_path = true;
  bool json_estimates = false;  ///< some route's cost estimate is read from the JSON body (body_prefix_wanted)
  path::options path_options;
  /// Query parameters some route's hashed `query:` source reads: logs write
  /// their values hashed (redact_query), never in clear.
  std::vector<std::string> redacted_query;
  steady::duration tick{};  ///< the connection watchdog's period (see conn_io.hpp)
  std::uint64_t generation = 0;
};

}  // namespace smockron::proxy
