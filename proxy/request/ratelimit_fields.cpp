// The Smockron-Decision response field (see ratelimit_fields.hpp).
#include "proxy/request/ratelimit_fields.hpp"

namespace smockron::proxy {

void append_decision_field(std::string& out, decision d, std::optional<decision> shadow, std::string_view reason,
                           std::int64_t held_ms) {
  out.append("Smockron-Decision: ").append(to_string(d));
  if (d == decision::delayed) out.append(";held_ms=").append(std::to_string(held_ms));
  if (d == decision::rejected) out.append(";reason=").append(reason);
  if (shadow) out.append(";shadow=").append(to_string(*shadow));
  out.append("\r\n");
}

}  // namespace smockron::proxy
