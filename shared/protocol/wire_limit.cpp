// LIMIT codec (see wire_limit.hpp): a share's rate in POLICY's rule format.
#include "shared/protocol/wire_limit.hpp"

#include <algorithm>
#include <array>
#include <charconv>

namespace smockron::wire {
namespace {

constexpr std::string_view k_rule = "rule:";
constexpr std::string_view k_quota = "quota:";
constexpr std::string_view k_share = "share:";

// "I" with I below `bound`: one or two digits, no leading zero.
std::optional<std::uint8_t> parse_index(std::string_view s, std::size_t bound) {
  if (s.empty() || s.size() > 2 || (s.size() == 2 && s[0] == '0')) return std::nullopt;
  unsigned v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || v >= bound) return std::nullopt;
  return static_cast<std::uint8_t>(v);
}

}  // namespace

result<limit_notice> decode_limit(frames f) {
  if (f.size() < 2) return decode_error::frame_count;
  auto domain = decode_domain_frame(f[0]);
  if (!domain) return domain.error();
  if (f[1] != limit_command) return decode_error::unknown_command;
  if (f.size() != 5) return decode_error::frame_count;
  if (f[2].empty()) return decode_error::identifier_empty;
  if (f[2].size() > max_identifier_bytes) return decode_error::frame_too_large;
  auto next = parse_timestamp(f[3]);
  if (!next) return next.error();
  limit_notice m;
  m.domain = domain.value();
  m.identifier = f[2];
  m.next_ms = next.value();
  const std::string_view which = f[4];
  if (which.starts_with(k_rule) || which.starts_with(k_quota)) {
    const bool rule = which.starts_with(k_rule);
    const auto i =
        parse_index(which.substr(rule ? k_rule.size() : k_quota.size()), rule ? max_policy_rules : max_quota_items);
    if (!i) return decode_error::limit_invalid;
    m.limit.by = rule ? limit_ref::kind::rule : limit_ref::kind::quota;
    m.limit.index = *i;
    return m;
  }
  if (!which.starts_with(k_share)) return decode_error::limit_invalid;
  // One rule as POLICY carries it.
  const std::array<std::string_view, 4> rule{f[0], policy_command, {}, which.substr(k_share.size())};
  const auto p = decode_policy(rule);
  if (!p || p->count != 1) return decode_error::limit_invalid;
  m.limit.by = limit_ref::kind::share;
  m.limit.share_interval_us = p->rules[0].interval_us;
  m.limit.share_burst = p->rules[0].burst;
  return m;
}

std::optional<encoded> encode_limit(const delay_until& d, scratch& s) {
  const limit_ref& l = d.limit;
  if (l.by == limit_ref::kind::none) return std::nullopt;
  // DELAY_UNTIL's own checks, and its frames (the domain, the time).
  auto e = encode(delay_until{d.domain, d.identifier, d.next_ms, 0, {}}, s);
  if (!e) return std::nullopt;
  e->frame[1] = limit_command;
  if (l.by == limit_ref::kind::share) {
    policy p;
    p.domain = d.domain;
    p.rules[0] = {l.share_interval_us, l.share_burst};
    p.count = 1;
    auto rule = encode(p, s);  // the rule in s.text; the domain frame written again, the same
    if (!rule) return std::nullopt;
    // "share:" goes before the rule: the rule is moved up in s.text.
    const std::string_view text = rule->frame[3];
    if (text.size() + k_share.size() > s.text.size()) return std::nullopt;
    char* base = s.text.data();
    std::copy_backward(text.begin(), text.end(), base + k_share.size() + text.size());
    std::copy(k_share.begin(), k_share.end(), base);
    e->frame[4] = std::string_view(base, k_share.size() + text.size());
  } else {
    const bool rule = l.by == limit_ref::kind::rule;
    if (l.index >= (rule ? max_policy_rules : max_quota_items)) return std::nullopt;
    const std::string_view prefix = rule ? k_rule : k_quota;
    char* base = s.text.data();
    std::copy(prefix.begin(), prefix.end(), base);
    char* end = std::to_chars(base + prefix.size(), base + s.text.size(), unsigned{l.index}).ptr;
    e->frame[4] = std::string_view(base, static_cast<std::size_t>(end - base));
  }
  e->count = 5;
  return e;
}

}  // namespace smockron::wire
