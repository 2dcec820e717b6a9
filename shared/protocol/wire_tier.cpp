// TIER codec (see wire_tier.hpp): POLICY's rules frame, CONCURRENCY's number.
#include "shared/protocol/wire_tier.hpp"

#include <algorithm>
#include <array>

#include "shared/protocol/wire_lease.hpp"

namespace smockron::wire {

result<tier_policy> decode_tier(frames f) {
  if (f.size() < 2) return decode_error::frame_count;
  auto domain = decode_domain_frame(f[0]);
  if (!domain) return domain.error();
  if (f[1] != tier_command) return decode_error::unknown_command;
  if (f.size() != 5) return decode_error::frame_count;
  if (!valid_tier_name(f[2]))
    return f[2].size() > max_tier_bytes ? decode_error::frame_too_large : decode_error::tier_invalid;
  // The rules and the limit as POLICY and CONCURRENCY carry them.
  const std::array<std::string_view, 4> rules{f[0], policy_command, f[2], f[3]};
  auto p = decode_policy(rules);
  if (!p) return p.error();
  const std::array<std::string_view, 4> limit{f[0], concurrency_command, f[2], f[4]};
  auto c = decode_concurrency(limit);
  if (!c) return c.error();
  tier_policy m;
  m.domain = domain.value();
  m.name = f[2];
  m.rules = p->rules;
  m.count = p->count;
  m.concurrency = c->limit;
  return m;
}

std::optional<encoded> encode(const tier_policy& m, scratch& s) {
  if (!valid_tier_name(m.name) || m.count > max_policy_rules) return std::nullopt;
  policy p;
  p.domain = m.domain;
  p.identifier = m.name;
  std::copy_n(m.rules.begin(), m.count, p.rules.begin());
  p.count = m.count;
  auto e = encode(p, s);  // the domain frame in s.domain, the rules in s.text
  auto c = encode(concurrency_policy{m.domain, m.name, m.concurrency}, s);  // the number in s.numbers
  if (!e || !c) return std::nullopt;
  e->frame[1] = tier_command;
  e->frame[4] = c->frame[3];
  e->count = 5;
  return e;
}

}  // namespace smockron::wire
