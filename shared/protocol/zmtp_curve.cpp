// CURVE for ZMTP (see zmtp_curve.hpp).
#include "shared/protocol/zmtp_curve.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "shared/protocol/zmtp.hpp"

namespace smockron::zmtp::curve {
namespace {

static_assert(crypto_box_PUBLICKEYBYTES == key_size && crypto_box_SECRETKEYBYTES == key_size);
static_assert(crypto_box_NONCEBYTES == 24 && crypto_box_MACBYTES == 16);
constexpr std::size_t mac = crypto_box_MACBYTES;

constexpr std::string_view k_z85 =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

void init_sodium() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) throw std::runtime_error("libsodium could not be initialised");
}

const unsigned char* u(std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }

void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = static_cast<unsigned char>(v & 0xff);
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

/// A 24-byte nonce: a 16- or 8-byte prefix and the rest.
using nonce_t = std::array<unsigned char, crypto_box_NONCEBYTES>;
nonce_t nonce_of(std::string_view prefix, const unsigned char* rest) {
  nonce_t n{};
  std::memcpy(n.data(), prefix.data(), prefix.size());
  std::memcpy(n.data() + prefix.size(), rest, n.size() - prefix.size());
  return n;
}
nonce_t counter_nonce(std::string_view prefix16, std::uint64_t counter) {
  nonce_t n{};
  std::memcpy(n.data(), prefix16.data(), 16);
  put_u64(n.data() + 16, counter);
  return n;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

/// The key named `field` in a ZeroMQ certificate line (`field = "Z85"`), or a
/// bare key; nothing when the line is neither.
std::optional<std::string> key_text(const std::string& line, std::string_view field) {
  const std::string t = trim(line);
  if (t.size() >= field.size() && t.compare(0, field.size(), field) == 0) {
    const auto q1 = t.find('"'), q2 = t.rfind('"');
    if (q1 != std::string::npos && q2 > q1) return t.substr(q1 + 1, q2 - q1 - 1);
  }
  return std::nullopt;
}

/// The first whitespace-delimited word of a line (Z85 keys hold '#', so a
/// key is recognised before a comment is).
std::string first_word(const std::string& trimmed) { return trimmed.substr(0, trimmed.find_first_of(" \t")); }

/// The key of a file: certificate field `field`, else the first line whose
/// first word is a Z85 key; other lines starting with '#' are comments.
std::string read_key_text(const std::string& path, std::string_view field) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read key file " + path);
  std::string line;
  bool certificate = false;
  while (std::getline(in, line)) {
    const std::string t = trim(line);
    if (t.empty()) continue;
    if (auto k = key_text(t, field)) return *k;
    if (const std::string w = first_word(t); !certificate && z85_decode(w)) return w;
    if (t[0] == '#') continue;
    if (t == "curve" || t == "metadata" || t.find(" = ") != std::string::npos) certificate = true;
    else if (!certificate) break;  // neither a key nor a certificate
  }
  throw std::runtime_error("no " + std::string(field) + " (a Z85 key of 40 characters) in key file " + path);
}

}  // namespace

std::string_view to_string(error e) {
  switch (e) {
    case error::malformed: return "malformed";
    case error::bad_box: return "bad_box";
    case error::nonce: return "nonce";
    case error::unknown_key: return "unknown_key";
  }
  return "?";
}

std::string z85_encode(const key& k) {
  std::string out;
  out.reserve(40);
  for (std::size_t i = 0; i < k.size(); i += 4) {
    std::uint32_t v =
        (std::uint32_t{k[i]} << 24) | (std::uint32_t{k[i + 1]} << 16) | (std::uint32_t{k[i + 2]} << 8) | k[i + 3];
    char block[5];
    for (int j = 4; j >= 0; --j, v /= 85) block[j] = k_z85[v % 85];
    out.append(block, 5);
  }
  return out;
}

std::optional<key> z85_decode(std::string_view text) {
  if (text.size() != 40) return std::nullopt;
  key k{};
  for (std::size_t i = 0; i < 40; i += 5) {
    std::uint64_t v = 0;
    for (std::size_t j = 0; j < 5; ++j) {
      const auto at = k_z85.find(text[i + j]);
      if (at == std::string_view::npos) return std::nullopt;
      v = v * 85 + at;
    }
    if (v > 0xffffffffull) return std::nullopt;
    const std::size_t o = i / 5 * 4;
    for (int b = 3; b >= 0; --b, v >>= 8) k[o + b] = static_cast<unsigned char>(v & 0xff);
  }
  return k;
}

keypair generate() {
  init_sodium();
  keypair kp;
  crypto_box_keypair(kp.public_key.data(), kp.secret_key.data());
  return kp;
}

keypair from_secret(const key& secret) {
  init_sodium();
  keypair kp;
  kp.secret_key = secret;
  crypto_scalarmult_base(kp.public_key.data(), secret.data());
  return kp;
}

