// PROXY protocol versions 1 and 2 (see proxy_protocol.hpp). Strict: a
// header that is not exactly as specified is invalid, and the connection
// that sent it is closed, as HAProxy does.
#include "proxy/codec/proxy_protocol.hpp"

#include <algorithm>
#include <array>
#include <cstring>

namespace smockron::proxy::proxy_protocol {
namespace {

constexpr std::string_view v1_prefix = "PROXY ";
constexpr std::array<char, 12> v2_signature = {'\r', '\n', '\r', '\n', '\0', '\r', '\n', 'Q', 'U', 'I', 'T', '\n'};

result invalid(std::string_view why) {
  result r;
  r.state = status::invalid;
  r.reason = why;
  return r;
}

// `data` is a prefix of `whole` (or the reverse): could still become it.
bool prefix_of(std::string_view data, std::string_view whole) {
  const auto n = std::min(data.size(), whole.size());
  return data.substr(0, n) == whole.substr(0, n);
}

// Splits off the next field of a version 1 line: up to one space.
bool next_field(std::string_view& rest, std::string_view& field) {
  const auto space = rest.find(' ');
  field = rest.substr(0, space);
  rest = space == std::string_view::npos ? std::string_view{} : rest.substr(space + 1);
  return !field.empty();
}

std::optional<std::uint16_t> port(std::string_view text) {
  if (text.empty() || text.size() > 5) return std::nullopt;
  std::uint32_t v = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (v > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(v);
}

bool is_v4_mapped(const ip_address& a) {
  static constexpr std::array<std::uint8_t, 12> mapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::equal(mapped.begin(), mapped.end(), a.bytes.begin());
}

// "PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n"
result parse_v1(std::string_view data) {
  if (!prefix_of(data, v1_prefix)) return invalid("no PROXY protocol header");
  // The line is printable US-ASCII up to its CRLF: the first byte that is not
  // decides, so a line is judged the same however it arrives.
  const auto line = data.substr(0, v1_max_bytes);
  const auto end = static_cast<std::size_t>(
      std::find_if(line.begin(), line.end(), [](char c) { return c < 0x20 || c > 0x7e; }) - line.begin());
  if (end == line.size()) {
    if (data.size() >= v1_max_bytes) return invalid("PROXY v1 line longer than 107 bytes");
    return {};
  }
  if (line[end] != '\r') return invalid("PROXY v1 line holds a control byte or is not ended by CRLF");
  if (end + 1 == line.size()) {
    return data.size() >= v1_max_bytes ? invalid("PROXY v1 line longer than 107 bytes") : result{};
  }
  if (line[end + 1] != '\n') return invalid("PROXY v1 line not ended by CRLF");
  std::string_view rest = data.substr(v1_prefix.size(), end - v1_prefix.size());
  result r;
  r.state = status::complete;
  r.consumed = end + 2;
  std::string_view proto;
  if (!next_field(rest, proto)) return invalid("PROXY v1: no protocol");
  if (proto == "UNKNOWN") return r;  // the rest of the line is ignored (spec 2.1)
  if (proto != "TCP4" && proto != "TCP6") return invalid("PROXY v1: protocol is not TCP4, TCP6 or UNKNOWN");
  std::string_view src, dst, sport, dport;
  if (!next_field(rest, src) || !next_field(rest, dst) || !next_field(rest, sport) || !next_field(rest, dport) ||
      !rest.empty()) {
    return invalid("PROXY v1: expected source, destination and two ports, one space apart");
  }
  const auto s = parse_ip(src);
  const auto d = parse_ip(dst);
  const bool v4 = proto == "TCP4";
  // TCP4 names dotted quads; TCP6 names IPv6 text (never a dotted quad alone).
  const auto family_ok = [&](std::string_view text, const std::optional<ip_address>& a) {
    return a && (v4 ? is_v4_mapped(*a) && text.find(':') == std::string_view::npos
                    : text.find(':') != std::string_view::npos);
  };
  if (!family_ok(src, s) || !family_ok(dst, d)) return invalid("PROXY v1: address does not match the protocol");
  const auto sp = port(sport);
  if (!sp || !port(dport)) return invalid("PROXY v1: invalid port");
  r.source = s;
  r.source_port = *sp;
  return r;
}

result parse_v2(std::string_view data, std::size_t max_bytes) {
  const std::string_view signature(v2_signature.data(), v2_signature.size());
  if (!prefix_of(data, signature)) return invalid("no PROXY protocol header");
  if (data.size() < v2_header_bytes) return {};
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(data[i]); };
  const std::uint8_t version = byte(12) >> 4;
  const std::uint8_t command = byte(12) & 0x0f;
  if (version != 2) return invalid("PROXY v2: unsupported version");
  if (command > 1) return invalid("PROXY v2: unknown command");
  const std::uint8_t family = byte(13) >> 4;
  const std::uint8_t transport = byte(13) & 0x0f;
  if (family > 3 || transport > 2) return invalid("PROXY v2: unknown address family or transport");
  const std::size_t length = (std::size_t{byte(14)} << 8) | byte(15);
  const std::size_t total = v2_header_bytes + length;
  if (total > max_bytes) return invalid("PROXY v2 header larger than the configured bound");
  if (data.size() < total) return {};
  result r;
  r.state = status::complete;
  r.consumed = total;
  // LOCAL: the balancer's own connection (a health check): addresses are ignored.
  if (command == 0 || (family != 1 && family != 2)) return r;
  const std::size_t addr_bytes = family == 1 ? 4 : 16;
  if (length < 2 * addr_bytes + 4) return invalid("PROXY v2: address block shorter than its family needs");
  const auto* addrs = reinterpret_cast<const std::uint8_t*>(data.data()) + v2_header_bytes;
  ip_address a;
  if (family == 1) {
    a.bytes[10] = a.bytes[11] = 0xff;  // IPv4 as v4-mapped, as parse_ip gives it
    std::memcpy(a.bytes.data() + 12, addrs, 4);
  } else {
    std::memcpy(a.bytes.data(), addrs, 16);
  }
  r.source = a;
  r.source_port = static_cast<std::uint16_t>((addrs[2 * addr_bytes] << 8) | addrs[2 * addr_bytes + 1]);
  return r;  // TLVs after the addresses are skipped (none changes who the client is)
}

}  // namespace

result parse(std::string_view data, std::size_t max_bytes) {
  if (data.empty()) return {};
  return data[0] == '\r' ? parse_v2(data, max_bytes) : parse_v1(data);
}

}  // namespace smockron::proxy::proxy_protocol
