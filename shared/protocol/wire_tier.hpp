// Tiers on the wire (wire addition; docs/architecture.md, "The wire"). A
// domain's tiers are rule sets a request selects by name (a route's `tier`
// source); the accounting message names the request's tier ("tier=NAME" in
// its loginfo, wire.hpp) and the master applies that tier's rules to the
// identifier unless it has an override. Gatekeepers learn each tier's rules
// from TIER, published beside the domain's POLICY and kept fresh as it is,
// for their first-round-trip guard, the rate-limit fields and concurrency.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "shared/protocol/wire.hpp"

namespace smockron::wire {

/// Master -> gatekeepers: [domain\0, "TIER", name, rules, "N"]: the rules of
/// tier `name` (wire::valid_tier_name) in POLICY's format (empty: none) and
/// its concurrency limit N (0: none). A tier's quotas are not published (as
/// an override's are not). A gatekeeper that does not know it drops it as an
/// unknown command (counted) and uses the domain's rules for every request.
inline constexpr std::string_view tier_command = "TIER";
struct tier_policy {
  std::string_view domain;
  std::string_view name;
  std::array<policy::rule, max_policy_rules> rules{};
  std::size_t count = 0;
  std::int64_t concurrency = 0;
};

result<tier_policy> decode_tier(frames f);
/// Nothing when the name is no tier name, or a rule or the limit is outside its bound (as POLICY, CONCURRENCY).
std::optional<encoded> encode(const tier_policy& m, scratch& s);

}  // namespace smockron::wire
