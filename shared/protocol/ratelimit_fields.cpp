// Rate-limit response fields (see ratelimit_fields.hpp).
#include "shared/protocol/ratelimit_fields.hpp"

#include <algorithm>

namespace smockron {
namespace {

// An sf-string (RFC 8941 3.3.3): printable ASCII, '"' and '\' escaped.
void append_sf_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (const char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c >= 0x20 && c < 0x7f) out.push_back(c);
  }
  out.push_back('"');
}

void append_name(std::string& out, std::string_view domain, const quota_state& q, std::size_t i) {
  if (q.count == 1) append_sf_string(out, domain);  // no string built on a response's path
  else append_sf_string(out, policy_name(domain, q, i));
}

}  // namespace

std::string policy_name(std::string_view domain, const quota_state& q, std::size_t i) {
  std::string name(domain);
  if (q.count == 1) return name;
  name.push_back('-');
  name.append(std::to_string(i + 1));
  return name;
}

void append_ratelimit_fields(std::string& out, std::string_view domain, const quota_state& q,
                             std::int64_t throttled_s) {
  const bool named = q.limiting >= 0 || q.share.burst > 0;
  if (q.share.burst > 0) {
    const std::string name = std::string(domain) + "-share";
    out.append("RateLimit-Policy: ");
    append_sf_string(out, name);
    out.append(";q=").append(std::to_string(q.share.burst)).append(";w=").append(std::to_string(q.share.window_s));
    out.append("\r\n");
    if (throttled_s > 0) {  // what it has left is the master's to know, but for this: nothing until then
      out.append("RateLimit: ");
      append_sf_string(out, name);
      out.append(";r=0;t=").append(std::to_string(throttled_s)).append("\r\n");
    }
  }
  if (q.count == 0) return;
  out.append("RateLimit-Policy: ");
  for (std::size_t i = 0; i < q.count; ++i) {
    if (i > 0) out.append(", ");
    append_name(out, domain, q, i);
    out.append(";q=")
        .append(std::to_string(q.items[i].quota))
        .append(";w=")
        .append(std::to_string(q.items[i].window_s));
  }
  out.append("\r\n");
  // A quota whose units left only the master knows is in the policy, not here.
  bool first = true;
  for (std::size_t i = 0; i < q.count; ++i) {
    const auto& it = q.items[i];
    if (it.remaining < 0) continue;
    out.append(first ? "RateLimit: " : ", ");
    first = false;
    append_name(out, domain, q, i);
    // Held or refused: the limit named as holding it at zero, or every one when none was named.
    const bool holding = throttled_s > 0 && (!named || q.limiting == static_cast<int>(i));
    const std::int64_t remaining = holding ? 0 : it.remaining;
    const std::int64_t reset = holding ? std::max(it.reset_s, throttled_s) : it.reset_s;
    out.append(";r=").append(std::to_string(remaining)).append(";t=").append(std::to_string(reset));
  }
  if (!first) out.append("\r\n");
}

void append_concurrency_fields(std::string& out, std::string_view domain, std::int64_t limit, bool refused) {
  const std::string name = std::string(domain) + "-concurrency";
  out.append("RateLimit-Policy: ");
  append_sf_string(out, name);
  out.append(";q=").append(std::to_string(limit)).append(";qu=\"concurrent-requests\"\r\n");
  if (!refused) return;
  out.append("RateLimit: ");
  append_sf_string(out, name);
  out.append(";r=0;t=1\r\n");
}

}  // namespace smockron
