// Admission (see admission.hpp).
#include "proxy/request/admission.hpp"

#include <algorithm>

namespace smockron::proxy {
namespace {

void account(admission_env& env, const runtime& rt, const route& r, wire::status st, std::string_view id,
             std::string_view tier, std::int64_t now_us, std::int64_t delayed_ms, std::int64_t units = 1,
             bool reserve = false, std::int64_t ask = -1) {
  wire::accounting m;
  m.reserve = reserve;
  m.ask = ask;
  m.domain = r.domain;
  m.state = st;
  m.identifier = id;
  m.received_ms = now_us / 1000;
  m.delayed_ms = delayed_ms;
  if (st != wire::status::rejected) {
    m.tier = tier;
    m.cost = units;
    env.metrics.cost_units.inc(static_cast<std::uint64_t>(units));
  }
  env.accounting.account(m, {rt.cfg.accounting_flush, rt.cfg.rejected_sample});
}

// Closes the reservation whose use was at `at_ms`: it cost `delta` units more (fewer, < 0; 0: as reserved).
void adjust(admission_env& env, const runtime& rt, const route& r, std::string_view id, std::int64_t at_ms,
            std::int64_t delta) {
  wire::accounting m;
  m.domain = r.domain;
  m.state = wire::status::rejected;
  m.identifier = id;
  m.received_ms = at_ms;
  m.adjust = delta;
  if (delta != 0)
    (delta > 0 ? env.metrics.cost_units : env.metrics.cost_refunded)
        .inc(static_cast<std::uint64_t>(delta > 0 ? delta : -delta));
  env.accounting.account(m, {rt.cfg.accounting_flush, rt.cfg.rejected_sample});
}

void count_fallback(proxy_metrics& m, cost_fallback why) {
  switch (why) {
    case cost_fallback::none: break;
    case cost_fallback::missing: m.cost_missing.inc(); break;
    case cost_fallback::malformed: m.cost_malformed.inc(); break;
    case cost_fallback::over_max: m.cost_over_max.inc(); break;
  }
}

// Who the request is, or the decision that needs no gate: exempt, refused
// (ambiguous, no master under fail_closed, unidentified on a rejecting
// route) or let through unidentified. True: `a.who` is set, go on to the gate.
bool identified(admission& a, admission_env& env, const runtime& rt, const route& r, const http1::request_head& req,
                const ip_address& peer, std::int64_t now_us) {
  const auto& count = rt.decisions[r.domain_index];
  if (!r.exempt.empty()) {
    const ip_address client = client_address(req.headers, peer, rt.cfg.trusted_proxies, rt.cfg.real_ip_header);
    if (std::any_of(r.exempt.begin(), r.exempt.end(), [&](const cidr& c) { return c.contains(client); })) {
      a.outcome = decision::exempt;
      count[decision::exempt]->inc();
      return false;
    }
  }
  const identify_context ictx{&rt.cfg.trusted_proxies, rt.jwt.get(), now_us / 1'000'000,
                              static_cast<int>(rt.cfg.ipv6_prefix), rt.cfg.real_ip_header};
  identification found = identify(r.identify, req.headers, req.target, peer, ictx);
  if (found.ambiguous != nullptr) {
    // Two values for one identifier: whichever the gate chose, the backend may use the other.
    a.outcome = decision::rejected;
    a.ambiguous = true;
    count[decision::rejected]->inc();
    env.metrics.reject_ambiguous.inc();
    return false;
  }
  a.who = std::move(found.who);
  if (!r.tier.empty()) {
    // A tier is a name or nothing: a value that is no tier name (or two of them) names none.
    identification tier = identify(r.tier, req.headers, req.target, peer, ictx);
    if (tier.who && wire::valid_tier_name(tier.who->value)) a.tier = std::move(tier.who->value);
    else if (tier.who || tier.ambiguous != nullptr) env.metrics.tier_invalid.inc();
  }
  // fail_closed: no master has published this domain's policy lately (none
  // reachable, or none owns the domain): refuse rather than pass.
  if (rt.cfg.fail_closed && !env.g.covered(rt.gate_domain[r.domain_index], now_us)) {
    a.outcome = decision::rejected;
    a.no_master = true;
    count[decision::rejected]->inc();
    env.metrics.reject_no_master.inc();
    return false;
  }
  if (a.who) return true;
  using action = config::route_config::unidentified_action;
  switch (r.unidentified) {
    case action::allow:
      env.metrics.unidentified_allow.inc();
      count[decision::unidentified]->inc();
      return false;
    case action::reject:
      env.metrics.unidentified_reject.inc();
      env.metrics.reject_unidentified.inc();
      count[decision::rejected]->inc();
      a.outcome = decision::rejected;
      a.unidentified = true;
      return false;
    case action::shared:
      env.metrics.unidentified_shared.inc();
      a.who = identity{std::string(k_shared_identifier), nullptr};
      break;
  }
  return true;
}

// A shadow route: what the gate would have done is counted; what happens is
// a request forwarded now (charged as one, refused nothing).
void shadow(admission& a, admission_env& env, const runtime& rt, const route& r, const gate_limits& limits,
            const std::optional<cost_charge>& charged, bool cost_known, std::int64_t now_us) {
  const decision would = a.gate.v == verdict::reject  ? decision::rejected
                         : a.gate.v == verdict::delay ? decision::delayed
                                                      : decision::accepted;
  rt.shadow_decisions[r.domain_index][would]->inc();
  if (would == decision::delayed) {
    env.metrics.shadow_delay_seconds.observe(static_cast<double>(a.gate.release_us - now_us) / 1e6);
    env.g.release_held(limits);  // it is not held
  }
  a.shadow = would;
  a.outcome = decision::accepted;
  a.charge_when_done = !cost_known;
  a.body_limit = -1;
  if (a.charge_when_done && charged) {
    a.reserved = charged->units;
    a.reserved_at_ms = now_us / 1000;
  }
  if (charged) {
    account(env, rt, r, wire::status::accepted, a.who->value, a.tier, now_us, 0, charged->units, a.reserved >= 0);
  }
  rt.decisions[r.domain_index][decision::accepted]->inc();
}

// The gate's verdict: counted, and accounted to the master.
void record_verdict(admission& a, admission_env& env, const runtime& rt, const route& r,
                    const std::optional<cost_charge>& charged, bool deadline_binds, std::int64_t now_us) {
  const std::string_view id = a.who->value;
  const std::int64_t units = charged ? charged->units : 0;
  switch (a.gate.v) {
    case verdict::reject:
      a.outcome = decision::rejected;
      (a.gate.reason == reject_reason::held_full         ? env.metrics.reject_held_full
       : a.gate.reason == reject_reason::cost_over_limit ? env.metrics.reject_cost_over_limit
       : deadline_binds                                  ? env.metrics.reject_grpc_deadline
                                                         : env.metrics.reject_too_long)
          .inc();
      account(env, rt, r, wire::status::rejected, id, {}, now_us, 0);
      break;
    case verdict::delay:
      a.outcome = decision::delayed;
      if (a.exact) {
        env.metrics.delay_seconds.observe(static_cast<double>(a.gate.release_us - now_us) / 1e6);
        break;  // accounted once the master says it may go (exact_went)
      }
      // Reported when the hold starts, with the time it will be forwarded:
      // the master then knows every gatekeeper's reservations within a round
      // trip, which is what holds one limit across gatekeepers. A prepaid
      // slot (given back by a held client that left) was reported already.
      // (A body without a length and no estimate is accounted when the request is done.)
      if (!a.gate.prepaid && charged) {
        account(env, rt, r, wire::status::delayed, id, a.tier, now_us, (a.gate.release_us + 999) / 1000, units,
                a.reserved >= 0);
      }
      env.metrics.delay_seconds.observe(static_cast<double>(a.gate.release_us - now_us) / 1e6);
      break;
    case verdict::accept:
      a.outcome = decision::accepted;
      if (charged && !a.exact)
        account(env, rt, r, wire::status::accepted, id, a.tier, now_us, 0, units, a.reserved >= 0);
      break;
  }
  // An exact request is counted once the master has answered (exact_went, exact_refused).
  if (!a.exact) rt.decisions[r.domain_index][a.outcome]->inc();
}

}  // namespace

admission admit(admission_env& env, const runtime& rt, const route& r, const http1::request_head& req,
                const ip_address& peer, std::int64_t now_us, std::int64_t deadline_us, std::string_view body_prefix) {
  admission a;
  if (r.domain.empty()) {
    a.outcome = decision::exempt;
    env.metrics.exempt_no_domain.inc();
    return a;
  }
  if (!identified(a, env, rt, r, req, peer, now_us)) return a;
  gate_limits limits = rt.route_limits[r.index];
  const bool deadline_binds = deadline_us >= 0 && deadline_us < limits.max_delay_us;
  if (deadline_binds) limits.max_delay_us = deadline_us;
  // The cost, when it is known now; else the estimate a response-charged
  // request (or a body without a length, on a route that gives one)
  // reserves: either is charged before admission (it must fit). A body
  // without a length and no estimate is charged only when it is done.
  const std::optional<cost_charge> cost = cost_at_admission(r, req);
  if (cost) count_fallback(env.metrics, cost->why);
  const std::optional<cost_charge> charged = cost ? cost : estimate_at_admission(r, req, body_prefix);
  if (!cost && charged) count_fallback(env.metrics, charged->why);  // an estimate not read as asked
  const std::int64_t units = charged ? charged->units : 0;
  // A held request's successor waits out its own cost (planned with it),
  // and a cost known only when the request is done, taken as cost_default.
  const std::int64_t pace_units = charged ? 1 : std::max<std::int64_t>(1, r.cost_default);
  a.gate = env.g.decide(rt.gate_domain[r.domain_index], a.who->value, now_us, limits, units, pace_units, a.tier,
                        !r.tier.empty());
  if (r.shadow) {
    shadow(a, env, rt, r, limits, charged, cost.has_value(), now_us);
    return a;
  }
  a.charge_when_done = !cost && a.gate.v != verdict::reject;
  // Exact admission: a request whose units are known now (its cost or its
  // estimate) asks the master before it goes. (A body without a length does
  // not: its size is counted as it streams, its bound what fits here when it
  // goes, and a cut may come before it goes; with an estimate, that is
  // reserved at admission, as elsewhere.)
  const bool streamed_cost = !cost && r.cost.type == config::route_config::cost_source::kind::request_bytes;
  a.exact = charged && !streamed_cost && a.gate.v != verdict::reject && env.exact != nullptr && env.exact->any() &&
            env.exact->exact(r.domain, now_us) && env.accounting.delivers(r.domain);
  a.exact_units = units;
  a.max_delay_us = limits.max_delay_us;
  // A body without a length is cut off past what fits: what fits now, or
  // after the estimate it reserves (-1: no bound known).
  if (a.charge_when_done && r.cost.type == config::route_config::cost_source::kind::request_bytes)
    a.body_limit = !charged || a.gate.fit_units < 0 ? a.gate.fit_units : units + a.gate.fit_units;
  if (a.charge_when_done && charged) {
    a.reserved = units;
    a.reserved_at_ms = a.gate.v == verdict::delay ? (a.gate.release_us + 999) / 1000 : now_us / 1000;
  }
  record_verdict(a, env, rt, r, charged, deadline_binds, now_us);
  return a;
}

void charge_done(admission_env& env, const runtime& rt, const route& r, const admission& a, const cost_charge& cost,
                 std::int64_t now_us) {
  if (!a.charge_when_done || !a.who) return;
  count_fallback(env.metrics, cost.why);
  const auto domain = rt.gate_domain[r.domain_index];
  if (a.reserved < 0) {
    account(env, rt, r, wire::status::accepted, a.who->value, a.tier, now_us, 0, cost.units);
    env.g.charge(domain, a.who->value, cost.units, now_us, a.tier);
    return;
  }
  // No cost field (the client or the upstream broke off, the upstream never
  // said): the request keeps the estimate it reserved.
  const std::int64_t delta = cost.why == cost_fallback::missing ? 0 : cost.units - a.reserved;
  adjust(env, rt, r, a.who->value, a.reserved_at_ms, delta);  // closes it, whatever the difference
  if (delta > 0) env.g.charge(domain, a.who->value, delta, now_us, a.tier);
  else if (delta < 0) env.g.refund(domain, a.who->value, -delta, now_us, a.tier);
}

void exact_went(admission_env& env, const runtime& rt, const route& r, admission& a, std::int64_t now_us,
                std::int64_t ask) {
  if (!a.exact) return;
  a.exact = false;
  rt.decisions[r.domain_index][a.outcome]->inc();
  if (a.reserved >= 0) a.reserved_at_ms = now_us / 1000;  // the reservation's use is now
  account(env, rt, r, wire::status::accepted, a.who->value, a.tier, now_us, 0, a.exact_units, a.reserved >= 0, ask);
}

void exact_refused(admission_env& env, const runtime& rt, const route& r, admission& a, bool never,
                   std::int64_t now_us) {
  a.exact = false;
  a.charge_when_done = false;  // never forwarded
  a.reserved = -1;
  a.outcome = decision::rejected;
  rt.decisions[r.domain_index][decision::rejected]->inc();
  (never ? env.metrics.reject_cost_over_limit : env.metrics.reject_too_long).inc();
  account(env, rt, r, wire::status::rejected, a.who->value, {}, now_us, 0);
  // The gate counted the units when it let the request on: they were not used.
  if (a.exact_units > 0) env.g.refund(rt.gate_domain[r.domain_index], a.who->value, a.exact_units, now_us, a.tier);
}

void exact_abandoned(admission_env& env, const runtime& rt, const route& r, admission& a, std::int64_t now_us,
                     std::int64_t ask) {
  if (!a.exact) return;
  if (ask >= 0) account(env, rt, r, wire::status::accepted, a.who->value, {}, now_us, 0, 0, false, ask);
  a.exact = false;
  a.charge_when_done = false;
  a.reserved = -1;
  rt.decisions[r.domain_index][a.outcome]->inc();
}

void close_reservation(admission_env& env, const runtime& rt, const route& r, admission& a) {
  // (An exact request not yet gone has accounted nothing: there is nothing
  // to close; one whose cost was charged when done, its correction sent, neither.)
  if (a.reserved < 0 || !a.who || a.gate.prepaid || a.exact || !a.charge_when_done) return;
  adjust(env, rt, r, a.who->value, a.reserved_at_ms, 0);
  a.reserved = -1;
  a.charge_when_done = false;
}

}  // namespace smockron::proxy
