// The opt-in Smockron-Decision response field that explains what the gate
// did; RateLimit-Policy and RateLimit come from shared/protocol/ratelimit_fields.hpp.
// Pure formatting.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proxy/gate/gate.hpp"
#include "proxy/request/decision.hpp"
#include "shared/protocol/ratelimit_fields.hpp"

namespace smockron::proxy {

/// Appends "Smockron-Decision: accepted" / "delayed;held_ms=250" /
/// "rejected;reason=delay_too_long" (a shadow route adds ";shadow=<would-be>").
/// `reason`: why a rejected request was (delay_too_long, held_full, cost_over_limit, no_master, unidentified).
void append_decision_field(std::string& out, decision d, std::optional<decision> shadow, std::string_view reason,
                           std::int64_t held_ms);

}  // namespace smockron::proxy
