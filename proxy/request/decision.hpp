// What became of a request at the gate: the `decision` label of
// smockron_proxy_requests_total, of the access log and of Smockron-Decision.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace smockron::proxy {

/// exempt: not limited (a route without a domain, or a client in the route's `exempt`).
enum class decision : std::uint8_t { accepted, delayed, rejected, unidentified, exempt };
inline constexpr std::size_t decision_count = 5;
/// The gate's verdicts a shadow route counts (accepted, delayed, rejected).
inline constexpr std::size_t shadow_decision_count = 3;

inline constexpr std::array<std::string_view, decision_count> k_decision_names = {"accepted", "delayed", "rejected",
                                                                                  "unidentified", "exempt"};
inline std::string_view to_string(decision d) { return k_decision_names[static_cast<std::size_t>(d)]; }

}  // namespace smockron::proxy
