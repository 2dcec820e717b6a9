// Admission: what the gate decides for one request, with no I/O. Identifies
// the client, applies fail_closed, asks the gate, counts the decision and
// accounts the request to the masters. The session then answers, holds or
// forwards (session.hpp).
#pragma once

#include <cstdint>
#include <optional>

#include "proxy/cluster/accounting_sender.hpp"
#include "proxy/codec/http1.hpp"
#include "proxy/gate/asks.hpp"
#include "proxy/gate/gate.hpp"
#include "proxy/gate/slots.hpp"
#include "proxy/identify/identify.hpp"
#include "proxy/request/cost.hpp"
#include "proxy/request/proxy_metrics.hpp"
#include "proxy/request/routes.hpp"
#include "proxy/request/runtime.hpp"
#include "shared/daemon/tracing.hpp"

namespace smockron::proxy {

struct admission {
  decision outcome = decision::unidentified;
  std::optional<identity> who;  ///< nothing: no identifier source yielded a value (the request passes)
  /// The tier the request names (the route's `tier` source; empty: none, or
  /// a value that is no tier name): the master's and the guard's rules are
  /// that tier's, and its accounting messages carry it.
  std::string tier;
  gate_decision gate;         ///< the gate's answer (when identified and not refused for no_master)
  bool no_master = false;     ///< refused under fail_closed: no master covers the route's domain
  bool unidentified = false;  ///< refused: no source identified it and the route rejects such requests
  bool ambiguous = false;     ///< refused (400): an identifier source found more than one value
  /// Shadow route: what the gate would have done (`outcome` is then accepted: the request goes on).
  std::optional<decision> shadow;
  /// The request's cost is known only once it is done (the route's cost is a
  /// response field, or the size of a body without a length): charge_done()
  /// accounts it with its cost.
  bool charge_when_done = false;
  /// A response-charged request, or a body without a length on a route with
  /// an estimate: the units of the estimate reserved (charged and accounted)
  /// at admission, which charge_done() corrects; -1: none (a body without a
  /// length and no estimate, whose use is accounted only when it is done).
  std::int64_t reserved = -1;
  std::int64_t reserved_at_ms = 0;  ///< the time the reservation was accounted at (its use's time)
  /// A route whose cost is the request body's size, and a body without a
  /// length: the bytes that fit when the request goes (its estimate, if it
  /// reserved one, and the gate's fit_units after it); a body growing past
  /// them is cut off. -1: no bound.
  std::int64_t body_limit = -1;
  /// A held request whose span is recorded (trace_endpoint, sampled): its
  /// trace (the request's traceparent, if it had one) and when the hold began.
  struct traced_hold {
    tracing::trace_id trace{};
    std::optional<tracing::span_id> parent;
    std::int64_t since_us = 0;
  };
  std::optional<traced_hold> trace;
  /// Exact admission: its domain's master answers ASK, so the request asks
  /// before it goes (proxy/gate/asks.hpp) and is accounted only then
  /// (exact_went); cleared once it is.
  bool exact = false;
  std::int64_t exact_units = 0;  ///< the units it asks for (its cost, or the estimate it reserves)
  /// How long it may wait from its admission: the route's max_delay, or its gRPC deadline when shorter.
  std::int64_t max_delay_us = 0;
};

/// The identifier every unidentified request of a route shares (action
/// "shared"). A client that sends "-" as its key shares that budget too: no
/// way around the limit, only into the crowd.
inline constexpr std::string_view k_shared_identifier = "-";

/// What admission uses beyond the request (the worker's sender; shared rest).
struct admission_env {
  gate& g;
  proxy_metrics& metrics;
  accounting_sender& accounting;
  /// The concurrency limits masters publish (the rate-limit fields describe a client's); nullptr: none.
  const concurrency_policies* concurrency = nullptr;
  /// trace_endpoint: where the spans of held and refused requests go; nullptr: off.
  tracing::exporter* tracer = nullptr;
  /// The domains whose masters answer ASK (exact admission); nullptr: none.
  const exact_domains* exact = nullptr;
};

/// Decides request `req` on route `r` from `peer` at wall time `now_us`. A
/// delayed request holds a place among the held: the caller calls
/// gate::release_held(rt.route_limits[r.index]) when the hold ends (and
/// gate::cancel() when the client left). A route without a domain, and a
/// client in the route's `exempt`, pass unlimited and unaccounted (exempt).
/// A shadow route decides and counts the would-be decision, then passes the
/// request and accounts it as accepted: the master sees the real usage.
/// `deadline_us` >= 0: the request cannot wait longer than this (a gRPC
/// call's grpc-timeout): a hold beyond it is refused as one beyond max_delay
/// is, counted as reason grpc_deadline.
/// `body_prefix`: the start of the request body, read before admission for a
/// route whose estimate is a number in it (body_prefix_wanted()).
admission admit(admission_env& env, const runtime& rt, const route& r, const http1::request_head& req,
                const ip_address& peer, std::int64_t now_us, std::int64_t deadline_us = -1,
                std::string_view body_prefix = {});

/// A request admitted with charge_when_done is done (forwarded, answered or
/// failed) at `now_us`. One that reserved an estimate has it corrected: the
/// difference is accounted as an adjustment of the reservation's use (a
/// REJECTED message with adjust=, which a spec master ignores: it counted the
/// reservation as the request's one use) and charged or given back by the
/// gate's guard. Otherwise its use is accounted now, ACCEPTED at that time
/// with its cost, and the guard charges it. Call it once, only for a request
/// that was forwarded.
void charge_done(admission_env& env, const runtime& rt, const route& r, const admission& a, const cost_charge& cost,
                 std::int64_t now_us);

/// Exact admission: the request goes now (its ANSWER said go, or none came
/// in time): its accounting message leaves, ACCEPTED at `now_us` with its
/// units (a reservation, for a cost known only at the end), and settles the
/// master's GO to ASK number `ask` (-1: none, it went without an answer).
void exact_went(admission_env& env, const runtime& rt, const route& r, admission& a, std::int64_t now_us,
                std::int64_t ask);
/// Exact admission: the master's answer refused the request (`never`: its
/// units never fit; else not within max_delay): counted, accounted as
/// REJECTED, and the units the gate took for it given back.
void exact_refused(admission_env& env, const runtime& rt, const route& r, admission& a, bool never,
                   std::int64_t now_us);
/// Exact admission: the client left while its request waited for the master
/// (nothing was accounted): its decision is counted as the gate made it, and
/// a GO it was held for (ASK number `ask`; -1: none) settled with no units.
void exact_abandoned(admission_env& env, const runtime& rt, const route& r, admission& a, std::int64_t now_us,
                     std::int64_t ask = -1);

/// An admitted request that reserved an estimate will not be forwarded (its
/// client left while it was held or waited for a concurrency slot, or no slot
/// came): the reservation is closed at its estimate, as a known cost stays
/// charged (the client is charged it, as the slot it held was; a prepaid
/// slot's reservation was closed by its own), once: `a` holds it no more, and
/// nothing is charged when the exchange ends.
void close_reservation(admission_env& env, const runtime& rt, const route& r, admission& a);

}  // namespace smockron::proxy
