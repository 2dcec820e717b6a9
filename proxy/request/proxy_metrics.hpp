// The proxy's request counters, resolved once per configuration so that
// nothing is looked up by name on the request path. Accounting counters are
// the accounting sender's (accounting_sender.hpp), control counters the
// control subscriber's.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "proxy/request/decision.hpp"
#include "shared/base/enum_array.hpp"
#include "shared/base/metrics.hpp"

namespace smockron::proxy {

/// smockron_proxy_requests_total{domain, decision}, one per decision.
using decision_counters = enum_array<decision, metrics::counter*, decision_count>;
/// The gate's verdicts a shadow route counts (accepted, delayed, rejected: the first three).
using shadow_decision_counters = enum_array<decision, metrics::counter*, shadow_decision_count>;

struct proxy_metrics {
  explicit proxy_metrics(metrics::registry& r);

  /// smockron_proxy_requests_total{domain, decision}, one per decision.
  decision_counters decisions(const std::string& domain);
  /// An upstream's responses by status class (1xx..5xx) and its response time
  /// (request sent to response head; smockron_proxy_upstream_response_seconds).
  struct upstream_series {
    std::array<metrics::counter*, 5> by_class{};
    metrics::histogram* seconds = nullptr;
  };
  upstream_series upstream(const std::string& name);
  /// smockron_proxy_shadow_decisions_total{domain, decision}: what the gate would have done on a shadow route.
  shadow_decision_counters shadow_decisions(const std::string& domain);

  metrics::registry& reg;
  metrics::counter &no_route, &bad_request, &header_too_large, &header_timeout, &client_gone_held;
  metrics::counter& proxy_protocol_error;  ///< connections closed for a missing or invalid PROXY header
  metrics::counter& tls_handshake_error;   ///< client connections whose TLS handshake failed or timed out
  metrics::counter &reject_too_long, &reject_held_full, &reject_no_master, &reject_unidentified, &reject_ambiguous;
  /// Requests no source identified, by the route's action (shared, reject, allow).
  metrics::counter &unidentified_shared, &unidentified_reject, &unidentified_allow;
  metrics::counter &upstream_connect, &upstream_timeout, &upstream_reset, &upstream_no_server, &upstream_tls;
  metrics::counter& exempt_no_domain;  ///< requests of routes without a domain
  /// smockron_proxy_http_requests_total{protocol}: every request, by the protocol it came in.
  metrics::counter &http1_requests, &h2_requests;
  /// A gRPC call whose grpc-timeout would end before its hold: refused at once.
  metrics::counter& reject_grpc_deadline;
  /// smockron_proxy_http2_abuse_total{kind}: HTTP/2 bounds a client crossed.
  metrics::counter &h2_rapid_reset, &h2_control_flood, &h2_continuation_flood, &h2_header_list, &h2_too_many_streams,
      &h2_stalled_window, &h2_ack_flood, &h2_protocol_error;
  /// smockron_proxy_cost_fallback_total{reason}: costs not charged as read
  /// (missing or malformed: cost_default; over_max: cost_max).
  metrics::counter &cost_missing, &cost_malformed, &cost_over_max;
  /// smockron_proxy_cost_units_total: units charged to the masters (every accounted use).
  metrics::counter& cost_units;
  /// smockron_proxy_cost_refunded_units_total: units of reservations given back (real costs below their estimates).
  metrics::counter& cost_refunded;
  /// A request whose cost is more than a rule's burst or a quota (reason cost_over_limit).
  metrics::counter& reject_cost_over_limit;
  /// A request that found no concurrency slot within max_delay (reason concurrency).
  metrics::counter& reject_concurrency;
  /// Requests that waited for a concurrency slot (smockron_proxy_concurrency_waits_total).
  metrics::counter& concurrency_waits;
  /// Exact admission: requests that went with no answer from the master within control_fresh.
  metrics::counter& exact_unanswered;
  /// smockron_proxy_tier_invalid_total: requests of a route with a tier source whose value was no tier name
  /// (or two values): judged by the domain's rules.
  metrics::counter& tier_invalid;
  metrics::histogram& delay_seconds;
  metrics::histogram& shadow_delay_seconds;  ///< the holds shadow routes would have made
};

}  // namespace smockron::proxy
