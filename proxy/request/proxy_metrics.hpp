// The proxy's request counters, resolved once per configuration so that
// nothing is looked up by name on the request path. Accounting counters are
// the accounting sender's (accounting_sender.hpp), control counters the
// control subscriber's.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "shared/base/metrics.hpp"

namespace smockron::proxy {

/// What became of a request at the gate: the `decision` label of
/// smockron_proxy_requests_total and of the access log.
/// exempt: not limited (a route without a domain, or a client in the route's `exempt`).
enum class decision : std::uint8_t { accepted, delayed, rejected, unidentified, exempt };
inline constexpr std::size_t decision_count = 5;
/// The gate's verdicts a shadow route counts (accepted, delayed, rejected).
inline constexpr std::size_t shadow_decision_count = 3;
std::string_view to_string(decision d);

struct proxy_metrics {
  explicit proxy_metrics(metrics::registry& r);

  /// smockron_proxy_requests_total{domain, decision}, one per decision.
  std::array<metrics::counter*, decision_count> decisions(const std::string& domain);
  /// An upstream's responses by status class (1xx..5xx) and its response time
  /// (request sent to response head; smockron_proxy_upstream_response_seconds).
  struct upstream_series {
    std::array<metrics::counter*, 5> by_class{};
    metrics::histogram* seconds = nullptr;
  };
  upstream_series upstream(const std::string& name);
  /// smockron_proxy_shadow_decisions_total{domain, decision}: what the gate would have done on a shadow route.
  std::array<metrics::counter*, shadow_decision_count> shadow_decisions(const std::string& domain);

  metrics::registry& reg;
  metrics::counter &no_route, &bad_request, &header_too_large, &header_timeout, &client_gone_held;
  metrics::counter& proxy_protocol_error;  ///< connections closed for a missing or invalid PROXY header
  metrics::counter& tls_handshake_error;   ///< client connections whose TLS handshake failed or timed out
  metrics::counter &reject_too_long, &reject_held_full, &reject_no_master, &reject_unidentified, &reject_ambiguous;
  /// Requests no source identified, by the route's action (shared, reject, allow).
  metrics::counter &unidentified_shared, &unidentified_reject, &unidentified_allow;
  metrics::counter &upstream_connect, &upstream_timeout, &upstream_reset, &upstream_no_server, &upstream_tls;
  metrics::counter& exempt_no_domain;  ///< requests of routes without a domain
  metrics::histogram& delay_seconds;
  metrics::histogram& shadow_delay_seconds;  ///< the holds shadow routes would have made
};

}  // namespace smockron::proxy
