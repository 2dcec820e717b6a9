// JWT verification for the `jwt:CLAIM` identifier source (jwt.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "shared/config/config.hpp"

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

}  // namespace smockron::proxy
