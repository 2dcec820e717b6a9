// The steps of one request that do not depend on how it arrived: its route
// (path prepared as the configuration says), the fields the proxy adds about
// the limit, what a refusal answers, the end of a hold, and the access-log
// record begun, and plan_request, which takes a request through them. An
// HTTP/1.1 connection (proxy/http1/session.cpp) and an HTTP/2 stream
// (proxy/h2/streams.cpp) run the same steps, so both protocols are limited alike.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "proxy/codec/http1.hpp"
#include "proxy/gate/slots.hpp"
#include "proxy/io/conn_io.hpp"
#include "proxy/request/access_log.hpp"
#include "proxy/request/admission.hpp"
#include "proxy/request/runtime.hpp"

namespace smockron::proxy {

/// The route of `req`, its path prepared first: normalized (normalize_path)
/// and its segment parameters kept, stripped or refused (path_parameters).
/// A rewritten target goes into `target` and `req.target` points there.
/// nullptr when no route matches, or `why` set when the path is refused.
const route* route_request(const runtime& rt, http1::request_head& req, std::string& target, std::string_view& why);

/// How many bytes of the request body to read before its steps: a route whose
/// cost estimate is a number in the JSON body wants its start (at most
/// cost_estimate_bytes, at most the declared length; `unknown_length_readable`:
/// a body of unknown length is read as it comes, as HTTP/2's DATA are; not
/// HTTP/1.1's chunked coding, whose estimate is then cost_default). 0: nothing. Matches the route on the host and
/// the path as sent (the steps match it again, on the prepared path).
std::size_t body_prefix_wanted(const runtime& rt, const http1::request_head& req, bool unknown_length_readable);

/// Appends the rate-limit fields (always when limited; on every response
/// with ratelimit_headers) and the decision (explain) as header lines.
/// `concurrency`: the client's concurrency limit (0: none), described with ratelimit_headers.
void append_limit_fields(std::string& out, gate& g, const runtime& rt, const route& r, const admission& a,
                         std::int64_t now_us, std::int64_t concurrency = 0);

/// Why a refused admission was refused, as the explain field and a trace name it.
std::string_view refusal_reason(const admission& a);

/// What a refused admission answers: the status, a short text, Retry-After.
struct refusal {
  unsigned status = 503;
  std::string_view text;
  std::int64_t retry_after_s = 0;
};
refusal refusal_for(const route& r, const admission& a);
/// A request whose cost can never fit (cost_over_limit), refused at
/// admission or cut off as its body grew past what fits (cut_by_cost): the
/// route's status, no Retry-After.
refusal refusal_for_cost_cut(const route& r);

/// What a request's steps decided before any I/O: the proxy answers it,
/// holds it until `adm.gate.release_us`, or forwards it.
enum class next_step : std::uint8_t { answer, hold, forward };
struct steps_decision {
  next_step next = next_step::answer;
  const route* r = nullptr;  ///< set unless no route matched or the path was refused
  unsigned status = 0;       ///< next_step::answer: the status
  std::string_view text;     ///< its text (empty when `why` is set)
  std::string_view why;      ///< a 400's reason: the text is "bad request: WHY\n"
  std::int64_t retry_after_s = 0;
  bool by_limit = false;     ///< refused by the client's limit (a gRPC call then gets the route's grpc_status)
  bool body_unread = false;  ///< refused for the request itself (413, 400): its body may still be arriving
};

/// The steps every request takes, whatever its protocol, up to its answer,
/// hold or forwarding: the declared body size (413), the route (400 for a
/// refused path, 404 for none), admission (identification, the gate,
/// accounting; `deadline_us` as admit()'s), the limit fields the response
/// carries (appended to `response_fields`) and the access-log record's
/// admission part (`entry`, when logging). Each refusal is counted.
/// `adm` is filled for a request that reached admission.
steps_decision plan_request(admission_env& env, const runtime& rt, http1::request_head& req, std::string& target,
                            const ip_address& peer, std::int64_t deadline_us, admission& adm,
                            std::string& response_fields, access_entry* entry, std::int64_t now_us,
                            std::string_view body_prefix = {});

/// A hold ended: its place among the held is free; a client that left gives
/// its slot back to the gate (and is counted), and its reservation is closed.
void end_hold(admission_env& env, const runtime& rt, const route& r, admission& a, hold_end end, std::int64_t now_us);

/// The concurrency limit of the admitted request's identifier (0: none, or
/// the request is not limited: unidentified, exempt, a shadow route). A
/// request under one takes a slot (proxy/gate/slots.hpp) before it goes.
std::int64_t concurrency_limit(const concurrency_policies& p, const route& r, const admission& a, std::int64_t now_us);
/// What a request answers when no concurrency slot came within max_delay:
/// the route's status, Retry-After 1 (a slot is freed when any request of the
/// client ends, which nobody here can promise sooner).
/// A request that found no concurrency slot within max_delay (its
/// identifier's `limit`): the route's status, Retry-After 1, and the
/// concurrency policy with nothing left appended to `response_fields`.
refusal refusal_for_concurrency(const route& r, std::int64_t limit, std::string& response_fields);

/// What a request of an exact domain answers when the master's answer puts
/// its units past max_delay (`wait_us` from now): the route's status,
/// Retry-After then; `wait_us` < 0: they never fit (refusal_for_cost_cut).
/// The fields the request was planned with (the gate's view before the
/// master's word) make way for a refusal's, as the gate's own refusals
/// carry them: the RateLimit fields with the limit at r=0 until Retry-After
/// at least (for a cost that never fits, only on a route with
/// `ratelimit_headers`, as they stand), and the route's `explain`.
refusal refusal_for_exact(gate& g, const runtime& rt, const route& r, const admission& a, std::int64_t wait_us,
                          std::int64_t now_us, std::string& response_fields);

/// The access-log record of `req`, begun when its head is complete.
std::unique_ptr<access_entry> begin_entry(const runtime& rt, const http1::request_head& req, const ip_address& peer,
                                          std::string_view peer_text, std::int64_t now_us);
/// The record's admission part: decision, shadow, domain, identifier.
void note_admission(access_entry& e, const route& r, const admission& a);
/// The record's exchange part: body bytes each way and the upstream server
/// (when `r` and one was used).
void note_outcome(access_entry& e, const runtime& rt, const route* r, const request_outcome& o);

/// What the next hop is told of the request's origin (X-Forwarded-*,
/// Forwarded): the peer, the listener's scheme, whether the peer is trusted.
http1::forward_info next_hop(const runtime& rt, const ip_address& peer, std::string_view peer_text, bool tls);

}  // namespace smockron::proxy
