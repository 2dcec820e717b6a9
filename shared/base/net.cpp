// host:port and CIDR parsing (inet_pton based).
#include "shared/base/net.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace smockron {

std::string host_port::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::optional<host_port> parse_host_port(std::string_view text) {
  host_port hp;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') return std::nullopt;
    hp.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos || text.substr(0, colon).find(':') != std::string_view::npos) {
      return std::nullopt;
    }
    hp.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (hp.host.empty() || port_text.empty()) return std::nullopt;
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || ptr != port_text.data() + port_text.size() || port > 65535) return std::nullopt;
  hp.port = static_cast<std::uint16_t>(port);
  return hp;
}

std::optional<stream_endpoint> parse_stream_endpoint(std::string_view text) {
  stream_endpoint e;
  if (text.starts_with("ipc://")) {
    e.type = stream_endpoint::kind::ipc;
    e.path = std::string(text.substr(6));
    if (e.path.empty() || e.path.size() > 107) return std::nullopt;  // sockaddr_un's sun_path
    return e;
  }
  if (!text.starts_with("tcp://")) return std::nullopt;
  std::string rest(text.substr(6));
  if (rest.ends_with(":*")) rest.back() = '0';
  auto hp = parse_host_port(rest);
  if (!hp) return std::nullopt;
  e.address = std::move(*hp);
  return e;
}

namespace {
// RFC 1035's limits: labels of 1 to 63 bytes, 253 bytes in all (as written, without the root's dot).
bool valid_dns_name(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  std::size_t label = 0;
  for (const char c : name) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok || ++label > 63) return false;
  }
  return label > 0;
}
}  // namespace

std::optional<dns_endpoint> parse_dns_endpoint(std::string_view text) {
  dns_endpoint e;
  if (text.starts_with("dns+tcp://")) {
    auto hp = parse_host_port(text.substr(10));
    if (!hp || hp->port == 0) return std::nullopt;
    if (hp->host.ends_with('.')) hp->host.pop_back();
    if (!valid_dns_name(hp->host)) return std::nullopt;
    e.name = std::move(hp->host);
    e.port = hp->port;
    return e;
  }
  if (text.starts_with("srv+tcp://")) {
    std::string_view name = text.substr(10);
    if (name.ends_with('.')) name.remove_suffix(1);
    if (!valid_dns_name(name)) return std::nullopt;
    e.type = dns_endpoint::kind::srv;
    e.name = std::string(name);
    return e;
  }
  return std::nullopt;
}

std::string tcp_endpoint(std::string_view address, std::uint16_t port) {
  return "tcp://" + host_port{std::string(address), port}.to_string();
}

std::optional<ip_address> parse_ip(std::string_view text) {
  // inet_pton reads up to a NUL: one inside would make "1.2.3.4\0junk" an address.
  if (text.empty() || text.size() > 45 || text.find('\0') != std::string_view::npos) return std::nullopt;
  char buf[46];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  ip_address a;
  in_addr v4{};
  if (inet_pton(AF_INET, buf, &v4) == 1) {
    a.bytes[10] = 0xff;
    a.bytes[11] = 0xff;
    std::memcpy(&a.bytes[12], &v4, 4);
    return a;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, buf, &v6) == 1) {
    std::memcpy(a.bytes.data(), &v6, 16);
    return a;
  }
  return std::nullopt;
}

std::optional<cidr> parse_cidr(std::string_view text) {
  const auto slash = text.find('/');
  auto addr = parse_ip(text.substr(0, slash));
  if (!addr) return std::nullopt;
  const bool v4 = text.substr(0, slash).find(':') == std::string_view::npos;
  const int max_bits = v4 ? 32 : 128;
  int bits = max_bits;
  if (slash != std::string_view::npos) {
    const auto p = text.substr(slash + 1);
    auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), bits);
    if (p.empty() || ec != std::errc{} || ptr != p.data() + p.size() || bits < 0 || bits > max_bits) {
      return std::nullopt;
    }
  }
  cidr c;
  c.base = *addr;
  c.prefix_bits = v4 ? bits + 96 : bits;
  return c;
}

bool cidr::contains(const ip_address& a) const {
  int bits = prefix_bits;
  for (std::size_t i = 0; i < 16 && bits > 0; ++i, bits -= 8) {
    const std::uint8_t mask = bits >= 8 ? 0xff : static_cast<std::uint8_t>(0xff << (8 - bits));
    if ((a.bytes[i] & mask) != (base.bytes[i] & mask)) return false;
  }
  return true;
}

