// Small network value types shared by config and both daemons: host:port
// endpoints and CIDR ranges. Parsing never throws.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace smockron {

/// "host:port" or "[v6]:port".
struct host_port {
  std::string host;
  std::uint16_t port = 0;
  std::string to_string() const;
  friend bool operator==(const host_port&, const host_port&) = default;
};
std::optional<host_port> parse_host_port(std::string_view text);

/// An endpoint of the accounting stream (ZeroMQ's notation, stream sockets
/// only): "tcp://host:port" ("[v6]:port"; port "*" or 0 = any, when binding)
/// or "ipc://path" ("ipc://@name": Linux's abstract namespace, as libzmq).
struct stream_endpoint {
  enum class kind : std::uint8_t { tcp, ipc };
  kind type = kind::tcp;
  host_port address;  ///< tcp
  std::string path;   ///< ipc, as written (at most 107 bytes)
  bool abstract() const { return type == kind::ipc && !path.empty() && path.front() == '@'; }
};
std::optional<stream_endpoint> parse_stream_endpoint(std::string_view text);

/// Masters found by DNS (the proxy's accounting and control lists):
/// "dns+tcp://name:port" (every IPv4 address of the name, or its IPv6 ones
/// when it has none, at that
/// port; a Kubernetes headless Service) or "srv+tcp://name" (every target of
/// the name's SRV records, at the record's port).
struct dns_endpoint {
  enum class kind : std::uint8_t { address, srv };
  kind type = kind::address;
  std::string name;        ///< without a trailing dot
  std::uint16_t port = 0;  ///< address: the masters' port; srv: unused
};
std::optional<dns_endpoint> parse_dns_endpoint(std::string_view text);
/// "tcp://1.2.3.4:5" or "tcp://[::1]:5": a discovered master's endpoint.
std::string tcp_endpoint(std::string_view address, std::uint16_t port);

/// An IPv4 or IPv6 address as 16 bytes (IPv4 mapped into ::ffff:0:0/96).
struct ip_address {
  std::array<std::uint8_t, 16> bytes{};
  friend bool operator==(const ip_address&, const ip_address&) = default;
};
std::optional<ip_address> parse_ip(std::string_view text);

/// "10.0.0.0/8", "::1/128", or a bare address (full-length prefix).
struct cidr {
  ip_address base;
  int prefix_bits = 128;  ///< in the 128-bit space (IPv4 /8 is stored as 104)
  bool contains(const ip_address& a) const;
  friend bool operator==(const cidr&, const cidr&) = default;
};
std::optional<cidr> parse_cidr(std::string_view text);
/// Whether `a` may connect to an endpoint with the allow list `allow` (empty: anyone).
bool allowed(const std::vector<cidr>& allow, const ip_address& a);

/// `hp` as a socket address (its host an IPv4 or IPv6 literal); the address's
/// length, or 0 when the host is not an IP literal.
socklen_t to_sockaddr(const host_port& hp, sockaddr_storage& out);

/// "redis://[:password@]host[:port][/db]" (port 6379 and db 0 by default).
struct redis_url {
  host_port address{"127.0.0.1", 6379};
  std::string password;  ///< empty = no AUTH (the data nodes', not the Sentinels')
  int db = 0;
  /// redis-sentinel://: the Sentinels to ask for the current primary of
  /// `primary_name` (then `address` is unused).
  std::vector<host_port> sentinels;
  std::string primary_name;
  /// redis-cluster://: nodes of a Redis Cluster to learn the slots from (then `address` is unused).
  std::vector<host_port> cluster;
  friend bool operator==(const redis_url&, const redis_url&) = default;
};
/// redis://[:password@]host[:port][/db],
/// redis-sentinel://[:password@]host[:port][,host[:port]...]/primary_name[/db]
/// (Sentinel port 26379 when left out), or
/// redis-cluster://[:password@]host[:port][,host[:port]...] (a cluster has db 0 only).
std::optional<redis_url> parse_redis_url(std::string_view text);

/// "http://host[:port][/path]": port 80 when left out, `default_path` when
/// there is no path. Nothing when it is not such a URL (https is not taken).
struct http_url {
  std::string host;
  std::uint16_t port = 80;
  std::string path;
  friend bool operator==(const http_url&, const http_url&) = default;
};
std::optional<http_url> parse_http_url(std::string_view url, std::string_view default_path);

}  // namespace smockron
