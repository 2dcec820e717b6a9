// The TTL of a DNS answer (see dns_answer.hpp).
#include "shared/protocol/dns_answer.hpp"

#include <algorithm>
#include <cstddef>

namespace smockron::dns {

namespace {

std::uint16_t u16(std::span<const unsigned char> m, std::size_t at) {
  return static_cast<std::uint16_t>(m[at] << 8 | m[at + 1]);
}

/// Skips the (possibly compressed) name at `at`; returns the offset after it,
/// or nullopt when it runs off the message or is longer than a name may be.
/// A pointer ends the name where it stands, so pointers are never followed.
std::optional<std::size_t> skip_name(std::span<const unsigned char> m, std::size_t at) {
  for (std::size_t labels = 0; labels <= 127; ++labels) {
    if (at >= m.size()) return std::nullopt;
    const unsigned char len = m[at];
    if (len == 0) return at + 1;
    if ((len & 0xc0) == 0xc0) return at + 2 <= m.size() ? std::optional(at + 2) : std::nullopt;
    if ((len & 0xc0) != 0) return std::nullopt;  // 0x40 and 0x80: no such label types (RFC 6891 retired them)
    at += 1 + len;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint32_t> answer_ttl(std::span<const unsigned char> m) {
  constexpr std::size_t header = 12;
  if (m.size() < header) return std::nullopt;
  const std::size_t questions = u16(m, 4), answers = u16(m, 6);
  if (answers == 0) return std::nullopt;
  std::size_t at = header;
  for (std::size_t i = 0; i < questions; ++i) {
    const auto next = skip_name(m, at);
    if (!next || *next + 4 > m.size()) return std::nullopt;  // QTYPE, QCLASS
    at = *next + 4;
  }
  std::optional<std::uint32_t> ttl;
  for (std::size_t i = 0; i < answers; ++i) {
    const auto next = skip_name(m, at);
    if (!next || *next + 10 > m.size()) return std::nullopt;  // TYPE, CLASS, TTL, RDLENGTH
    at = *next;
    const std::uint32_t t = static_cast<std::uint32_t>(u16(m, at + 4)) << 16 | u16(m, at + 6);
    const std::size_t rdlength = u16(m, at + 8);
    at += 10;
    if (at + rdlength > m.size()) return std::nullopt;
    at += rdlength;
    // RFC 2181 8: a TTL with the top bit set is taken as 0.
    const std::uint32_t seconds = t > 0x7fffffffu ? 0 : t;
    ttl = ttl ? std::min(*ttl, seconds) : seconds;
  }
  return ttl;
}

}  // namespace smockron::dns
