// The proxy's request counters (see proxy_metrics.hpp).
#include "proxy/request/proxy_metrics.hpp"

namespace smockron::proxy {
namespace {

std::vector<double> delay_buckets() { return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}; }

metrics::counter& reject(metrics::registry& r, std::string_view reason) {
  return r.add_counter(
      "smockron_proxy_rejects_total",
      "Requests the gate refused, by reason (503 or the route's status; 403 unidentified; 400 ambiguous_identifier)",
      metrics::labels({{"reason", reason}}));
}

metrics::counter& unidentified(metrics::registry& r, std::string_view action) {
  return r.add_counter("smockron_proxy_unidentified_total",
                       "Requests no identifier source identified, by the route's action (shared: limited together)",
                       metrics::labels({{"action", action}}));
}

metrics::counter& upstream_error(metrics::registry& r, std::string_view kind) {
  return r.add_counter("smockron_proxy_upstream_errors_total", "Upstream failures by kind",
                       metrics::labels({{"kind", kind}}));
}

metrics::counter& cost_fallback(metrics::registry& r, std::string_view reason) {
  return r.add_counter("smockron_proxy_cost_fallback_total",
                       "Request costs not charged as read: missing or malformed (cost_default charged), over_max "
                       "(cost_max charged)",
                       metrics::labels({{"reason", reason}}));
}

metrics::counter& protocol(metrics::registry& r, std::string_view name) {
  return r.add_counter("smockron_proxy_http_requests_total", "Requests by the protocol they came in",
                       metrics::labels({{"protocol", name}}));
}

metrics::counter& h2_abuse(metrics::registry& r, std::string_view kind) {
  return r.add_counter(
      "smockron_proxy_http2_abuse_total",
      "HTTP/2 bounds a client crossed, by kind (the stream refused or reset, or the connection closed)",
      metrics::labels({{"kind", kind}}));
}

}  // namespace

