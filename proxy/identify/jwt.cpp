// JWT verification for the `jwt:CLAIM` identifier source: HS256 secrets,
// PEM public keys (RS256, ES256) and JSON Web Key Sets, through OpenSSL.
// Data path: never throws, never logs secrets.
#include "proxy/identify/jwt.hpp"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>

namespace smockron::proxy {

namespace {

// ---------------------------------------------------------------- JWT helpers

struct pkey_deleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct bio_deleter {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct md_ctx_deleter {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct ecdsa_sig_deleter {
  void operator()(ECDSA_SIG* p) const { ECDSA_SIG_free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_deleter>;

// RFC 4648 section 5 alphabet, unpadded; -1 marks bytes outside it.
constexpr std::array<signed char, 256> make_base64url_table() {
  std::array<signed char, 256> t{};
  for (auto& v : t) v = -1;
  constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  for (std::size_t i = 0; i < alphabet.size(); ++i) {
    t[static_cast<unsigned char>(alphabet[i])] = static_cast<signed char>(i);
  }
  return t;
}
constexpr auto base64url_table = make_base64url_table();

// Strict: no padding, no whitespace, no other alphabet, unused bits zero.
bool base64url_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.size() % 4 == 1) return false;
  out.reserve(in.size() / 4 * 3 + 2);
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    const int v = base64url_table[static_cast<unsigned char>(c)];
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  // Leftover bits must be zero, so each byte string has one encoding.
  return (acc & ((1u << bits) - 1)) == 0;
}

std::optional<nlohmann::json> decode_json_object(std::string_view b64, std::string& scratch) {
  if (!base64url_decode(b64, scratch)) return std::nullopt;
  auto j = nlohmann::json::parse(scratch, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

const unsigned char* bytes_of(std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }

bool verify_hs256(const std::string& secret, std::string_view signing_input, std::string_view sig) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), bytes_of(signing_input), signing_input.size(),
           mac, &mac_len) == nullptr) {
    return false;
  }
  return sig.size() == mac_len && CRYPTO_memcmp(mac, sig.data(), mac_len) == 0;
}

bool verify_digest(EVP_PKEY* key, std::string_view signing_input, const unsigned char* sig, std::size_t sig_len) {
  std::unique_ptr<EVP_MD_CTX, md_ctx_deleter> ctx(EVP_MD_CTX_new());
  if (!ctx) return false;
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key) != 1) return false;
  return EVP_DigestVerify(ctx.get(), sig, sig_len, bytes_of(signing_input), signing_input.size()) == 1;
}

// JWS ES256 signatures are R || S, 32 bytes each (RFC 7518 3.4); OpenSSL
// verifies the DER form.
bool verify_es256(EVP_PKEY* key, std::string_view signing_input, std::string_view sig) {
  if (sig.size() != 64) return false;
  std::unique_ptr<ECDSA_SIG, ecdsa_sig_deleter> ecdsa(ECDSA_SIG_new());
  if (!ecdsa) return false;
  BIGNUM* r = BN_bin2bn(bytes_of(sig), 32, nullptr);
  BIGNUM* s = BN_bin2bn(bytes_of(sig) + 32, 32, nullptr);
  if (r == nullptr || s == nullptr || ECDSA_SIG_set0(ecdsa.get(), r, s) != 1) {
    BN_free(r);
    BN_free(s);
    return false;
  }
  std::array<unsigned char, 80> der{};  // at most 72 bytes for P-256
  const int der_len = i2d_ECDSA_SIG(ecdsa.get(), nullptr);
  if (der_len <= 0 || static_cast<std::size_t>(der_len) > der.size()) return false;
  unsigned char* p = der.data();
  if (i2d_ECDSA_SIG(ecdsa.get(), &p) != der_len) return false;
  return verify_digest(key, signing_input, der.data(), static_cast<std::size_t>(der_len));
}

std::string openssl_error() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

// exp/nbf must be JSON numbers when present.
std::optional<double> numeric_date(const nlohmann::json& payload, const char* name, bool& invalid) {
  const auto it = payload.find(name);
  if (it == payload.end()) return std::nullopt;
  if (!it->is_number()) {
    invalid = true;
    return std::nullopt;
  }
  return it->get<double>();
}

}  // namespace

// ------------------------------------------------------------------ verifier

