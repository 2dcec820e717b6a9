// Protocol-independent request steps (see request_steps.hpp).
#include "proxy/request/request_steps.hpp"

#include <algorithm>

#include "proxy/codec/path.hpp"
#include "proxy/identify/client_address.hpp"
#include "proxy/request/ratelimit_fields.hpp"

namespace smockron::proxy {
namespace {

// The request goes on with `path` and the query as sent (the target's part after its first `path_size` bytes).
bool retarget(http1::request_head& req, std::string& target, std::string path, std::size_t path_size) {
  path.append(req.target.substr(path_size));
  target = std::move(path);
  req.target = target;
  return true;
}

// Normalizes the path of the request target (with normalize_path; path.hpp)
// and works out what routes match: the path without segment parameters
// (`route_path`, set only when that differs from the target's path). The
// request then goes on with the normalized target, its parameters kept or
// stripped (path_parameters). False (`why` set) when the path cannot be
// normalized safely, or carries parameters the configuration refuses.
bool prepare_path(const runtime& rt, http1::request_head& req, std::string& target, std::string& route_path,
                  std::string_view& why) {
  const std::string_view p = req.target.substr(0, req.target.find('?'));
  if (!p.starts_with('/')) return true;  // "*" or absolute-form
  using params = config::proxy_config::path_parameters_action;
  const params action = rt.cfg.path_parameters;
  const bool has_params = p.find(';') != std::string_view::npos;
  if (has_params) {
    if (action == params::reject) {
      why = "parameters in path";
      return false;
    }
    // "/api/..;/x": the routes see "/x", a backend that keeps parameters "/api/..;/x".
    if (action == params::keep && path::hides_dot_segment(p)) {
      why = "dot-segment with parameters in path";
      return false;
    }
    route_path = path::strip_parameters(p);
    if (rt.normalize_path) route_path = path::normalize(route_path, rt.path_options, why);
    if (!why.empty()) return false;
    if (action == params::strip) return retarget(req, target, std::string(route_path), p.size());
  }
  if (!rt.normalize_path || path::already_normal(p, rt.path_options)) return true;
  std::string normal = path::normalize(p, rt.path_options, why);
  if (!why.empty()) return false;
  return retarget(req, target, std::move(normal), p.size());
}

}  // namespace

std::size_t body_prefix_wanted(const runtime& rt, const http1::request_head& req, bool unknown_length_readable) {
  if (!rt.json_estimates || req.body == http1::framing::none) return 0;
  const std::string_view t = req.target;
  const route* r = rt.routes.match(req.host, t.substr(0, t.find('?')));
  if (r == nullptr || !r->cost_estimate || r->cost_estimate->type != config::route_config::cost_source::kind::json_body)
    return 0;
  if (req.body == http1::framing::length)
    return std::min<std::uint64_t>(req.content_length, rt.cfg.cost_estimate_bytes);
  return unknown_length_readable ? rt.cfg.cost_estimate_bytes : 0;
}

const route* route_request(const runtime& rt, http1::request_head& req, std::string& target, std::string_view& why) {
  std::string route_path;  // set when routes match another form of the path than the one forwarded
  if (!prepare_path(rt, req, target, route_path, why)) return nullptr;
  const std::string_view t = req.target;
  return rt.routes.match(req.host, route_path.empty() ? t.substr(0, t.find('?')) : std::string_view(route_path));
}

std::string_view refusal_reason(const admission& a) {
  return a.no_master                                       ? "no_master"
         : a.ambiguous                                     ? "ambiguous_identifier"
         : a.unidentified                                  ? "unidentified"
         : a.gate.reason == reject_reason::held_full       ? "held_full"
         : a.gate.reason == reject_reason::cost_over_limit ? "cost_over_limit"
                                                           : "delay_too_long";
}

void append_limit_fields(std::string& out, gate& g, const runtime& rt, const route& r, const admission& a,
                         std::int64_t now_us, std::int64_t concurrency) {
  // A cost no wait lets through is not a client's standing: no rate-limit fields for it.
  const bool limited =
      a.outcome == decision::delayed || (a.outcome == decision::rejected && a.gate.v == verdict::reject &&
                                         a.gate.reason != reject_reason::cost_over_limit);
  if (a.who && !r.domain.empty() && (limited || r.ratelimit_headers)) {
    const auto q = g.quota(rt.gate_domain[r.domain_index], a.who->value, now_us, a.tier);
    const std::int64_t throttled_s = limited ? std::max<std::int64_t>(1, a.gate.retry_after_s) : 0;
    append_ratelimit_fields(out, r.domain, q, throttled_s);
  }
  // A concurrency limit is described on every response of a route that asks for the fields.
  if (a.who && concurrency > 0 && r.ratelimit_headers) append_concurrency_fields(out, r.domain, concurrency, false);
  if (r.explain) {
    append_decision_field(out, a.outcome, a.shadow, refusal_reason(a),
                          a.outcome == decision::delayed ? (a.gate.release_us - now_us + 999) / 1000 : 0);
  }
}

refusal refusal_for_cost_cut(const route& r) {
  // No wait would let it through: no Retry-After (it would be a promise not kept).
  return {r.status, "request cost exceeds the rate limit's burst or quota\n", 0};
}

refusal refusal_for(const route& r, const admission& a) {
  if (a.ambiguous) return {400, "bad request: more than one value for the client identifier\n", 0};
  if (a.no_master) return {503, "no rate-limit master covers this route, retry later\n", 1};
  if (a.unidentified) return {403, "this route needs an identifier the request does not carry\n", 0};
  // A full queue is the proxy's own capacity, not the client's limit: 503 whatever the route's status.
  if (a.gate.reason == reject_reason::held_full)
    return {503, "too many requests held, retry later\n", a.gate.retry_after_s};
  if (a.gate.reason == reject_reason::cost_over_limit) return refusal_for_cost_cut(r);
  return {r.status, "rate limit exceeded, retry later\n", a.gate.retry_after_s};
}

namespace {

// ---- traces (trace_endpoint): a span per held or refused request ----------------

/// The request's place in its caller's trace (W3C traceparent), if it names one.
std::optional<tracing::context> parent_of(const http1::request_head& req) {
  const auto v = req.headers.first("traceparent");
  return v ? tracing::parse_traceparent(*v) : std::nullopt;
}

/// A span about the limit of route `r` on the admitted request: its domain,
/// whom (a hash of the identifier) and where it was going.
tracing::span limit_span(const runtime& rt, const route& r, const admission& a, std::string_view name,
                         const tracing::trace_id& trace, std::optional<tracing::span_id> parent, std::int64_t start_us,
                         std::int64_t end_us) {
  tracing::span s;
  s.trace = trace;
  s.id = tracing::exporter::new_span_id();
  s.parent = parent;
  s.name = name;
  s.start_ns = tracing::unix_ns(start_us);
  s.end_ns = tracing::unix_ns(end_us);
  s.add("smockron.domain", r.domain);
  if (a.who) s.add_hash("smockron.identifier_hash", tracing::identifier_hash(a.who->value));
  s.add("smockron.upstream", rt.cfg.upstreams[r.upstream_index].name);
  return s;
}

void trace_refusal(tracing::exporter& tracer, const runtime& rt, const route& r, const http1::request_head& req,
                   const admission& a, const refusal& no, std::int64_t now_us) {
  const auto parent = parent_of(req);
  if (!tracer.sampled(parent)) return;
  tracing::span s = limit_span(rt, r, a, "smockron.refuse", parent ? parent->trace : tracing::exporter::new_trace_id(),
                               parent ? std::optional(parent->parent) : std::nullopt, now_us, now_us);
  s.add_literal("smockron.decision", "refused");
  s.add_literal("smockron.reason", refusal_reason(a));
  s.add("http.response.status_code", no.status);
  s.add("smockron.retry_after_s", no.retry_after_s);
  s.error = true;
  tracer.submit(s);
}

}  // namespace

steps_decision plan_request(admission_env& env, const runtime& rt, http1::request_head& req, std::string& target,
                            const ip_address& peer, std::int64_t deadline_us, admission& adm,
                            std::string& response_fields, access_entry* entry, std::int64_t now_us,
                            std::string_view body_prefix) {
  steps_decision p;
  if (req.body == http1::framing::length && rt.cfg.max_body_bytes > 0 && req.content_length > rt.cfg.max_body_bytes) {
    env.metrics.bad_request.inc();
    p.status = 413;
    p.text = "request body too large\n";
    p.body_unread = true;
    return p;
  }
  p.r = route_request(rt, req, target, p.why);
  if (!p.why.empty()) {
    env.metrics.bad_request.inc();
    p.status = 400;
    p.body_unread = true;
    return p;
  }
  if (!p.r) {
    env.metrics.no_route.inc();
    p.status = 404;
    p.text = "no route\n";
    return p;
  }
  const route& r = *p.r;
  adm = admit(env, rt, r, req, peer, now_us, deadline_us, body_prefix);
  append_limit_fields(response_fields, env.g, rt, r, adm, now_us,
                      env.concurrency != nullptr ? concurrency_limit(*env.concurrency, r, adm, now_us) : 0);
  if (entry) note_admission(*entry, r, adm);
  switch (adm.outcome) {
    case decision::rejected: {
      const refusal no = refusal_for(r, adm);
      p.status = no.status;
      p.text = no.text;
      p.retry_after_s = no.retry_after_s;
      p.by_limit = adm.gate.v == verdict::reject && !adm.ambiguous && !adm.no_master && !adm.unidentified;
      if (p.by_limit && env.tracer) trace_refusal(*env.tracer, rt, r, req, adm, no, now_us);
      return p;
    }
    case decision::delayed:
      p.next = next_step::hold;
      if (env.tracer) {
        const auto parent = parent_of(req);
        if (env.tracer->sampled(parent)) {
          adm.trace = admission::traced_hold{parent ? parent->trace : tracing::exporter::new_trace_id(),
                                             parent ? std::optional(parent->parent) : std::nullopt, now_us};
        }
      }
      return p;
    default: p.next = next_step::forward; return p;
  }
}

void end_hold(admission_env& env, const runtime& rt, const route& r, admission& a, hold_end end, std::int64_t now_us) {
  env.g.release_held(rt.route_limits[r.index]);
  if (env.tracer && a.trace) {
    tracing::span s = limit_span(rt, r, a, "smockron.hold", a.trace->trace, a.trace->parent, a.trace->since_us, now_us);
    s.add_literal("smockron.decision", end == hold_end::released ? "held" : "held_client_left");
    s.add("smockron.held_ms", (now_us - a.trace->since_us) / 1000);
    env.tracer->submit(s);
  }
  if (end == hold_end::released) return;
  env.metrics.client_gone_held.inc();
  if (a.exact) rt.decisions[r.domain_index][a.outcome]->inc();  // not counted yet: it had not asked
  env.g.cancel(rt.gate_domain[r.domain_index], a.who->value, a.gate, now_us);
  close_reservation(env, rt, r, a);
}

std::unique_ptr<access_entry> begin_entry(const runtime& rt, const http1::request_head& req, const ip_address& peer,
                                          std::string_view peer_text, std::int64_t now_us) {
  auto e = std::make_unique<access_entry>();
  e->time_us = now_us;
  e->client = format_ip(client_address(req.headers, peer, rt.cfg.trusted_proxies, rt.cfg.real_ip_header));
  e->peer = peer_text;
  e->method = req.method;
  e->target = redact_query(req.target, rt.redacted_query);  // hashed credentials stay hashed
  return e;
}

void note_outcome(access_entry& e, const runtime& rt, const route* r, const request_outcome& o) {
  e.bytes_in = o.bytes_in;
  e.bytes_out = o.bytes_out;
  if (r && o.server) e.upstream = to_string(rt.servers[r->upstream_index][*o.server]);
}

http1::forward_info next_hop(const runtime& rt, const ip_address& peer, std::string_view peer_text, bool tls) {
  http1::forward_info info;
  info.peer_ip = peer_text;
  info.proto = tls ? "https" : "http";
  info.forwarded_element = rt.cfg.real_ip_header == config::proxy_config::real_ip_header_kind::forwarded;
  info.trusted_peer = std::any_of(rt.cfg.trusted_proxies.begin(), rt.cfg.trusted_proxies.end(),
                                  [&](const cidr& c) { return c.contains(peer); });
  return info;
}

void note_admission(access_entry& e, const route& r, const admission& a) {
  e.decision = to_string(a.outcome);
  e.shadow = a.shadow ? to_string(*a.shadow) : std::string_view{};
  e.domain = r.domain;
  if (a.who) e.identifier = a.who->value;
}

std::int64_t concurrency_limit(const concurrency_policies& p, const route& r, const admission& a, std::int64_t now_us) {
  if (!p.any() || !a.who || a.shadow || r.domain.empty()) return 0;
  if (a.outcome != decision::accepted && a.outcome != decision::delayed) return 0;  // exempt
  return p.limit(r.domain, a.who->value, now_us, a.tier);
}

refusal refusal_for_exact(gate& g, const runtime& rt, const route& r, const admission& a, std::int64_t wait_us,
                          std::int64_t now_us, std::string& response_fields) {
  response_fields.clear();
  const bool never = wait_us < 0;
  const refusal no = never ? refusal_for_cost_cut(r)
                           : refusal{r.status, "rate limit exceeded, retry later\n",
                                     std::max<std::int64_t>(1, (wait_us + 999'999) / 1'000'000)};
  // As append_limit_fields has them for the gate's own refusals: a cost
  // that never fits says nothing of the client's standing (the fields only
  // where the route asks for them on every response).
  if (a.who && !r.domain.empty() && (!never || r.ratelimit_headers)) {
    append_ratelimit_fields(response_fields, r.domain,
                            g.quota(rt.gate_domain[r.domain_index], a.who->value, now_us, a.tier),
                            never ? 0 : no.retry_after_s);
  }
  if (r.explain)
    append_decision_field(response_fields, decision::rejected, a.shadow, never ? "cost_over_limit" : "delay_too_long",
                          0);
  return no;
}

refusal refusal_for_concurrency(const route& r, std::int64_t limit, std::string& response_fields) {
  // The fields name the limit that refused it (none left now; a slot may free within a second).
  if (limit > 0) append_concurrency_fields(response_fields, r.domain, limit, true);
  return {r.status, "concurrency limit: no slot free within max_delay\n", 1};
}

}  // namespace smockron::proxy
