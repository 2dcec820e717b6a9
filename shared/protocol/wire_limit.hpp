// Which limit holds a client, on the wire (wire addition; docs/architecture.md,
// "The wire"). DELAY_UNTIL says until when a client waits, not why: with
// several rules, quotas or a shared rate, a gatekeeper could only answer a
// refusal with every limit at zero. LIMIT names the one that set the time, so
// that the refusal's RateLimit field names it (and a share, which gatekeepers
// do not otherwise know, is described).
#pragma once

#include <optional>
#include <string_view>

#include "shared/protocol/wire.hpp"

namespace smockron::wire {

/// Master -> gatekeepers: [domain\0, "LIMIT", identifier, NEXT_MS, which],
/// published right after the DELAY_UNTIL of the same identifier and NEXT_MS
/// (the same connection keeps them in order). which: "rule:I" (the client's
/// I-th POLICY rule, from 0), "quota:I" (the domain's I-th QUOTA item), or
/// "share:INTERVAL_US/BURST" (the client's part of the domain's shared rate,
/// in POLICY's rule format and bounds). The master sends it only for a client
/// with more than one limit (with one, there is nothing to name). A
/// gatekeeper that does not know it drops it as an unknown command (counted)
/// and answers a refusal as before: every limit at zero.
inline constexpr std::string_view limit_command = "LIMIT";
struct limit_notice {
  std::string_view domain;
  std::string_view identifier;
  std::int64_t next_ms = 0;
  limit_ref limit;  ///< never kind none
};

result<limit_notice> decode_limit(frames f);
/// The LIMIT for `d` (its domain, identifier, next_ms and limit); nothing when
/// d.limit is kind none, an index is past the wire's bounds or a share is
/// outside POLICY's.
std::optional<encoded> encode_limit(const delay_until& d, scratch& s);

}  // namespace smockron::wire