keypair read_secret_key(const std::string& path) {
  const std::string text = read_key_text(path, "secret-key");
  const auto k = z85_decode(text);
  if (!k) throw std::runtime_error("key file " + path + ": not a Z85 key (40 characters)");
  return from_secret(*k);
}

key read_public_key(const std::string& path_or_key) {
  if (auto k = z85_decode(path_or_key)) return *k;
  const std::string text = read_key_text(path_or_key, "public-key");
  const auto k = z85_decode(text);
  if (!k) throw std::runtime_error("key file " + path_or_key + ": not a Z85 key (40 characters)");
  return *k;
}

std::set<key> read_key_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read key list " + path);
  std::set<key> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string t = trim(line);
    if (t.empty()) continue;
    if (const auto k = z85_decode(first_word(t))) keys.insert(*k);
    else if (t[0] != '#')
      throw std::runtime_error(path + ":" + std::to_string(n) + ": not a Z85 public key (40 characters)");
  }
  return keys;
}

// ---- the mechanism -------------------------------------------------------------

mechanism::mechanism(std::shared_ptr<const client_keys> keys) : client_(std::move(keys)) {
  init_sodium();
  crypto_box_keypair(short_public_.data(), short_secret_.data());
  peer_long_ = client_->server;
}

mechanism::mechanism(std::shared_ptr<const server_keys> keys) : server_(std::move(keys)) {
  init_sodium();
  crypto_box_keypair(short_public_.data(), short_secret_.data());
}

mechanism::~mechanism() {
  sodium_memzero(short_secret_.data(), short_secret_.size());
  sodium_memzero(precomputed_.data(), precomputed_.size());
  sodium_memzero(cookie_key_.data(), cookie_key_.size());
}

std::string mechanism::hello() {
  // "\x05HELLO", version 1.0, 72 bytes of padding, C', nonce, box[64 zeros](C'->S).
  std::string h(200, '\0');
  std::memcpy(h.data(), "\x05HELLO\x01\x00", 8);
  std::memcpy(h.data() + 80, short_public_.data(), 32);
  const std::uint64_t n = nonce_++;
  const nonce_t nonce = counter_nonce("CurveZMQHELLO---", n);
  put_u64(reinterpret_cast<unsigned char*>(h.data()) + 112, n);
  const std::array<unsigned char, 64> zeros{};
  if (crypto_box_easy(reinterpret_cast<unsigned char*>(h.data()) + 120, zeros.data(), zeros.size(), nonce.data(),
                      client_->server.data(), short_secret_.data()) != 0)
    h.clear();  // a server key that is not a usable curve point
  return h;
}

std::optional<error> mechanism::on_welcome(std::string_view body, std::string_view metadata, std::string& initiate) {
  if (body.size() != 168 || body.substr(0, 8) != "\x07WELCOME") return error::malformed;
  const nonce_t nonce = nonce_of("WELCOME-", u(body) + 8);
  std::array<unsigned char, 128> plain{};
  if (crypto_box_open_easy(plain.data(), u(body) + 24, 144, nonce.data(), client_->server.data(),
                           short_secret_.data()) != 0)
    return error::bad_box;
  std::memcpy(peer_short_.data(), plain.data(), 32);
  std::memcpy(cookie_.data(), plain.data() + 32, 96);
  if (crypto_box_beforenm(precomputed_.data(), peer_short_.data(), short_secret_.data()) != 0) return error::bad_box;

  // The vouch: C' and S boxed from C to S', under a random nonce.
  std::array<unsigned char, 64> vouch_plain{};
  std::memcpy(vouch_plain.data(), short_public_.data(), 32);
  std::memcpy(vouch_plain.data() + 32, client_->server.data(), 32);
  std::array<unsigned char, 16> vouch_random{};
  randombytes_buf(vouch_random.data(), vouch_random.size());
  const nonce_t vouch_nonce = nonce_of("VOUCH---", vouch_random.data());
  std::array<unsigned char, 80> vouch{};
  if (crypto_box_easy(vouch.data(), vouch_plain.data(), vouch_plain.size(), vouch_nonce.data(), peer_short_.data(),
                      client_->own.secret_key.data()) != 0)
    return error::bad_box;

  // INITIATE: cookie, nonce, box[C + vouch nonce + vouch + metadata](C'->S').
  std::string plain_initiate(128 + metadata.size(), '\0');
  std::memcpy(plain_initiate.data(), client_->own.public_key.data(), 32);
  std::memcpy(plain_initiate.data() + 32, vouch_random.data(), 16);
  std::memcpy(plain_initiate.data() + 48, vouch.data(), 80);
  std::memcpy(plain_initiate.data() + 128, metadata.data(), metadata.size());
  const std::uint64_t n = nonce_++;
  const nonce_t nonce_i = counter_nonce("CurveZMQINITIATE", n);
  initiate.assign(113 + plain_initiate.size() + mac, '\0');
  auto* out = reinterpret_cast<unsigned char*>(initiate.data());
  std::memcpy(out, "\x08INITIATE", 9);
  std::memcpy(out + 9, cookie_.data(), 96);
  put_u64(out + 105, n);
  crypto_box_easy_afternm(out + 113, u(plain_initiate), plain_initiate.size(), nonce_i.data(), precomputed_.data());
  return std::nullopt;
}