namespace {

// What a key verifies; the token's `alg` must name the same (RFC 8725 3.1:
// the key pins the algorithm, so an HS256 secret never verifies an RS256
// token, whose "secret" would be the public key).
enum class key_kind : std::uint8_t { hs256, rs256, es256 };

std::optional<key_kind> kind_of_alg(std::string_view alg) {
  if (alg == "HS256") return key_kind::hs256;
  if (alg == "RS256") return key_kind::rs256;
  if (alg == "ES256") return key_kind::es256;
  return std::nullopt;  // "none" among them
}

struct verify_key {
  std::string kid;  ///< empty: tried for any token of its algorithm
  key_kind kind = key_kind::hs256;
  std::string secret;  ///< hs256
  pkey_ptr key;        ///< rs256, es256
};

struct param_bld_deleter {
  void operator()(OSSL_PARAM_BLD* p) const { OSSL_PARAM_BLD_free(p); }
};
struct param_deleter {
  void operator()(OSSL_PARAM* p) const { OSSL_PARAM_free(p); }
};
struct pkey_ctx_deleter {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct bn_deleter {
  void operator()(BIGNUM* p) const { BN_free(p); }
};

// The kind of a PEM or JWK public key, or an error.
std::optional<key_kind> public_key_kind(EVP_PKEY* key, std::string& error) {
  if (EVP_PKEY_is_a(key, "RSA")) return key_kind::rs256;
  if (EVP_PKEY_is_a(key, "EC")) {
    char group[64] = {};
    std::size_t len = 0;
    if (EVP_PKEY_get_group_name(key, group, sizeof group, &len) != 1 ||
        (std::string_view(group, len) != "prime256v1" && std::string_view(group, len) != "P-256")) {
      ERR_clear_error();
      error = "EC key is not on curve P-256 (ES256)";
      return std::nullopt;
    }
    return key_kind::es256;
  }
  error = "key type is neither RSA (RS256) nor EC P-256 (ES256)";
  return std::nullopt;
}

// An OpenSSL public key from the parameters `build` pushes.
template <class Build>
pkey_ptr key_from_params(const char* type, Build&& build) {
  std::unique_ptr<OSSL_PARAM_BLD, param_bld_deleter> bld(OSSL_PARAM_BLD_new());
  if (!bld || !build(bld.get())) return nullptr;
  std::unique_ptr<OSSL_PARAM, param_deleter> params(OSSL_PARAM_BLD_to_param(bld.get()));
  std::unique_ptr<EVP_PKEY_CTX, pkey_ctx_deleter> ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  EVP_PKEY* key = nullptr;
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1 ||
      EVP_PKEY_fromdata(ctx.get(), &key, EVP_PKEY_PUBLIC_KEY, params.get()) != 1) {
    return nullptr;
  }
  return pkey_ptr(key);
}

// A base64url member of a JWK, decoded; empty when missing or malformed.
std::string jwk_bytes(const nlohmann::json& jwk, const char* name) {
  std::string out;
  const auto it = jwk.find(name);
  if (it == jwk.end() || !it->is_string() || !base64url_decode(it->get_ref<const std::string&>(), out)) out.clear();
  return out;
}

// One JWK (RFC 7517 4, RFC 7518 6) as a verification key. nullopt with
// `skipped` set: a key this verifier does not use (encryption keys, other
// algorithms), which a key set from an identity provider often holds.
std::optional<verify_key> read_jwk(const nlohmann::json& jwk, std::string& error, bool& skipped) {
  if (!jwk.is_object()) {
    error = "a key is not a JSON object";
    return std::nullopt;
  }
  verify_key k;
  if (const auto it = jwk.find("kid"); it != jwk.end() && it->is_string()) k.kid = it->get<std::string>();
  const std::string what = k.kid.empty() ? std::string("a key without kid") : "key \"" + k.kid + "\"";
  const auto use = jwk.find("use");
  const auto kty = jwk.find("kty");
  if ((use != jwk.end() && *use != "sig") || kty == jwk.end() || !kty->is_string()) {
    skipped = true;
    return std::nullopt;
  }
  if (*kty == "RSA") {
    k.kind = key_kind::rs256;
    const auto n = jwk_bytes(jwk, "n");
    const auto e = jwk_bytes(jwk, "e");
    if (n.empty() || e.empty()) {
      error = what + ": RSA key needs base64url \"n\" and \"e\"";
      return std::nullopt;
    }
    std::unique_ptr<BIGNUM, bn_deleter> bn_n(BN_bin2bn(bytes_of(n), static_cast<int>(n.size()), nullptr));
    std::unique_ptr<BIGNUM, bn_deleter> bn_e(BN_bin2bn(bytes_of(e), static_cast<int>(e.size()), nullptr));
    k.key = key_from_params("RSA", [&](OSSL_PARAM_BLD* b) {
      return bn_n && bn_e && OSSL_PARAM_BLD_push_BN(b, "n", bn_n.get()) == 1 &&
             OSSL_PARAM_BLD_push_BN(b, "e", bn_e.get()) == 1;
    });
  } else if (*kty == "EC") {
    k.kind = key_kind::es256;
    const auto crv = jwk.find("crv");
    if (crv == jwk.end() || *crv != "P-256") {
      skipped = true;  // another curve: not an ES256 key
      return std::nullopt;
    }
    const auto x = jwk_bytes(jwk, "x");
    const auto y = jwk_bytes(jwk, "y");
    if (x.size() != 32 || y.size() != 32) {
      error = what + ": P-256 key needs 32-byte base64url \"x\" and \"y\"";
      return std::nullopt;
    }
    std::string point = "\x04";  // uncompressed point (SEC 1 2.3.3)
    point.append(x).append(y);
    static char group[] = "prime256v1";
    k.key = key_from_params("EC", [&](OSSL_PARAM_BLD* b) {
      return OSSL_PARAM_BLD_push_utf8_string(b, "group", group, 0) == 1 &&
             OSSL_PARAM_BLD_push_octet_string(b, "pub", point.data(), point.size()) == 1;
    });
  } else if (*kty == "oct") {
    k.kind = key_kind::hs256;
    k.secret = jwk_bytes(jwk, "k");
    if (k.secret.empty()) {
      error = what + ": oct key needs base64url \"k\"";
      return std::nullopt;
    }
  } else {
    skipped = true;
    return std::nullopt;
  }
  if (k.kind != key_kind::hs256 && !k.key) {
    error = what + ": not a valid public key: " + openssl_error();
    return std::nullopt;
  }
  // "alg", when present, must be the one the key type implies.
  if (const auto alg = jwk.find("alg"); alg != jwk.end()) {
    const auto named = alg->is_string() ? kind_of_alg(alg->get_ref<const std::string&>()) : std::nullopt;
    if (named != k.kind) {
      skipped = true;  // e.g. an RSA key for PS256 or RSA-OAEP
      return std::nullopt;
    }
  }
  return k;
}

// The usable keys of the JSON Web Key Set in `path` appended to `keys`.
bool read_jwks(const std::string& path, std::vector<verify_key>& keys, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open JWKS file " + path;
    return false;
  }
  const auto set = nlohmann::json::parse(in, nullptr, false);
  if (set.is_discarded() || !set.is_object() || !set.contains("keys") || !set["keys"].is_array()) {
    error = "JWKS file " + path + ": not a JSON object with a \"keys\" array";
    return false;
  }
  std::size_t usable = 0;
  for (const auto& jwk : set["keys"]) {
    bool skipped = false;
    auto k = read_jwk(jwk, error, skipped);
    if (skipped) continue;
    if (!k) {
      error = "JWKS file " + path + ": " + error;
      return false;
    }
    keys.push_back(std::move(*k));
    ++usable;
  }
  if (usable == 0) {
    error = "JWKS file " + path + ": no RS256, ES256 or HS256 signing key";
    return false;
  }
  return true;
}

