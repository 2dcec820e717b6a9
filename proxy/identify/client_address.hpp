// The client's address, from the peer and what trusted proxies say
// (X-Forwarded-For or RFC 7239 Forwarded), and its `ip` identifier.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/codec/http1.hpp"
#include "shared/base/net.hpp"
#include "shared/config/config.hpp"

namespace smockron::proxy {

using real_ip_header = config::proxy_config::real_ip_header_kind;

/// The `ip` identifier of `a`: an IPv4 address as is, an IPv6 one as its
/// /`ipv6_prefix_bits` network ("2001:db8::/64"; the address alone at 128).
std::string ip_identifier(const ip_address& a, int ipv6_prefix_bits);

/// The client address: the peer, or, when the peer is a trusted proxy, the
/// right-most address of the `chain` header (X-Forwarded-For, or Forwarded's
/// `for=` parameters) that is not itself trusted. An entry that is no address
/// (garbage, or Forwarded's "unknown" and obfuscated "_names") ends the walk:
/// the last trusted hop is then the client.
ip_address client_address(const http1::header_list& headers, const ip_address& peer,
                          const std::vector<cidr>& trusted_proxies,
                          real_ip_header chain = real_ip_header::x_forwarded_for);

/// The address of a Forwarded `for=` value (RFC 7239 6: "192.0.2.43",
/// "\"192.0.2.43:47011\"", "\"[2001:db8:cafe::17]:4711\""); nothing for
/// "unknown", obfuscated names and anything malformed.
std::optional<ip_address> forwarded_node_address(std::string_view value);

/// The `for=` value of one Forwarded element ("for=x;proto=https"), quotes
/// kept; nothing when the element has none or does not parse.
std::optional<std::string_view> forwarded_for(std::string_view element);

/// Text form of an address (IPv4-mapped addresses as dotted quads).
std::string format_ip(const ip_address& a);

}  // namespace smockron::proxy
