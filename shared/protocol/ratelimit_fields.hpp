// Response header fields about the limit: RateLimit-Policy and RateLimit as
// draft-ietf-httpapi-ratelimit-headers-10 defines them (Structured Field
// lists: a policy per rule of the domain, `q` quota and `w` window; `r`
// remaining and `t` seconds until reset). Pure formatting, written by the
// proxy on its responses and by the master in its answers to Envoy (RLS).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shared/protocol/wire.hpp"

namespace smockron {

/// A client's standing under each rule of its domain, as this gatekeeper
/// knows it (the RateLimit-Policy and RateLimit response fields).
struct quota_state {
  struct item {
    std::int64_t quota = 0;      ///< the rule's burst, or the quota's limit: units in one window
    std::int64_t window_s = 0;   ///< burst x interval, or the quota's current window, in whole seconds (at least 1)
    std::int64_t remaining = 0;  ///< units left now; -1: not known here (a quota the client has not exhausted)
    std::int64_t reset_s = 0;    ///< seconds until the quota is whole again
  };
  std::array<item, wire::max_policy_rules + wire::max_quota_items> items{};
  std::size_t count = 0;  ///< 0: no fresh policy for the domain (nothing known)
  /// The item the master named as holding the client (LIMIT); -1: not named,
  /// and a refusal shows every item at zero.
  int limiting = -1;
  /// The client's part of the domain's shared rate, when that is what holds
  /// it (burst 0: not): a policy of its own, "DOMAIN-share".
  struct {
    std::int64_t burst = 0;
    std::int64_t window_s = 0;
  } share;
};

/// Appends "RateLimit-Policy: ..." and "RateLimit: ..." lines (CRLF-ended) for
/// `q`, the client's standing in `domain`; nothing when nothing is known
/// (q.count == 0). `throttled_s` > 0: the request was refused or held that
/// long, so nothing remains until then whatever was counted.
/// Policies are named after the domain ("api"; "api-1", "api-2", ... for several
/// rules, then quotas). A quota whose units left are not known (remaining < 0)
/// is in RateLimit-Policy only. When the master named what holds the client
/// (q.limiting, q.share), only that limit is at zero and the others show what
/// they have left: the refusal names the limit that refused it. A share is
/// "DOMAIN-share", in lines of its own (as concurrency).

void append_ratelimit_fields(std::string& out, std::string_view domain, const quota_state& q, std::int64_t throttled_s);

/// The name append_ratelimit_fields gives item `i` of `q` in `domain`.
std::string policy_name(std::string_view domain, const quota_state& q, std::size_t i);

/// Appends the client's concurrency limit of `limit` requests in flight as a
/// policy of its own, "DOMAIN-concurrency", whose quota unit is
/// concurrent-requests (the draft's `qu`; no window):
/// "RateLimit-Policy: \"api-concurrency\";q=4;qu=\"concurrent-requests\"",
/// and, `refused` (no slot came within max_delay), "RateLimit:
/// \"api-concurrency\";r=0;t=1". Lines of their own: a list field may span
/// several lines (RFC 9110 5.3).
void append_concurrency_fields(std::string& out, std::string_view domain, std::int64_t limit, bool refused);

}  // namespace smockron
