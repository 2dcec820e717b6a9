// Response header fields about the limit: RateLimit-Policy and RateLimit as
// draft-ietf-httpapi-ratelimit-headers-10 defines them (Structured Field
// lists: a policy per rule of the domain, `q` quota and `w` window; `r`
// remaining and `t` seconds until reset), and the opt-in Smockron-Decision
// field that explains what the gate did. Pure formatting.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proxy/gate/gate.hpp"
#include "proxy/request/decision.hpp"

namespace smockron::proxy {

/// Appends "RateLimit-Policy: ..." and "RateLimit: ..." lines (CRLF-ended) for
/// `q`, the client's standing in `domain`; nothing when nothing is known
/// (q.count == 0). `throttled_s` > 0: the request was refused or held that
/// long, so nothing remains until then whatever this gatekeeper counted.
/// Policies are named after the domain ("api"; "api-1", "api-2", ... for several
/// rules, then quotas). A quota whose units left are not known here (the
/// master counts them; known here once exhausted) is in RateLimit-Policy only.
void append_ratelimit_fields(std::string& out, std::string_view domain, const quota_state& q, std::int64_t throttled_s);

/// Appends the client's concurrency limit of `limit` requests in flight as a
/// policy of its own, "DOMAIN-concurrency", whose quota unit is
/// concurrent-requests (the draft's `qu`; no window):
/// "RateLimit-Policy: \"api-concurrency\";q=4;qu=\"concurrent-requests\"",
/// and, `refused` (no slot came within max_delay), "RateLimit:
/// \"api-concurrency\";r=0;t=1". Lines of their own: a list field may span
/// several lines (RFC 9110 5.3).
void append_concurrency_fields(std::string& out, std::string_view domain, std::int64_t limit, bool refused);

/// Appends "Smockron-Decision: accepted" / "delayed;held_ms=250" /
/// "rejected;reason=delay_too_long" (a shadow route adds ";shadow=<would-be>").
/// `reason`: why a rejected request was (delay_too_long, held_full, cost_over_limit, no_master, unidentified).
void append_decision_field(std::string& out, decision d, std::optional<decision> shadow, std::string_view reason,
                           std::int64_t held_ms);

}  // namespace smockron::proxy
