// Concurrency lease and exact admission codec (see wire_lease.hpp): strict, total, allocation-free.
#include "shared/protocol/wire_lease.hpp"

#include <array>
#include <charconv>
#include <initializer_list>

namespace smockron::wire {
namespace {

// The numbers frame: `count` space-separated fields; the first is 16 hex
// digits when `hex_first`, the others decimals of at most 15 digits.
template <std::size_t N>
bool read_numbers(std::string_view frame, bool hex_first, std::array<std::uint64_t, N>& out) {
  for (std::size_t i = 0; i < N; ++i) {
    const std::size_t end = frame.find(' ');
    if ((i + 1 < N) == (end == std::string_view::npos)) return false;
    const std::string_view token = frame.substr(0, end);
    if (i == 0 && hex_first) {
      if (token.size() != 16) return false;
      for (char c : token) {
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
      }
      std::from_chars(token.data(), token.data() + token.size(), out[i], 16);
    } else {
      if (token.empty() || token.size() > max_number_digits) return false;
      for (char c : token) {
        if (c < '0' || c > '9') return false;
      }
      std::from_chars(token.data(), token.data() + token.size(), out[i]);
    }
    if (end != std::string_view::npos) frame.remove_prefix(end + 1);
  }
  return true;
}

bool in(std::uint64_t v, std::int64_t max) { return v <= static_cast<std::uint64_t>(max); }

// Frames 0-2 of a lease message: the domain, `command`, an identifier (empty allowed when `empty_id`).
// `extra`: a fifth frame may follow.
template <class T>
std::optional<decode_error> read_head(frames f, std::string_view command, bool empty_id, T& m, bool extra = false) {
  if (f.size() < 2) return decode_error::frame_count;
  auto domain = decode_domain_frame(f[0]);
  if (!domain) return domain.error();
  m.domain = domain.value();
  if (f[1] != command) {
    return command == lease_status || command == ask_status ? decode_error::unknown_status
                                                            : decode_error::unknown_command;
  }
  if (f.size() != 4 && !(extra && f.size() == 5)) return decode_error::frame_count;
  if (f[2].size() > max_identifier_bytes || f[3].size() > 80) return decode_error::frame_too_large;
  if (f[2].empty() && !empty_id) return decode_error::identifier_empty;
  m.identifier = f[2];
  return std::nullopt;
}

// The optional fifth frame of LEASE and ASK: the tier the request names. False: no tier name.
template <class T>
bool read_tier(frames f, T& m) {
  if (f.size() != 5) return true;
  if (!valid_tier_name(f[4])) return false;
  m.tier = f[4];
  return true;
}

char* put_hex(char* out, std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  for (int shift = 60; shift >= 0; shift -= 4) *out++ = digits[(v >> shift) & 0xf];
  return out;
}

encoded four(std::string_view domain, std::string_view command, std::string_view identifier, const char* begin,
             const char* end) {
  encoded e;
  e.frame = {domain, command, identifier, std::string_view(begin, static_cast<std::size_t>(end - begin))};
  e.count = 4;
  return e;
}

// Appends " v" for each value.
char* put_decimals(char* out, char* end, std::initializer_list<std::int64_t> values) {
  for (std::int64_t v : values) {
    *out++ = ' ';
    out = std::to_chars(out, end, v).ptr;
  }
  return out;
}

}  // namespace

result<lease> decode_lease(frames f) {
  lease m;
  if (auto e = read_head(f, lease_status, false, m, true)) return *e;
  std::array<std::uint64_t, 4> n{};
  if (!read_numbers(f[3], true, n) || !in(n[1], max_concurrency) || !in(n[2], max_concurrency) ||
      !in(n[3], max_returned)) {
    return decode_error::lease_invalid;
  }
  if (!read_tier(f, m)) return decode_error::tier_invalid;
  m.holder = n[0];
  m.want = static_cast<std::int64_t>(n[1]);
  m.held = static_cast<std::int64_t>(n[2]);
  m.returned = static_cast<std::int64_t>(n[3]);
  return m;
}

result<grant> decode_grant(frames f) {
  grant m;
  if (auto e = read_head(f, grant_command, false, m)) return *e;
  std::array<std::uint64_t, 4> n{};
  if (!read_numbers(f[3], true, n) || !in(n[1], max_concurrency) || n[2] > n[1] || !in(n[3], max_returned)) {
    return decode_error::lease_invalid;
  }
  m.holder = n[0];
  m.held = static_cast<std::int64_t>(n[1]);
  m.cap = static_cast<std::int64_t>(n[2]);
  m.seen = static_cast<std::int64_t>(n[3]);
  return m;
}

result<concurrency_policy> decode_concurrency(frames f) {
  concurrency_policy m;
  if (auto e = read_head(f, concurrency_command, true, m)) return *e;
  std::array<std::uint64_t, 1> n{};
  if (!read_numbers(f[3], false, n) || !in(n[0], max_concurrency)) return decode_error::lease_invalid;
  m.limit = static_cast<std::int64_t>(n[0]);
  return m;
}

std::optional<encoded> encode(const lease& m, scratch& s) {
  auto domain = encode_domain_frame(m.domain, s);
  if (!domain || m.identifier.empty() || m.identifier.size() > max_identifier_bytes || m.want < 0 ||
      m.want > max_concurrency || m.held < 0 || m.held > max_concurrency || m.returned < 0 ||
      m.returned > max_returned || (!m.tier.empty() && !valid_tier_name(m.tier))) {
    return std::nullopt;
  }
  char* const begin = s.numbers.data();
  char* const end = begin + s.numbers.size();
  char* out = put_hex(begin, m.holder);  // 16 + 3 x (1 + 15) fits in 80
  for (std::int64_t v : {m.want, m.held, m.returned}) {
    *out++ = ' ';
    out = std::to_chars(out, end, v).ptr;
  }
  encoded e = four(*domain, lease_status, m.identifier, begin, out);
  if (!m.tier.empty()) e.frame[e.count++] = m.tier;
  return e;
}

std::optional<encoded> encode(const grant& m, scratch& s) {
  auto domain = encode_domain_frame(m.domain, s);
  if (!domain || m.identifier.empty() || m.identifier.size() > max_identifier_bytes || m.held < 0 ||
      m.held > max_concurrency || m.cap < 0 || m.cap > m.held || m.seen < 0 || m.seen > max_returned) {
    return std::nullopt;
  }
  char* const begin = s.numbers.data();
  char* const end = begin + s.numbers.size();
  char* out = put_hex(begin, m.holder);
  for (std::int64_t v : {m.held, m.cap, m.seen}) {
    *out++ = ' ';
    out = std::to_chars(out, end, v).ptr;
  }
  return four(*domain, grant_command, m.identifier, begin, out);
}

std::optional<encoded> encode(const concurrency_policy& m, scratch& s) {
  auto domain = encode_domain_frame(m.domain, s);
  if (!domain || m.identifier.size() > max_identifier_bytes || m.limit < 0 || m.limit > max_concurrency) {
    return std::nullopt;
  }
  char* const begin = s.numbers.data();
  char* const out = std::to_chars(begin, begin + s.numbers.size(), m.limit).ptr;
  return four(*domain, concurrency_command, m.identifier, begin, out);
}

result<ask> decode_ask(frames f) {
  ask m;
  if (auto e = read_head(f, ask_status, false, m, true)) return *e;
  std::array<std::uint64_t, 4> n{};
  if (!read_numbers(f[3], true, n) || !in(n[1], max_sequence) || !in(n[2], max_cost) || !in(n[3], max_timestamp_ms)) {
    return decode_error::ask_invalid;
  }
  if (!read_tier(f, m)) return decode_error::tier_invalid;
  m.holder = n[0];
  m.seq = static_cast<std::int64_t>(n[1]);
  m.cost = static_cast<std::int64_t>(n[2]);
  m.latest_ms = static_cast<std::int64_t>(n[3]);
  return m;
}

result<answer> decode_answer(frames f) {
  answer m;
  if (auto e = read_head(f, answer_command, false, m)) return *e;
  std::array<std::uint64_t, 4> n{};
  // AT_MS is set for a wait, may be for a go, never for never.
  if (!read_numbers(f[3], true, n) || !in(n[1], max_sequence) || n[2] > 2 || !in(n[3], max_timestamp_ms) ||
      (n[2] == 1 && n[3] == 0) || (n[2] == 2 && n[3] != 0)) {
    return decode_error::ask_invalid;
  }
  m.holder = n[0];
  m.seq = static_cast<std::int64_t>(n[1]);
  m.verdict = static_cast<verdict_kind>(n[2]);
  m.at_ms = static_cast<std::int64_t>(n[3]);
  return m;
}

result<exact_policy> decode_exact(frames f) {
  exact_policy m;
  if (f.size() < 2) return decode_error::frame_count;
  auto domain = decode_domain_frame(f[0]);
  if (!domain) return domain.error();
  if (f[1] != exact_command) return decode_error::unknown_command;
  if (f.size() != 2) return decode_error::frame_count;
  m.domain = domain.value();
  return m;
}

std::optional<encoded> encode(const ask& m, scratch& s) {
  auto domain = encode_domain_frame(m.domain, s);
  if (!domain || m.identifier.empty() || m.identifier.size() > max_identifier_bytes || m.seq < 0 ||
      m.seq > max_sequence || m.cost < 0 || m.cost > max_cost || m.latest_ms < 0 || m.latest_ms > max_timestamp_ms ||
      (!m.tier.empty() && !valid_tier_name(m.tier))) {
    return std::nullopt;
  }
  char* const begin = s.numbers.data();
  char* const out = put_decimals(put_hex(begin, m.holder), begin + s.numbers.size(), {m.seq, m.cost, m.latest_ms});
  encoded e = four(*domain, ask_status, m.identifier, begin, out);
  if (!m.tier.empty()) e.frame[e.count++] = m.tier;
  return e;
}

std::optional<encoded> encode(const answer& m, scratch& s) {
  auto domain = encode_domain_frame(m.domain, s);
  const auto v = static_cast<std::int64_t>(m.verdict);
  if (!domain || m.identifier.empty() || m.identifier.size() > max_identifier_bytes || m.seq < 0 ||
      m.seq > max_sequence || v > 2 || m.at_ms < 0 || m.at_ms > max_timestamp_ms ||
      (m.verdict == verdict_kind::wait && m.at_ms == 0) || (m.verdict == verdict_kind::never && m.at_ms != 0)) {
    return std::nullopt;
  }
  char* const begin = s.numbers.data();
  char* const out = put_decimals(put_hex(begin, m.holder), begin + s.numbers.size(), {m.seq, v, m.at_ms});
  return four(*domain, answer_command, m.identifier, begin, out);
}

std::optional<encoded> encode(const exact_policy& m, scratch& s) {
  auto domain = encode_domain_frame(m.domain, s);
  if (!domain) return std::nullopt;
  encoded e;
  e.frame = {*domain, exact_command};
  e.count = 2;
  return e;
}

}  // namespace smockron::wire
