// Client identification: applies a route's identifier sources to a request
// head (peer address with trusted X-Forwarded-For, header, cookie, query,
// bearer token, JWT claim). Data path: never throws, never logs secrets.
#include "proxy/identify.hpp"

#include <arpa/inet.h>
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

#include "smockron/wire.hpp"
#include "smockron/text.hpp"

namespace smockron::proxy {

namespace {

constexpr std::string_view whitespace = " \t";

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(whitespace);
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(whitespace);
  return s.substr(first, last - first + 1);
}

using http1::iequals;

template <class F>
bool for_each_header(const http1::header_list& headers, std::string_view name, F&& f) {
  return headers.for_each(name, std::forward<F>(f));
}

// What a source finds: nothing, one value, or more than one (a second field
// line, a repeated parameter or cookie). Backends disagree about which of
// several values counts (the first, the last, both joined), so the gate must
// not choose one: the request is refused.
template <class T>
struct found {
  std::optional<T> value;
  bool ambiguous = false;
};

// The value of the only field line called `name`.
found<std::string_view> only_header(const http1::header_list& headers, std::string_view name) {
  found<std::string_view> f;
  headers.for_each(name, [&](std::string_view v) {
    if (f.value) {
      f.ambiguous = true;
      return true;
    }
    f.value = v;
    return false;
  });
  return f;
}

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

// Value of the cookie called exactly `name` across all Cookie headers (ambiguous if there are several).
found<std::string_view> cookie_value(const http1::header_list& headers, std::string_view name) {
  found<std::string_view> f;
  for_each_header(headers, "Cookie", [&](std::string_view line) {
    while (!line.empty()) {
      const auto semi = line.find(';');
      const auto pair = line.substr(0, semi);
      line = semi == std::string_view::npos ? std::string_view{} : line.substr(semi + 1);
      const auto eq = pair.find('=');
      if (eq == std::string_view::npos) continue;
      if (trim(pair.substr(0, eq)) != name) continue;
      if (f.value) {
        f.ambiguous = true;
        return true;
      }
      auto value = trim(pair.substr(eq + 1));
      // RFC 6265: cookie-value may be wrapped in double quotes.
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
      f.value = value;
    }
    return false;
  });
  return f;
}

// application/x-www-form-urlencoded decoding: %XX and '+' as space. A
// malformed escape is kept literally (the value stays stable either way).
std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < s.size() && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Calls f(raw pair, raw value) for each parameter of the target's query whose
// decoded key is exactly `name` until f returns true. The value is nothing
// for a bare key ("?name").
template <class F>
void for_each_query_param(std::string_view target, std::string_view name, F&& f) {
  target = target.substr(0, target.find('#'));  // clients should not send one; ignore it if they do
  const auto q = target.find('?');
  if (q == std::string_view::npos) return;
  auto query = target.substr(q + 1);
  while (!query.empty()) {
    const auto amp = query.find('&');
    const auto pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    const auto eq = pair.find('=');
    if (percent_decode(pair.substr(0, eq)) != name) continue;
    if (f(pair, eq == std::string_view::npos ? std::optional<std::string_view>{} : pair.substr(eq + 1))) return;
  }
}

// Value of the query parameter whose decoded key is exactly `name` (ambiguous if repeated).
found<std::string> query_value(std::string_view target, std::string_view name) {
  found<std::string> f;
  for_each_query_param(target, name, [&](std::string_view, std::optional<std::string_view> raw) {
    if (f.value) {
      f.ambiguous = true;
      return true;
    }
    f.value = raw ? percent_decode(*raw) : std::string{};
    return false;
  });
  return f;
}

// The credentials of "Authorization: Bearer <token>"; ambiguous when the
// request carries several Authorization fields, whatever their schemes.
found<std::string_view> bearer_token(const http1::header_list& headers) {
  found<std::string_view> f;
  const auto auth = only_header(headers, "Authorization");
  f.ambiguous = auth.ambiguous;
  if (!auth.value || auth.ambiguous) return f;
  const auto value = trim(*auth.value);
  const auto space = value.find_first_of(whitespace);
  if (space == std::string_view::npos || !iequals(value.substr(0, space), "Bearer")) return f;
  const auto token = trim(value.substr(space));
  if (!token.empty()) f.value = token;
  return f;
}

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

// ------------------------------------------------------------------ identify

std::string hash_secret(std::string_view secret) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  if (EVP_Digest(secret.data(), secret.size(), md, &md_len, EVP_sha256(), nullptr) != 1 || md_len < 16) {
    ERR_clear_error();
    return {};  // yields no identity rather than a secret
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned i = 0; i < 16; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 0xf]);
  }
  return out;
}

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
    const auto pair = trim(element.substr(i, std::min(end, element.size()) - i));
    const auto eq = pair.find('=');
    if (!pair.empty() && eq == std::string_view::npos) return std::nullopt;
    if (!pair.empty() && iequals(trim(pair.substr(0, eq)), "for")) {
      if (found) return std::nullopt;  // a parameter appears at most once per element (RFC 7239 4)
      found = trim(pair.substr(eq + 1));
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
      const auto element = trim(comma == std::string_view::npos ? line : line.substr(comma + 1));
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

identification identify(const std::vector<config::identifier_source>& sources, const http1::header_list& headers,
                        std::string_view target, const ip_address& peer, const identify_context& ctx) {
  using kind = config::identifier_source::kind;
  identification out;
  try {
    static const std::vector<cidr> no_proxies;
    for (const auto& src : sources) {
      std::string value;
      bool ambiguous = false;
      switch (src.type) {
        case kind::ip:
          value = ip_identifier(
              client_address(headers, peer, ctx.trusted_proxies ? *ctx.trusted_proxies : no_proxies, ctx.chain),
              ctx.ipv6_prefix_bits);
          break;
        case kind::header: {
          const auto v = only_header(headers, src.name);
          ambiguous = v.ambiguous;
          if (v.value) value = trim(*v.value);
          break;
        }
        case kind::cookie: {
          const auto v = cookie_value(headers, src.name);
          ambiguous = v.ambiguous;
          if (v.value) value = *v.value;
          break;
        }
        case kind::query: {
          auto v = query_value(target, src.name);
          ambiguous = v.ambiguous;
          if (v.value) value = std::move(*v.value);
          break;
        }
        case kind::token: {
          const auto t = bearer_token(headers);
          ambiguous = t.ambiguous;
          if (t.value) value = *t.value;
          break;
        }
        case kind::jwt: {
          if (ctx.jwt == nullptr) break;
          const auto t = bearer_token(headers);
          ambiguous = t.ambiguous;
          if (t.value) {
            if (auto v = ctx.jwt->claim(*t.value, src.name, ctx.now_s)) value = std::move(*v);
          }
          break;
        }
      }
      if (ambiguous) {
        out.ambiguous = &src;
        return out;
      }
      if (value.empty()) continue;
      // A credential, or too long for the wire: a hash still identifies the client stably.
      if (src.hash || value.size() > wire::max_identifier_bytes) value = hash_secret(value);
      if (value.empty()) continue;
      out.who = identity{std::move(value), &src};
      return out;
    }
  } catch (...) {
    // Allocation failure only; the caller treats it as "no identifier".
  }
  return out;
}

std::string redact_query(std::string_view target, std::span<const std::string> names) {
  std::string out;
  if (names.empty() || target.find('?') == std::string_view::npos) return std::string(target);
  // Each parameter whose decoded key is one of `names`: its value replaced by the hash the gate uses.
  std::vector<std::pair<std::string_view, std::string>> replace;  // raw value, its hash
  for (const std::string& name : names) {
    for_each_query_param(target, name, [&](std::string_view, std::optional<std::string_view> raw) {
      if (raw && !raw->empty()) replace.emplace_back(*raw, hash_secret(percent_decode(*raw)));
      return false;
    });
  }
  if (replace.empty()) return std::string(target);
  std::sort(replace.begin(), replace.end(),
            [](const auto& a, const auto& b) { return a.first.data() < b.first.data(); });
  out.reserve(target.size() + replace.size() * 48);
  const char* at = target.data();
  for (const auto& [raw, hashed] : replace) {
    out.append(at, static_cast<std::size_t>(raw.data() - at));
    out.append(hashed);
    at = raw.data() + raw.size();
  }
  out.append(at, static_cast<std::size_t>(target.data() + target.size() - at));
  return out;
}

}  // namespace smockron::proxy