// `aud` (RFC 7519 4.1.3) is a string or an array of strings.
bool audience_matches(const nlohmann::json& payload, const std::string& audience) {
  const auto it = payload.find("aud");
  if (it == payload.end()) return false;
  if (it->is_string()) return it->get_ref<const std::string&>() == audience;
  if (!it->is_array()) return false;
  return std::any_of(it->begin(), it->end(), [&](const nlohmann::json& a) {
    return a.is_string() && a.get_ref<const std::string&>() == audience;
  });
}

}  // namespace

struct jwt_verifier::impl {
  std::vector<verify_key> keys;  ///< empty: no claim is believed
  std::string issuer, audience;
  std::int64_t leeway_s = 0;

  bool verified(std::string_view alg, std::string_view kid, std::string_view signing_input,
                std::string_view sig) const {
    const auto kind = kind_of_alg(alg);
    if (!kind) return false;
    // As Envoy's jwt_authn: a token's kid selects the keys with that kid and
    // those without one; a token without kid may be signed by any key of its algorithm.
    for (const auto& k : keys) {
      if (k.kind != *kind || (!kid.empty() && !k.kid.empty() && k.kid != kid)) continue;
      bool ok = false;
      switch (k.kind) {
        case key_kind::hs256: ok = verify_hs256(k.secret, signing_input, sig); break;
        case key_kind::rs256: ok = verify_digest(k.key.get(), signing_input, bytes_of(sig), sig.size()); break;
        case key_kind::es256: ok = verify_es256(k.key.get(), signing_input, sig); break;
      }
      if (ok) return true;
    }
    ERR_clear_error();  // failed verifications leave entries on this thread's queue
    return false;
  }
};