proxy_metrics::proxy_metrics(metrics::registry& r)
    : reg(r),
      no_route(r.add_counter("smockron_proxy_no_route_total", "Requests that matched no route (404)")),
      bad_request(r.add_counter("smockron_proxy_bad_requests_total",
                                "Requests refused as malformed (400) or with a body over max_body_bytes (413)")),
      header_too_large(r.add_counter("smockron_proxy_header_too_large_total", "Requests refused with 414 or 431")),
      header_timeout(r.add_counter("smockron_proxy_header_timeouts_total",
                                   "Clients that did not send a request head in time (408)")),
      client_gone_held(r.add_counter("smockron_proxy_held_client_disconnects_total",
                                     "Clients that disconnected while held (dropped, never forwarded)")),
      proxy_protocol_error(r.add_counter("smockron_proxy_proxy_protocol_errors_total",
                                         "Connections closed for a missing, invalid or late PROXY protocol header")),
      tls_handshake_error(r.add_counter("smockron_proxy_tls_handshake_errors_total",
                                        "Client connections closed because their TLS handshake failed or timed out")),
      reject_too_long(reject(r, "delay_too_long")),
      reject_held_full(reject(r, "held_full")),
      reject_no_master(reject(r, "no_master")),
      reject_unidentified(reject(r, "unidentified")),
      reject_ambiguous(reject(r, "ambiguous_identifier")),
      unidentified_shared(unidentified(r, "shared")),
      unidentified_reject(unidentified(r, "reject")),
      unidentified_allow(unidentified(r, "allow")),
      upstream_connect(upstream_error(r, "connect")),
      upstream_timeout(upstream_error(r, "timeout")),
      upstream_reset(upstream_error(r, "reset")),
      upstream_no_server(upstream_error(r, "no_server")),
      upstream_tls(upstream_error(r, "tls")),
      exempt_no_domain(r.add_counter("smockron_proxy_requests_total", "Requests by domain and gate decision",
                                     metrics::labels({{"domain", ""}, {"decision", "exempt"}}))),
      http1_requests(protocol(r, "http/1.1")),
      h2_requests(protocol(r, "h2")),
      reject_grpc_deadline(reject(r, "grpc_deadline")),
      h2_rapid_reset(h2_abuse(r, "rapid_reset")),
      h2_control_flood(h2_abuse(r, "control_flood")),
      h2_continuation_flood(h2_abuse(r, "continuation_flood")),
      h2_header_list(h2_abuse(r, "header_list")),
      h2_too_many_streams(h2_abuse(r, "too_many_streams")),
      h2_stalled_window(h2_abuse(r, "stalled_window")),
      h2_ack_flood(h2_abuse(r, "ack_flood")),
      h2_protocol_error(h2_abuse(r, "protocol")),
      cost_missing(cost_fallback(r, "missing")),
      cost_malformed(cost_fallback(r, "malformed")),
      cost_over_max(cost_fallback(r, "over_max")),
      cost_units(r.add_counter("smockron_proxy_cost_units_total",
                               "Cost units of the uses accounted to the masters (ACCEPTED and DELAYED, and "
                               "corrections of estimates up)")),
      cost_refunded(r.add_counter("smockron_proxy_cost_refunded_units_total",
                                  "Cost units reserved at an estimate and given back (the real cost was lower)")),
      reject_cost_over_limit(reject(r, "cost_over_limit")),
      reject_concurrency(reject(r, "concurrency")),
      concurrency_waits(r.add_counter("smockron_proxy_concurrency_waits_total",
                                      "Requests that waited for a concurrency slot (their identifier's requests in "
                                      "flight were at its lease)")),
      exact_unanswered(r.add_counter("smockron_proxy_exact_unanswered_total",
                                     "Requests of an exact domain that went with no answer from the master within "
                                     "control_fresh (fail-open)")),
      tier_invalid(r.add_counter("smockron_proxy_tier_invalid_total",
                                 "Requests whose tier source gave a value that is no tier name, or two values "
                                 "(judged by the domain's rules)")),
      delay_seconds(
          r.add_histogram("smockron_proxy_delay_seconds", "How long held requests were delayed", delay_buckets())),
      shadow_delay_seconds(r.add_histogram("smockron_proxy_shadow_delay_seconds",
                                           "How long shadow routes would have held requests (they were not)",
                                           delay_buckets())) {}

decision_counters proxy_metrics::decisions(const std::string& domain) {
  decision_counters row;
  for (std::size_t i = 0; i < decision_count; ++i) {
    row[static_cast<decision>(i)] =
        &reg.add_counter("smockron_proxy_requests_total", "Requests by domain and gate decision",
                         metrics::labels({{"domain", domain}, {"decision", k_decision_names[i]}}));
  }
  return row;
}

proxy_metrics::upstream_series proxy_metrics::upstream(const std::string& name) {
  static constexpr std::array<std::string_view, 5> classes = {"1xx", "2xx", "3xx", "4xx", "5xx"};
  upstream_series u;
  for (std::size_t i = 0; i < classes.size(); ++i) {
    u.by_class[i] = &reg.add_counter("smockron_proxy_upstream_responses_total",
                                     "Responses from upstreams, by upstream and status class",
                                     metrics::labels({{"upstream", name}, {"code", classes[i]}}));
  }
  u.seconds = &reg.add_histogram("smockron_proxy_upstream_response_seconds",
                                 "Upstream response time: request sent to response head received",
                                 metrics::exponential_buckets(0.0005, 2, 16), metrics::labels({{"upstream", name}}));
  return u;
}

shadow_decision_counters proxy_metrics::shadow_decisions(const std::string& domain) {
  shadow_decision_counters row;
  for (std::size_t i = 0; i < shadow_decision_count; ++i) {
    row[static_cast<decision>(i)] =
        &reg.add_counter("smockron_proxy_shadow_decisions_total",
                         "What the gate would have decided on shadow routes (the requests were forwarded)",
                         metrics::labels({{"domain", domain}, {"decision", k_decision_names[i]}}));
  }
  return row;
}

}  // namespace smockron::proxy