namespace {

// host, host:port, [v6] or [v6]:port; `default_port` when there is none.
std::optional<host_port> parse_redis_host(std::string_view text, std::uint16_t default_port) {
  if (text.empty()) return std::nullopt;
  const bool has_port = text.back() != ']' && text.find(':') != std::string_view::npos &&
                        (text.front() == '[' || text.find(':') == text.rfind(':'));
  if (has_port) return parse_host_port(text);
  std::string host(text);
  if (host.front() == '[') {
    if (host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return std::nullopt;
  return host_port{std::move(host), default_port};
}

bool parse_db(std::string_view db, int& out) {
  if (db.empty()) return true;
  const auto [p, ec] = std::from_chars(db.data(), db.data() + db.size(), out);
  return ec == std::errc() && p == db.data() + db.size() && out >= 0;
}

}  // namespace

std::optional<redis_url> parse_redis_url(std::string_view text) {
  constexpr std::string_view plain = "redis://";
  constexpr std::string_view sentinel = "redis-sentinel://";
  constexpr std::string_view cluster = "redis-cluster://";
  const bool via_sentinel = text.starts_with(sentinel), in_cluster = text.starts_with(cluster);
  if (!via_sentinel && !in_cluster && !text.starts_with(plain)) return std::nullopt;
  text.remove_prefix(via_sentinel ? sentinel.size() : in_cluster ? cluster.size() : plain.size());
  redis_url u;
  if (const auto at = text.rfind('@'); at != std::string_view::npos) {
    std::string_view auth = text.substr(0, at);
    if (auto colon = auth.find(':'); colon != std::string_view::npos) auth.remove_prefix(colon + 1);
    u.password = std::string(auth);
    text.remove_prefix(at + 1);
  }
  std::string_view path;
  const bool has_path = text.find('/') != std::string_view::npos;
  if (const auto slash = text.find('/'); slash != std::string_view::npos) {
    path = text.substr(slash + 1);
    text = text.substr(0, slash);
  }
  if (in_cluster) {
    // host:port,host:port: no path (a cluster has db 0 only).
    if (has_path || text.empty()) return std::nullopt;
    while (true) {
      const auto comma = text.find(',');
      auto node = parse_redis_host(text.substr(0, comma), 6379);
      if (!node) return std::nullopt;
      u.cluster.push_back(std::move(*node));
      if (comma == std::string_view::npos) break;
      text.remove_prefix(comma + 1);
    }
    return u;
  }
  if (!via_sentinel) {
    auto address = parse_redis_host(text, 6379);
    if (!address || !parse_db(path, u.db)) return std::nullopt;
    u.address = std::move(*address);
    return u;
  }
  // host:port,host:port/name[/db]
  while (true) {
    const auto comma = text.find(',');
    auto s = parse_redis_host(text.substr(0, comma), 26379);
    if (!s) return std::nullopt;
    u.sentinels.push_back(std::move(*s));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  const auto slash = path.find('/');
  u.primary_name = std::string(path.substr(0, slash));
  if (u.primary_name.empty()) return std::nullopt;
  if (slash != std::string_view::npos && (path.size() == slash + 1 || !parse_db(path.substr(slash + 1), u.db))) {
    return std::nullopt;
  }
  return u;
}

std::optional<http_url> parse_http_url(std::string_view url, std::string_view default_path) {
  if (!url.starts_with("http://")) return std::nullopt;
  url.remove_prefix(7);
  http_url e;
  const auto slash = url.find('/');
  std::string_view authority = url.substr(0, slash);
  e.path = slash == std::string_view::npos ? std::string(default_path) : std::string(url.substr(slash));
  const auto control = [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; };
  if (authority.empty() || std::any_of(e.path.begin(), e.path.end(), control)) return std::nullopt;
  std::string_view port_text;
  bool has_port = false;
  if (authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    e.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return std::nullopt;
      port_text = authority.substr(close + 2);
      has_port = true;
    }
  } else {
    const auto colon = authority.rfind(':');
    e.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (e.host.empty() || std::any_of(e.host.begin(), e.host.end(), control) ||
      e.host.find_first_of("@/[]") != std::string::npos)
    return std::nullopt;
  if (has_port) {
    unsigned port = 0;
    const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 || port > 65535)
      return std::nullopt;
    e.port = static_cast<std::uint16_t>(port);
  }
  return e;
}

bool allowed(const std::vector<cidr>& allow, const ip_address& a) {
  if (allow.empty()) return true;
  for (const auto& c : allow) {
    if (c.contains(a)) return true;
  }
  return false;
}

socklen_t to_sockaddr(const host_port& hp, sockaddr_storage& out) {
  out = {};
  if (auto& a4 = reinterpret_cast<sockaddr_in&>(out); ::inet_pton(AF_INET, hp.host.c_str(), &a4.sin_addr) == 1) {
    a4.sin_family = AF_INET;
    a4.sin_port = htons(hp.port);
    return sizeof a4;
  }
  if (auto& a6 = reinterpret_cast<sockaddr_in6&>(out); ::inet_pton(AF_INET6, hp.host.c_str(), &a6.sin6_addr) == 1) {
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons(hp.port);
    return sizeof a6;
  }
  return 0;
}

}  // namespace smockron