std::optional<error> mechanism::on_ready(std::string_view body, std::string& metadata) {
  if (body.size() < 14 + mac || body.substr(0, 6) != "\x05READY") return error::malformed;
  const std::uint64_t n = get_u64(u(body) + 6);
  if (n <= peer_nonce_) return error::nonce;
  const nonce_t nonce = counter_nonce("CurveZMQREADY---", n);
  metadata.assign(body.size() - 14 - mac, '\0');
  if (crypto_box_open_easy_afternm(reinterpret_cast<unsigned char*>(metadata.data()), u(body) + 14, body.size() - 14,
                                   nonce.data(), precomputed_.data()) != 0)
    return error::bad_box;
  peer_nonce_ = n;
  return std::nullopt;
}

std::optional<error> mechanism::on_hello(std::string_view body, std::string& welcome) {
  if (body.size() != 200 || body.substr(0, 6) != "\x05HELLO") return error::malformed;
  if (body[6] != 1 || body[7] != 0) return error::malformed;  // CurveZMQ 1.0
  std::memcpy(peer_short_.data(), body.data() + 80, 32);
  const std::uint64_t n = get_u64(u(body) + 112);
  const nonce_t nonce = counter_nonce("CurveZMQHELLO---", n);
  std::array<unsigned char, 64> zeros{};
  // Which of our keys the client boxed to: during a rotation, either.
  bool opened = false;
  for (std::size_t i = 0; i < server_->own.size() && !opened; ++i) {
    if (crypto_box_open_easy(zeros.data(), u(body) + 120, 80, nonce.data(), peer_short_.data(),
                             server_->own[i].secret_key.data()) == 0) {
      own_index_ = i;
      opened = true;
    }
  }
  if (!opened) return error::bad_box;
  peer_nonce_ = n;

  // The cookie: C' and s' under a key of this connection's own.
  randombytes_buf(cookie_key_.data(), cookie_key_.size());
  std::array<unsigned char, 16> cookie_random{};
  randombytes_buf(cookie_random.data(), cookie_random.size());
  std::array<unsigned char, 64> cookie_plain{};
  std::memcpy(cookie_plain.data(), peer_short_.data(), 32);
  std::memcpy(cookie_plain.data() + 32, short_secret_.data(), 32);
  const nonce_t cookie_nonce = nonce_of("COOKIE--", cookie_random.data());
  std::array<unsigned char, 96> cookie{};
  std::memcpy(cookie.data(), cookie_random.data(), 16);
  crypto_secretbox_easy(cookie.data() + 16, cookie_plain.data(), cookie_plain.size(), cookie_nonce.data(),
                        cookie_key_.data());
  sodium_memzero(cookie_plain.data(), cookie_plain.size());

  // WELCOME: random nonce, box[S' + cookie](S->C').
  std::array<unsigned char, 128> plain{};
  std::memcpy(plain.data(), short_public_.data(), 32);
  std::memcpy(plain.data() + 32, cookie.data(), 96);
  std::array<unsigned char, 16> welcome_random{};
  randombytes_buf(welcome_random.data(), welcome_random.size());
  const nonce_t welcome_nonce = nonce_of("WELCOME-", welcome_random.data());
  welcome.assign(168, '\0');
  auto* out = reinterpret_cast<unsigned char*>(welcome.data());
  std::memcpy(out, "\x07WELCOME", 8);
  std::memcpy(out + 8, welcome_random.data(), 16);
  if (crypto_box_easy(out + 24, plain.data(), plain.size(), welcome_nonce.data(), peer_short_.data(),
                      server_->own[own_index_].secret_key.data()) != 0)
    return error::bad_box;
  return std::nullopt;
}

