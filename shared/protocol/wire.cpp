// Wire codec (see wire.hpp): strict decoding and allocation-free encoding.
#include "shared/protocol/wire.hpp"

#include <algorithm>
#include <array>
#include <charconv>

namespace smockron::wire {
namespace {

constexpr std::string_view k_accepted = "ACCEPTED";
constexpr std::string_view k_delayed = "DELAYED";
constexpr std::string_view k_rejected = "REJECTED";
constexpr std::string_view k_delay_until = "DELAY_UNTIL";

// Domain frame: name followed by exactly one trailing "\0".
result<std::string_view> decode_domain(std::string_view frame) {
  if (frame.size() > max_domain_bytes + 1) return decode_error::frame_too_large;
  if (frame.empty() || frame.back() != '\0') return decode_error::domain_not_terminated;
  const std::string_view name = frame.substr(0, frame.size() - 1);
  if (name.empty()) return decode_error::domain_empty;
  if (name.find('\0') != std::string_view::npos) return decode_error::domain_contains_null;
  return name;
}

result<std::string_view> decode_identifier(std::string_view frame) {
  if (frame.size() > max_identifier_bytes) return decode_error::frame_too_large;
  if (frame.empty()) return decode_error::identifier_empty;
  return frame;
}

std::string_view write_number(std::int64_t v, std::array<char, 20>& out) {
  auto [ptr, ec] = std::to_chars(out.data(), out.data() + out.size(), v);
  (void)ec;  // 20 chars always hold an int64
  return {out.data(), static_cast<std::size_t>(ptr - out.data())};
}

std::optional<std::string_view> write_domain(std::string_view domain, scratch& s) {
  if (domain.empty() || domain.size() > max_domain_bytes || domain.find('\0') != std::string_view::npos) {
    return std::nullopt;
  }
  domain.copy(s.domain.data(), domain.size());
  s.domain[domain.size()] = '\0';
  return std::string_view(s.domain.data(), domain.size() + 1);
}

bool valid_timestamp(std::int64_t v) { return v >= 0 && v <= max_timestamp_ms; }

}  // namespace

result<std::string_view> decode_domain_frame(std::string_view frame) { return decode_domain(frame); }
std::optional<std::string_view> encode_domain_frame(std::string_view domain, scratch& s) {
  return write_domain(domain, s);
}

std::string_view to_string(status s) {
  switch (s) {
    case status::accepted: return k_accepted;
    case status::delayed: return k_delayed;
    case status::rejected: return k_rejected;
  }
  return "UNKNOWN";
}

std::string_view to_string(decode_error e) {
  switch (e) {
    case decode_error::frame_count: return "frame_count";
    case decode_error::frame_too_large: return "frame_too_large";
    case decode_error::domain_not_terminated: return "domain_not_terminated";
    case decode_error::domain_empty: return "domain_empty";
    case decode_error::domain_contains_null: return "domain_contains_null";
    case decode_error::identifier_empty: return "identifier_empty";
    case decode_error::unknown_status: return "unknown_status";
    case decode_error::unknown_command: return "unknown_command";
    case decode_error::timestamp_empty: return "timestamp_empty";
    case decode_error::timestamp_not_numeric: return "timestamp_not_numeric";
    case decode_error::timestamp_out_of_range: return "timestamp_out_of_range";
    case decode_error::delayed_missing: return "delayed_missing";
    case decode_error::delayed_unexpected: return "delayed_unexpected";
    case decode_error::interval_invalid: return "interval_invalid";
    case decode_error::policy_invalid: return "policy_invalid";
    case decode_error::cost_invalid: return "cost_invalid";
    case decode_error::adjust_invalid: return "adjust_invalid";
    case decode_error::reserve_invalid: return "reserve_invalid";
    case decode_error::quota_invalid: return "quota_invalid";
    case decode_error::lease_invalid: return "lease_invalid";
    case decode_error::tier_invalid: return "tier_invalid";
    case decode_error::limit_invalid: return "limit_invalid";
    case decode_error::ask_invalid: return "ask_invalid";
  }
  return "unknown";
}

result<std::int64_t> parse_timestamp(std::string_view frame) {
  if (frame.empty()) return decode_error::timestamp_empty;
  for (char c : frame) {
    if (c < '0' || c > '9') return decode_error::timestamp_not_numeric;
  }
  if (frame.size() > max_number_digits) return decode_error::timestamp_out_of_range;
  std::int64_t v = 0;
  std::from_chars(frame.data(), frame.data() + frame.size(), v);  // digits only, fits: checked above
  if (!valid_timestamp(v)) return decode_error::timestamp_out_of_range;
  return v;
}

bool valid_tier_name(std::string_view name) {
  if (name.empty() || name.size() > max_tier_bytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

result<accounting> decode_accounting(frames f) {
  if (f.size() != 5 && f.size() != 6) return decode_error::frame_count;
  accounting m;
  auto domain = decode_domain(f[0]);
  if (!domain) return domain.error();
  m.domain = domain.value();

  if (f[1] == k_accepted) m.state = status::accepted;
  else if (f[1] == k_delayed) m.state = status::delayed;
  else if (f[1] == k_rejected) m.state = status::rejected;
  else return decode_error::unknown_status;

  auto id = decode_identifier(f[2]);
  if (!id) return id.error();
  m.identifier = id.value();

  auto received = parse_timestamp(f[3]);
  if (!received) return received.error();
  m.received_ms = received.value();

  if (m.state == status::delayed) {
    if (f[4].empty()) return decode_error::delayed_missing;
    auto delayed = parse_timestamp(f[4]);
    if (!delayed) return delayed.error();
    m.delayed_ms = delayed.value();
  } else if (!f[4].empty()) {
    return decode_error::delayed_unexpected;
  }

  if (f.size() == 6) {
    if (f[5].size() > max_loginfo_bytes) return decode_error::frame_too_large;
    m.loginfo = f[5];
    // "PREFIX=N" then the end or " " and the rest of the loginfo: N (signed
    // when allowed), or nothing when it is not a valid number.
    const auto number = [&](std::string_view prefix, bool sign) -> std::optional<std::int64_t> {
      const std::string_view rest = m.loginfo.substr(prefix.size());
      const std::size_t end = rest.find(' ');
      std::string_view digits = rest.substr(0, end);
      const bool negative = sign && digits.starts_with('-');
      if (negative) digits.remove_prefix(1);
      auto n = parse_timestamp(digits);
      if (!n || n.value() > max_cost) return std::nullopt;
      m.loginfo = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
      return negative ? -n.value() : n.value();
    };
    const bool use = m.state != status::rejected;
    if (m.loginfo.starts_with(cost_prefix)) {
      const auto n = number(cost_prefix, false);
      if (!n) return decode_error::cost_invalid;
      m.cost = *n;
    } else if (use && m.loginfo.starts_with(reserve_prefix)) {
      const auto n = number(reserve_prefix, false);
      if (!n) return decode_error::reserve_invalid;
      m.cost = *n;
      m.reserve = true;
    } else if (!use && m.loginfo.starts_with(adjust_prefix)) {
      m.adjust = number(adjust_prefix, true);
      if (!m.adjust) return decode_error::adjust_invalid;
    }
    if (use && m.loginfo.starts_with(ask_prefix)) {
      const auto n = number(ask_prefix, false);
      if (!n) return decode_error::ask_invalid;
      m.ask = *n;
    }
    if (use && m.loginfo.starts_with(tier_prefix)) {
      const std::string_view rest = m.loginfo.substr(tier_prefix.size());
      const std::size_t end = rest.find(' ');
      m.tier = rest.substr(0, end);
      if (!m.tier.empty() && !valid_tier_name(m.tier)) return decode_error::tier_invalid;
      m.loginfo = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
    }
  }
  return m;
}

result<delay_until> decode_delay_until(frames f) {
  if (f.size() < 3) return decode_error::frame_count;
  delay_until m;
  auto domain = decode_domain(f[0]);
  if (!domain) return domain.error();
  m.domain = domain.value();
  if (f[1] != k_delay_until) return decode_error::unknown_command;
  if (f.size() != 4 && f.size() != 5) return decode_error::frame_count;
  auto id = decode_identifier(f[2]);
  if (!id) return id.error();
  m.identifier = id.value();
  auto next = parse_timestamp(f[3]);
  if (!next) return next.error();
  m.next_ms = next.value();
  if (f.size() == 5) {
    auto interval = parse_timestamp(f[4]);
    if (!interval || interval.value() <= 0) return decode_error::interval_invalid;
    m.interval_ms = interval.value();
  }
  return m;
}

result<policy> decode_policy(frames f) {
  if (f.size() < 2) return decode_error::frame_count;
  policy m;
  auto domain = decode_domain(f[0]);
  if (!domain) return domain.error();
  m.domain = domain.value();
  if (f[1] != policy_command) return decode_error::unknown_command;
  if (f.size() != 4) return decode_error::frame_count;
  if (f[2].size() > max_identifier_bytes) return decode_error::frame_too_large;
  m.identifier = f[2];
  std::string_view rest = f[3];
  if (rest.empty()) return m;  // the domain is owned and has no rules
  while (true) {
    const std::size_t end = rest.find(' ');
    const std::string_view token = rest.substr(0, end);
    const std::size_t slash = token.find('/');
    if (m.count == max_policy_rules || slash == std::string_view::npos) return decode_error::policy_invalid;
    auto interval = parse_timestamp(token.substr(0, slash));
    auto burst = parse_timestamp(token.substr(slash + 1));
    if (!interval || !burst || interval.value() < 1 || burst.value() < 1 || burst.value() > max_policy_burst ||
        interval.value() > max_policy_span_us / burst.value()) {
      return decode_error::policy_invalid;
    }
    m.rules[m.count++] = {interval.value(), burst.value()};
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  return m;
}

namespace {
constexpr std::array<std::string_view, 3> k_calendar_periods{"day", "week", "month"};

bool valid(const quota_policy::item& q) {
  return q.limit >= 1 && q.limit <= max_quota_limit && q.offset_s >= -max_quota_offset_s &&
         q.offset_s <= max_quota_offset_s &&
         (q.per != calendar::period::fixed || (q.length_s >= 1 && q.length_s <= max_quota_length_s));
}
}  // namespace

result<quota_policy> decode_quota(frames f) {
  if (f.size() < 2) return decode_error::frame_count;
  quota_policy m;
  auto domain = decode_domain(f[0]);
  if (!domain) return domain.error();
  m.domain = domain.value();
  if (f[1] != quota_command) return decode_error::unknown_command;
  if (f.size() != 4) return decode_error::frame_count;
  if (f[2].size() > max_identifier_bytes) return decode_error::frame_too_large;
  m.identifier = f[2];
  std::string_view rest = f[3];
  if (rest.empty()) return m;  // the domain has no quotas
  while (true) {
    const std::size_t end = rest.find(' ');
    std::string_view token = rest.substr(0, end);
    const std::size_t a = token.find('/');
    const std::size_t b = a == std::string_view::npos ? a : token.find('/', a + 1);
    if (m.count == max_quota_items || b == std::string_view::npos) return decode_error::quota_invalid;
    quota_policy::item q;
    auto limit = parse_timestamp(token.substr(0, a));
    if (!limit) return decode_error::quota_invalid;
    q.limit = limit.value();
    const std::string_view per = token.substr(a + 1, b - a - 1);
    if (const auto it = std::find(k_calendar_periods.begin(), k_calendar_periods.end(), per);
        it != k_calendar_periods.end()) {
      q.per = static_cast<calendar::period>(it - k_calendar_periods.begin());
    } else {
      auto length = parse_timestamp(per);
      if (!length) return decode_error::quota_invalid;
      q.per = calendar::period::fixed;
      q.length_s = length.value();
    }
    std::string_view offset = token.substr(b + 1);
    const bool negative = !offset.empty() && offset.front() == '-';
    if (negative) offset.remove_prefix(1);
    auto off = parse_timestamp(offset);
    if (!off) return decode_error::quota_invalid;
    q.offset_s = negative ? -off.value() : off.value();
    if (!valid(q) || (negative && q.offset_s == 0)) return decode_error::quota_invalid;
    m.items[m.count++] = q;
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  return m;
}

std::optional<encoded> encode(const accounting& m, scratch& s) {
  auto domain = write_domain(m.domain, s);
  if (!domain || m.identifier.empty() || m.identifier.size() > max_identifier_bytes ||
      m.loginfo.size() > max_loginfo_bytes || !valid_timestamp(m.received_ms)) {
    return std::nullopt;
  }
  encoded e;
  e.frame[0] = *domain;
  e.frame[1] = to_string(m.state);
  e.frame[2] = m.identifier;
  e.frame[3] = write_number(m.received_ms, s.number_a);
  if (m.state == status::delayed) {
    if (!valid_timestamp(m.delayed_ms)) return std::nullopt;
    e.frame[4] = write_number(m.delayed_ms, s.number_b);
  } else {
    e.frame[4] = std::string_view{};
  }
  e.count = 5;
  const bool use = m.state != status::rejected;
  if (m.adjust && (use || *m.adjust < -max_cost || *m.adjust > max_cost)) return std::nullopt;
  if (m.reserve && !use) return std::nullopt;
  if (!m.tier.empty() && (!use || !valid_tier_name(m.tier))) return std::nullopt;
  if (m.ask >= 0 && (!use || m.ask > max_cost)) return std::nullopt;
  // A loginfo that starts with "cost=" on its own would be read as a cost (or
  // one that starts with "reserve=" or, REJECTED, "adjust=", as those): it
  // gets the cost prefix too. One that would read as a tier gets "tier= ".
  const bool reads_as_more =
      m.loginfo.starts_with(cost_prefix) || m.loginfo.starts_with(use ? reserve_prefix : adjust_prefix);
  const bool numbered = m.adjust || m.reserve || m.cost != 1 || reads_as_more;
  const bool asked = use && m.ask >= 0;
  // A free text that would read as an ask goes behind "tier= " (nothing is read after a tier).
  const bool tiered =
      use && (!m.tier.empty() || m.loginfo.starts_with(tier_prefix) || m.loginfo.starts_with(ask_prefix));
  if (numbered || tiered || asked) {
    if (m.cost < 0 || m.cost > max_cost) return std::nullopt;
    // ["cost=N" (or "reserve=N", "adjust=N")] [" tier=NAME"], then " " +
    // loginfo when there is one, within max_loginfo_bytes.
    char* const start = s.loginfo.data();
    char* out = start;
    if (numbered) {
      const std::string_view prefix = m.adjust ? adjust_prefix : m.reserve ? reserve_prefix : cost_prefix;
      out = std::copy(prefix.begin(), prefix.end(), out);
      out = std::to_chars(out, out + 20, m.adjust ? *m.adjust : m.cost).ptr;  // 14 characters at most
    }
    if (asked) {
      if (out != start) *out++ = ' ';
      out = std::copy(ask_prefix.begin(), ask_prefix.end(), out);
      out = std::to_chars(out, out + 20, m.ask).ptr;  // 14 + 1 + 4 + 15 so far
    }
    if (tiered) {
      if (out != start) *out++ = ' ';
      out = std::copy(tier_prefix.begin(), tier_prefix.end(), out);
      out = std::copy(m.tier.begin(), m.tier.end(), out);  // 14 + 1 + 5 + 64 so far
    }
    const auto used = static_cast<std::size_t>(out - start);
    if (!m.loginfo.empty()) {
      if (used + 1 + m.loginfo.size() > max_loginfo_bytes) return std::nullopt;
      *out++ = ' ';
      out = std::copy(m.loginfo.begin(), m.loginfo.end(), out);
    }
    e.frame[e.count++] = std::string_view(start, static_cast<std::size_t>(out - start));
  } else if (!m.loginfo.empty()) {
    e.frame[e.count++] = m.loginfo;
  }
  return e;
}

std::optional<encoded> encode(const delay_until& m, scratch& s) {
  auto domain = write_domain(m.domain, s);
  if (!domain || m.identifier.empty() || m.identifier.size() > max_identifier_bytes || !valid_timestamp(m.next_ms) ||
      m.interval_ms < 0 || m.interval_ms > max_timestamp_ms) {
    return std::nullopt;
  }
  encoded e;
  e.frame[0] = *domain;
  e.frame[1] = k_delay_until;
  e.frame[2] = m.identifier;
  e.frame[3] = write_number(m.next_ms, s.number_a);
  e.count = 4;
  if (m.interval_ms > 0) e.frame[e.count++] = write_number(m.interval_ms, s.number_b);
  return e;
}

std::optional<encoded> encode(const policy& m, scratch& s) {
  auto domain = write_domain(m.domain, s);
  if (!domain || m.count > max_policy_rules || m.identifier.size() > max_identifier_bytes) return std::nullopt;
  char* out = s.text.data();
  for (std::size_t i = 0; i < m.count; ++i) {
    const policy::rule& r = m.rules[i];
    if (!policy_fits(r.interval_us, r.burst)) return std::nullopt;
    if (i) *out++ = ' ';
    out = std::to_chars(out, s.text.data() + s.text.size(), r.interval_us).ptr;
    *out++ = '/';
    out = std::to_chars(out, s.text.data() + s.text.size(), r.burst).ptr;  // 4 x (19 + 1 + 7 + 1) fits
  }
  encoded e;
  e.frame[0] = *domain;
  e.frame[1] = policy_command;
  e.frame[2] = m.identifier;
  e.frame[3] = std::string_view(s.text.data(), static_cast<std::size_t>(out - s.text.data()));
  e.count = 4;
  return e;
}

std::optional<encoded> encode(const quota_policy& m, scratch& s) {
  auto domain = write_domain(m.domain, s);
  if (!domain || m.identifier.size() > max_identifier_bytes || m.count > max_quota_items) return std::nullopt;
  char* out = s.quotas.data();
  char* const end = s.quotas.data() + s.quotas.size();
  for (std::size_t i = 0; i < m.count; ++i) {
    const quota_policy::item& q = m.items[i];
    if (!valid(q)) return std::nullopt;
    if (i > 0) *out++ = ' ';
    out = std::to_chars(out, end, q.limit).ptr;  // 4 x (13 + 1 + 9 + 1 + 6 + 1) fits
    *out++ = '/';
    if (q.per == calendar::period::fixed) {
      out = std::to_chars(out, end, q.length_s).ptr;
    } else {
      const std::string_view name = k_calendar_periods[static_cast<std::size_t>(q.per)];
      out = std::copy(name.begin(), name.end(), out);
    }
    *out++ = '/';
    out = std::to_chars(out, end, q.offset_s).ptr;
  }
  encoded e;
  e.frame[0] = *domain;
  e.frame[1] = quota_command;
  e.frame[2] = m.identifier;
  e.frame[3] = std::string_view(s.quotas.data(), static_cast<std::size_t>(out - s.quotas.data()));
  e.count = 4;
  return e;
}

}  // namespace smockron::wire
