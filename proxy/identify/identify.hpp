// Client identification for the gate: the route's ordered identifier sources
// (ip with trusted X-Forwarded-For, header, cookie, query, bearer token,
// JWT claim), first that yields a value wins; one that finds two values
// refuses the request. Secrets never leave as-is: a source marked `hash`
// (bearer tokens by default) yields a hash, and logs write it hashed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/codec/http1.hpp"
#include "proxy/identify/client_address.hpp"
#include "proxy/identify/jwt.hpp"
#include "shared/base/net.hpp"
#include "shared/config/config.hpp"

namespace smockron::proxy {

/// The value the gate limits on, and which source produced it.
struct identity {
  std::string value;
  const config::identifier_source* source = nullptr;
};

struct identify_context {
  const std::vector<cidr>* trusted_proxies = nullptr;
  const jwt_verifier* jwt = nullptr;  ///< nullptr: jwt:* sources yield nothing
  std::int64_t now_s = 0;
  /// `ip` identifiers of IPv6 clients keep this many leading bits ("2001:db8:1:2::/64"):
  /// one IPv6 client commonly owns a /64, 2^64 addresses. 128: the whole address.
  int ipv6_prefix_bits = 64;
  real_ip_header chain = real_ip_header::x_forwarded_for;  ///< where trusted proxies name the client
};

/// What identification found: an identity, nothing, or a source with more
/// than one value.
struct identification {
  std::optional<identity> who;  ///< nothing: no source yielded a value
  /// The source that found more than one value (two field lines of a header,
  /// a repeated query parameter or cookie, several Authorization fields): the
  /// request is refused (400), as backends disagree about which one counts.
  /// A comma inside one field line is part of the value.
  const config::identifier_source* ambiguous = nullptr;
};

/// Applies `sources` in order; the first that yields a non-empty value wins.
/// A source tried before that finds several values ends the search (ambiguous).
identification identify(const std::vector<config::identifier_source>& sources, const http1::header_list& headers,
                        std::string_view target, const ip_address& peer, const identify_context& ctx);

/// `target` with the value of each query parameter named in `names` (decoded
/// key) replaced by its hash_secret(), as a hashed `query:` source sends it:
/// what logs write instead of a credential in clear.
std::string redact_query(std::string_view target, std::span<const std::string> names);

/// Stable, non-reversible identifier for a secret: "sha256:" + 32 hex digits.
std::string hash_secret(std::string_view secret);

}  // namespace smockron::proxy
