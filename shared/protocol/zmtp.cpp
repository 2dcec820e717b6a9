// ZMTP 3.0 pieces (see zmtp.hpp).
#include "shared/protocol/zmtp.hpp"

#include <limits>

#include <strings.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace smockron::zmtp {
namespace {

constexpr std::array<char, greeting_size> make_greeting(std::string_view mechanism, bool as_server) {
  std::array<char, greeting_size> g{};
  g[0] = static_cast<char>(0xff);
  g[9] = 0x7f;
  g[10] = 3;  // major
  g[11] = 0;  // minor: 3.0
  for (std::size_t i = 0; i < mechanism.size(); ++i) g[12 + i] = mechanism[i];
  g[32] = as_server ? 1 : 0;
  return g;
}
constexpr auto k_greeting = make_greeting("NULL", false);
constexpr auto k_curve_client = make_greeting("CURVE", false);
constexpr auto k_curve_server = make_greeting("CURVE", true);

std::uint64_t load_be(const char* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

std::string_view greeting() { return {k_greeting.data(), k_greeting.size()}; }

std::string_view curve_greeting(bool as_server) {
  const auto& g = as_server ? k_curve_server : k_curve_client;
  return {g.data(), g.size()};
}

greeting_status check_greeting(std::string_view g, std::string& detail, std::string_view mechanism) {
  if (g.empty()) return greeting_status::need_more;
  if (static_cast<unsigned char>(g[0]) != 0xff) {
    detail = "not a ZeroMQ peer";
    return greeting_status::not_zmtp;
  }
  if (g.size() >= 10 && !(g[9] & 0x01)) {
    detail = "ZMTP 1.0 peer (ZeroMQ 4.x is needed)";
    return greeting_status::old_version;
  }
  if (g.size() >= 11 && static_cast<unsigned char>(g[10]) < 3) {
    detail = "ZMTP " + std::to_string(static_cast<unsigned char>(g[10])) + ".0 peer (ZeroMQ 4.x is needed)";
    return greeting_status::old_version;
  }
  if (g.size() < greeting_size) return greeting_status::need_more;
  char expected[20] = {};
  std::memcpy(expected, mechanism.data(), std::min<std::size_t>(mechanism.size(), sizeof expected));
  if (std::memcmp(g.data() + 12, expected, sizeof expected) != 0) {
    detail = "security mechanism \"" + printable(std::string_view(g.data() + 12, strnlen(g.data() + 12, 20))) +
             "\" (only " + std::string(mechanism) + ")";
    return greeting_status::mechanism;
  }
  return greeting_status::ok;
}

namespace {
void append_property(std::string& body, std::string_view name, std::string_view value) {
  body += static_cast<char>(name.size());
  body += name;
  const auto n = static_cast<std::uint32_t>(value.size());
  body += static_cast<char>(n >> 24);
  body += static_cast<char>((n >> 16) & 0xff);
  body += static_cast<char>((n >> 8) & 0xff);
  body += static_cast<char>(n & 0xff);
  body += value;
}
}  // namespace

std::string ready_properties(std::string_view socket_type, std::string_view gatekeeper) {
  std::string props;
  append_property(props, "Socket-Type", socket_type);
  if (!gatekeeper.empty()) append_property(props, gatekeeper_property, gatekeeper);
  return props;
}

std::string ready(std::string_view socket_type, std::string_view gatekeeper) {
  std::string out;
  append_frame(out, flag_command, "\x05READY" + ready_properties(socket_type, gatekeeper));
  return out;
}

void append_frame(std::string& out, std::uint8_t flags, std::string_view body) {
  if (body.size() > 255) {
    out += static_cast<char>(flags | flag_long);
    for (int shift = 56; shift >= 0; shift -= 8) out += static_cast<char>((body.size() >> shift) & 0xff);
  } else {
    out += static_cast<char>(flags);
    out += static_cast<char>(body.size());
  }
  out += body;
}

frame_status next_frame(std::string_view buf, std::uint64_t max_body, frame& out) {
  if (buf.size() < 2) return frame_status::need_more;
  const auto flags = static_cast<std::uint8_t>(buf[0]);
  if (flags & ~(flag_more | flag_long | flag_command)) return frame_status::reserved_flags;
  const std::size_t header = (flags & flag_long) ? 9 : 2;
  if (buf.size() < header) return frame_status::need_more;
  const std::uint64_t size = (flags & flag_long) ? load_be(buf.data() + 1, 8) : static_cast<unsigned char>(buf[1]);
  if (size > max_body) {
    // Described, not delivered: a caller may skip the frame by its length.
    out.flags = flags;
    out.body = {};
    out.size = size > std::numeric_limits<std::size_t>::max() - header ? std::numeric_limits<std::size_t>::max()
                                                                       : header + static_cast<std::size_t>(size);
    return frame_status::too_large;
  }
  if (buf.size() - header < size) return frame_status::need_more;
  out.flags = flags;
  out.body = buf.substr(header, size);
  out.size = header + size;
  return frame_status::ok;
}

std::optional<std::pair<std::string_view, std::string_view>> split_command(std::string_view body) {
  if (body.empty()) return std::nullopt;
  const std::size_t n = static_cast<unsigned char>(body[0]);
  if (body.size() < 1 + n) return std::nullopt;
  return std::pair(body.substr(1, n), body.substr(1 + n));
}

std::optional<std::string_view> ready_property(std::string_view rest, std::string_view wanted) {
  std::string_view value;
  while (!rest.empty()) {
    const std::size_t n = static_cast<unsigned char>(rest[0]);
    if (rest.size() < 1 + n + 4) return std::nullopt;
    const std::string_view name = rest.substr(1, n);
    const std::uint64_t vlen = load_be(rest.data() + 1 + n, 4);
    if (rest.size() - 1 - n - 4 < vlen) return std::nullopt;
    if (name.size() == wanted.size() && strncasecmp(name.data(), wanted.data(), n) == 0)
      value = rest.substr(1 + n + 4, vlen);
    rest.remove_prefix(1 + n + 4 + vlen);
  }
  return value;
}

std::optional<std::string_view> ready_socket_type(std::string_view rest) { return ready_property(rest, "Socket-Type"); }

std::string pong_for(std::string_view ping_rest) {
  // PING carries a 2-byte TTL and up to 16 bytes of context, echoed in PONG.
  const std::string_view context = ping_rest.size() > 2 ? ping_rest.substr(2, 16) : std::string_view();
  std::string frame;
  append_frame(frame, flag_command, "\x04PONG" + std::string(context));
  return frame;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

}  // namespace smockron::zmtp
