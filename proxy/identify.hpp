// Client identification for the gate: the route's ordered identifier sources
// (ip with trusted X-Forwarded-For, header, cookie, query, bearer token,
// JWT claim), first that yields a value wins. Secrets never leave as-is:
// a source marked `hash` (bearer tokens by default) yields a hash.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/http1.hpp"
#include "smockron/config.hpp"
#include "smockron/net.hpp"

namespace smockron::proxy {

/// Verifies bearer JWTs and extracts claims. Keys: an HS256 secret, a PEM
/// public key (RS256 / ES256), a JWKS file (RSA, EC P-256 and oct keys,
/// selected by `kid`). Immutable after creation (a reload creates a new one,
/// reading the files again); thread-safe.
class jwt_verifier {
public:
  /// Loads keys once. Returns nullptr with `error` set if the key file cannot
  /// be read or parsed.
  static std::unique_ptr<jwt_verifier> create(const config::jwt_config& cfg, std::string& error);
  ~jwt_verifier();

  /// The claim's value (strings as-is, integers in decimal) if the token is
  /// acceptable: signed by a configured key of the header's alg (the key pins
  /// the algorithm; `none` never verifies), `exp` (if present) later than
  /// now - leeway, `nbf` (if present) no later than now + leeway, `iss` and
  /// `aud` as configured. Without any key configured, no claim is returned.
  std::optional<std::string> claim(std::string_view token, std::string_view name, std::int64_t now_s) const;

private:
  jwt_verifier() = default;
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The value the gate limits on, and which source produced it.
struct identity {
  std::string value;
  const config::identifier_source* source = nullptr;
};

using real_ip_header = config::proxy_config::real_ip_header_kind;

struct identify_context {
  const std::vector<cidr>* trusted_proxies = nullptr;
  const jwt_verifier* jwt = nullptr;  ///< nullptr: jwt:* sources yield nothing
  std::int64_t now_s = 0;
  /// `ip` identifiers of IPv6 clients keep this many leading bits ("2001:db8:1:2::/64"):
  /// one IPv6 client commonly owns a /64, 2^64 addresses. 128: the whole address.
  int ipv6_prefix_bits = 64;
  real_ip_header chain = real_ip_header::x_forwarded_for;  ///< where trusted proxies name the client
};

/// The `ip` identifier of `a`: an IPv4 address as is, an IPv6 one as its
/// /`ipv6_prefix_bits` network ("2001:db8::/64"; the address alone at 128).
std::string ip_identifier(const ip_address& a, int ipv6_prefix_bits);

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

/// Stable, non-reversible identifier for a secret: "sha256:" + 32 hex digits.
std::string hash_secret(std::string_view secret);

}  // namespace smockron::proxy
