// The client's address: the peer, or what trusted proxies say
// (X-Forwarded-For, RFC 7239 Forwarded), and its `ip` identifier.
#include "proxy/identify/client_address.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>

#include "shared/base/text.hpp"

namespace smockron::proxy {

namespace {

using http1::iequals;

bool is_trusted(const ip_address& a, const std::vector<cidr>& trusted) {
  for (const auto& c : trusted) {
    if (c.contains(a)) return true;
  }
  return false;
}

bool is_v4_mapped(const ip_address& a) {
  for (int i = 0; i < 10; ++i) {
    if (a.bytes[i] != 0) return false;
  }
  return a.bytes[10] == 0xff && a.bytes[11] == 0xff;
}

}  // namespace

std::string format_ip(const ip_address& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (is_v4_mapped(a)) {
    if (inet_ntop(AF_INET, &a.bytes[12], buf, sizeof buf) == nullptr) return {};
  } else {
    if (inet_ntop(AF_INET6, a.bytes.data(), buf, sizeof buf) == nullptr) return {};
  }
  return buf;
}

std::optional<std::string_view> forwarded_for(std::string_view element) {
  // forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] ), pair = token "=" value,
  // value = token / quoted-string. A ';' or ',' inside quotes does not end a pair.
  std::optional<std::string_view> found;
  std::size_t i = 0;
  while (i <= element.size()) {
    std::size_t end = i;
    bool quoted = false;
    for (; end < element.size() && (quoted || element[end] != ';'); ++end) {
      if (element[end] == '"') quoted = !quoted;
      if (quoted && element[end] == '\\') ++end;  // quoted-pair
    }
    if (quoted) return std::nullopt;  // unterminated quoted-string
    const auto pair = trim_ows(element.substr(i, std::min(end, element.size()) - i));
    const auto eq = pair.find('=');
    if (!pair.empty() && eq == std::string_view::npos) return std::nullopt;
    if (!pair.empty() && iequals(trim_ows(pair.substr(0, eq)), "for")) {
      if (found) return std::nullopt;  // a parameter appears at most once per element (RFC 7239 4)
      found = trim_ows(pair.substr(eq + 1));
      if (found->empty()) return std::nullopt;  // a value is a token or a quoted-string, never nothing
    }
    i = end + 1;
  }
  return found;
}

std::optional<ip_address> forwarded_node_address(std::string_view value) {
  if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
    value = value.substr(1, value.size() - 2);
    if (value.find('\\') != std::string_view::npos) return std::nullopt;  // no address needs escaping
  }
  // node = nodename [ ":" node-port ]; an IPv6 nodename is bracketed.
  if (!value.empty() && value.front() == '[') {
    const auto close = value.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    const auto rest = value.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return std::nullopt;
    return parse_ip(value.substr(1, close - 1));
  }
  const auto colon = value.find(':');
  const auto name = value.substr(0, colon);
  // A bare IPv6 address (not bracketed) is invalid in Forwarded: only IPv4 here.
  const auto a = parse_ip(name);
  if (!a || !is_v4_mapped(*a)) return std::nullopt;
  return a;
}

namespace {

// Walks a chain header from the nearest hop (right-most entry) outwards,
// calling `entry` with each element's address (nothing: not an address)
// until it returns true.
template <class F>
void walk_chain(const http1::header_list& headers, real_ip_header chain, F&& entry) {
  const std::string_view name = chain == real_ip_header::forwarded ? "Forwarded" : "X-Forwarded-For";
  headers.for_each_reverse(name, [&](std::string_view line) {
    while (true) {
      // Forwarded elements may hold commas inside quoted strings; none holds an address.
      const auto comma = line.rfind(',');
      const auto element = trim_ows(comma == std::string_view::npos ? line : line.substr(comma + 1));
      if (!element.empty()) {  // list syntax allows empty elements
        std::optional<ip_address> addr;
        if (chain == real_ip_header::forwarded) {
          if (const auto v = forwarded_for(element)) addr = forwarded_node_address(*v);
        } else {
          addr = parse_ip(element);
        }
        if (entry(addr)) return true;
      }
      if (comma == std::string_view::npos) return false;
      line = line.substr(0, comma);
    }
  });
}

}  // namespace

ip_address client_address(const http1::header_list& headers, const ip_address& peer,
                          const std::vector<cidr>& trusted_proxies, real_ip_header chain) {
  // Only a trusted proxy may speak for someone else; anyone else is who they are.
  if (!is_trusted(peer, trusted_proxies)) return peer;
  // Each hop was appended by the proxy before it, so entries are believable
  // only while we are still inside trusted proxies; the first untrusted one
  // is the client. Garbage means the chain cannot be followed: the last
  // trusted hop is the client.
  ip_address last = peer;
  std::optional<ip_address> client;
  walk_chain(headers, chain, [&](const std::optional<ip_address>& addr) {
    if (!addr) {
      client = last;
      return true;
    }
    if (!is_trusted(*addr, trusted_proxies)) {
      client = *addr;
      return true;
    }
    last = *addr;
    return false;
  });
  return client ? *client : last;  // all trusted: the left-most
}

std::string ip_identifier(const ip_address& a, int ipv6_prefix_bits) {
  static constexpr std::array<std::uint8_t, 12> v4_mapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const bool v4 = std::equal(v4_mapped.begin(), v4_mapped.end(), a.bytes.begin());
  if (v4 || ipv6_prefix_bits >= 128) return format_ip(a);
  ip_address net = a;
  for (int bit = std::max(ipv6_prefix_bits, 0); bit < 128; ++bit) {
    net.bytes[static_cast<std::size_t>(bit / 8)] &= static_cast<std::uint8_t>(~(0x80u >> (bit % 8)));
  }
  return format_ip(net) + "/" + std::to_string(ipv6_prefix_bits);
}
}  // namespace smockron::proxy