std::optional<error> mechanism::on_initiate(std::string_view body, std::string_view our_metadata, std::string& metadata,
                                            std::string& ready) {
  if (body.size() < 113 + 128 + mac || body.substr(0, 9) != "\x08INITIATE") return error::malformed;
  // The cookie must be the one we sent on this connection, naming its C' and s'.
  std::array<unsigned char, 64> cookie_plain{};
  const nonce_t cookie_nonce = nonce_of("COOKIE--", u(body) + 9);
  if (crypto_secretbox_open_easy(cookie_plain.data(), u(body) + 25, 80, cookie_nonce.data(), cookie_key_.data()) != 0)
    return error::bad_box;
  const bool ours = sodium_memcmp(cookie_plain.data(), peer_short_.data(), 32) == 0 &&
                    sodium_memcmp(cookie_plain.data() + 32, short_secret_.data(), 32) == 0;
  sodium_memzero(cookie_plain.data(), cookie_plain.size());
  if (!ours) return error::bad_box;
  const std::uint64_t n = get_u64(u(body) + 105);
  if (n <= peer_nonce_) return error::nonce;
  if (crypto_box_beforenm(precomputed_.data(), peer_short_.data(), short_secret_.data()) != 0) return error::bad_box;
  const nonce_t nonce = counter_nonce("CurveZMQINITIATE", n);
  std::string plain(body.size() - 113 - mac, '\0');
  auto* p = reinterpret_cast<unsigned char*>(plain.data());
  if (crypto_box_open_easy_afternm(p, u(body) + 113, body.size() - 113, nonce.data(), precomputed_.data()) != 0)
    return error::bad_box;
  peer_nonce_ = n;
  std::memcpy(peer_long_.data(), p, 32);
  // The vouch proves the client's long-term key holder made C' for this server.
  const nonce_t vouch_nonce = nonce_of("VOUCH---", p + 32);
  std::array<unsigned char, 64> vouch{};
  if (crypto_box_open_easy(vouch.data(), p + 48, 80, vouch_nonce.data(), peer_long_.data(), short_secret_.data()) != 0)
    return error::bad_box;
  if (sodium_memcmp(vouch.data(), peer_short_.data(), 32) != 0 ||
      sodium_memcmp(vouch.data() + 32, server_->own[own_index_].public_key.data(), 32) != 0)
    return error::bad_box;
  if (!server_->allowed.contains(peer_long_)) return error::unknown_key;
  metadata.assign(plain, 128);

  // READY: nonce, box[metadata](S'->C').
  const std::uint64_t rn = nonce_++;
  const nonce_t ready_nonce = counter_nonce("CurveZMQREADY---", rn);
  ready.assign(14 + our_metadata.size() + mac, '\0');
  auto* out = reinterpret_cast<unsigned char*>(ready.data());
  std::memcpy(out, "\x05READY", 6);
  put_u64(out + 6, rn);
  crypto_box_easy_afternm(out + 14, u(our_metadata), our_metadata.size(), ready_nonce.data(), precomputed_.data());
  return std::nullopt;
}

void mechanism::seal(std::string& out, bool more, bool command, std::string_view body) {
  const std::uint64_t n = nonce_++;
  const nonce_t nonce = counter_nonce(is_server() ? "CurveZMQMESSAGES" : "CurveZMQMESSAGEC", n);
  scratch_.resize(1 + body.size());
  scratch_[0] = static_cast<char>((more ? 0x01 : 0) | (command ? 0x02 : 0));
  std::memcpy(scratch_.data() + 1, body.data(), body.size());
  // The wire frame: "\x07MESSAGE", the nonce, the box; flags 0 (short) or long.
  const std::size_t size = 16 + mac + scratch_.size();
  if (size > 255) {
    out += static_cast<char>(flag_long);
    for (int shift = 56; shift >= 0; shift -= 8) out += static_cast<char>((size >> shift) & 0xff);
  } else {
    out += '\0';
    out += static_cast<char>(size);
  }
  const std::size_t at = out.size();
  out.resize(at + size);
  auto* p = reinterpret_cast<unsigned char*>(out.data() + at);
  std::memcpy(p, "\x07MESSAGE", 8);
  put_u64(p + 8, n);
  crypto_box_easy_afternm(p + 16, u(scratch_), scratch_.size(), nonce.data(), precomputed_.data());
}

std::optional<error> mechanism::open(std::string_view body, std::string& plain, bool& more, bool& command) {
  if (body.size() < 16 + mac + 1 || body.substr(0, 8) != "\x07MESSAGE") return error::malformed;
  const std::uint64_t n = get_u64(u(body) + 8);
  if (n <= peer_nonce_) return error::nonce;
  const nonce_t nonce = counter_nonce(is_server() ? "CurveZMQMESSAGEC" : "CurveZMQMESSAGES", n);
  const std::size_t size = body.size() - 16 - mac;
  scratch_.resize(size);
  if (crypto_box_open_easy_afternm(reinterpret_cast<unsigned char*>(scratch_.data()), u(body) + 16, body.size() - 16,
                                   nonce.data(), precomputed_.data()) != 0)
    return error::bad_box;
  peer_nonce_ = n;
  const auto flags = static_cast<unsigned char>(scratch_[0]);
  more = flags & 0x01;
  command = flags & 0x02;
  plain.append(scratch_, 1);
  return std::nullopt;
}

}  // namespace smockron::zmtp::curve