jwt_verifier::~jwt_verifier() = default;

std::unique_ptr<jwt_verifier> jwt_verifier::create(const config::jwt_config& cfg, std::string& error) {
  std::unique_ptr<jwt_verifier> v(new jwt_verifier());
  v->impl_ = std::make_unique<impl>();
  auto& im = *v->impl_;
  im.issuer = cfg.issuer;
  im.audience = cfg.audience;
  im.leeway_s = std::chrono::duration_cast<std::chrono::seconds>(cfg.leeway).count();
  if (!cfg.hs256_secret.empty()) im.keys.push_back(verify_key{{}, key_kind::hs256, cfg.hs256_secret, nullptr});
  if (!cfg.public_key_file.empty()) {
    std::unique_ptr<BIO, bio_deleter> bio(BIO_new_file(cfg.public_key_file.c_str(), "r"));
    if (!bio) {
      error = "cannot open JWT public key file " + cfg.public_key_file + ": " + openssl_error();
      return nullptr;
    }
    pkey_ptr key(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
    if (!key) {
      error = "cannot parse JWT public key file " + cfg.public_key_file +
              " (expected a PEM \"PUBLIC KEY\"): " + openssl_error();
      return nullptr;
    }
    const auto kind = public_key_kind(key.get(), error);
    if (!kind) {
      error = "JWT public key file " + cfg.public_key_file + ": " + error;
      return nullptr;
    }
    im.keys.push_back(verify_key{{}, *kind, {}, std::move(key)});
  }
  if (!cfg.jwks_file.empty() && !read_jwks(cfg.jwks_file, im.keys, error)) return nullptr;
  return v;
}

std::optional<std::string> jwt_verifier::claim(std::string_view token, std::string_view name,
                                               std::int64_t now_s) const {
  try {
    const auto& im = *impl_;
    // Without a key no claim is believed: an unsigned token's claims are the
    // client's choice (a fresh `sub` per request would be a fresh budget).
    // The configuration refuses a jwt: source without a key.
    if (im.keys.empty()) return std::nullopt;
    const auto dot1 = token.find('.');
    if (dot1 == std::string_view::npos) return std::nullopt;
    const auto dot2 = token.find('.', dot1 + 1);
    if (dot2 == std::string_view::npos || token.find('.', dot2 + 1) != std::string_view::npos) return std::nullopt;
    const auto header_b64 = token.substr(0, dot1);
    const auto payload_b64 = token.substr(dot1 + 1, dot2 - dot1 - 1);
    const auto sig_b64 = token.substr(dot2 + 1);

    std::string scratch;
    const auto header = decode_json_object(header_b64, scratch);
    if (!header) return std::nullopt;
    const auto alg = header->find("alg");
    if (alg == header->end() || !alg->is_string()) return std::nullopt;
    // We implement no JWS extensions, so any critical one is unsupported.
    if (header->contains("crit")) return std::nullopt;
    std::string_view kid;
    if (const auto it = header->find("kid"); it != header->end()) {
      if (!it->is_string()) return std::nullopt;
      kid = it->get_ref<const std::string&>();
    }
    std::string sig;
    if (!base64url_decode(sig_b64, sig)) return std::nullopt;
    if (!im.verified(alg->get_ref<const std::string&>(), kid, token.substr(0, dot2), sig)) return std::nullopt;

    const auto payload = decode_json_object(payload_b64, scratch);
    if (!payload) return std::nullopt;
    {
      bool invalid = false;
      const auto exp = numeric_date(*payload, "exp", invalid);
      const auto nbf = numeric_date(*payload, "nbf", invalid);
      if (invalid) return std::nullopt;
      if (exp && !(*exp > static_cast<double>(now_s - im.leeway_s))) return std::nullopt;
      if (nbf && !(*nbf <= static_cast<double>(now_s + im.leeway_s))) return std::nullopt;
    }
    // A token another issuer signed, or one meant for another service, is no
    // identity here (RFC 8725 3.8, 3.9).
    if (!im.issuer.empty()) {
      const auto iss = payload->find("iss");
      if (iss == payload->end() || !iss->is_string() || iss->get_ref<const std::string&>() != im.issuer) {
        return std::nullopt;
      }
    }
    if (!im.audience.empty() && !audience_matches(*payload, im.audience)) return std::nullopt;

    const auto it = payload->find(name);
    if (it == payload->end()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_unsigned()) return std::to_string(it->get<std::uint64_t>());
    if (it->is_number_integer()) return std::to_string(it->get<std::int64_t>());
    return std::nullopt;
  } catch (...) {
    return std::nullopt;  // allocation failure only; the data path never throws
  }
}

}  // namespace smockron::proxy
