// The CURVE security mechanism of ZMTP (rfc.zeromq.org/spec/25 ZMTP-CURVE,
// spec/26 CurveZMQ) without I/O: keys in ZeroMQ's Z85 text, the four
// handshake commands (HELLO, WELCOME, INITIATE, READY) for a client and a
// server, and the MESSAGE command that carries every frame afterwards.
// zmtp::session runs it; libsodium does the cryptography (crypto_box, the
// same primitives libzmq uses, so either end can be libzmq).
//
// The details interoperability depends on, as libzmq 4.3 does them: HELLO is
// 200 bytes (72 bytes of zero padding so that it is never shorter than
// WELCOME); the cookie is the server's short-term keys under a key of the
// connection's own, so a server keeps nothing for a peer until INITIATE;
// nonces are 8-byte counters per direction starting at 1, each one above the
// last; inside a MESSAGE box the first byte holds MORE (0x01) and COMMAND
// (0x02), the wire frame carrying the box has neither.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace smockron::zmtp::curve {

inline constexpr std::size_t key_size = 32;
using key = std::array<unsigned char, key_size>;

/// A long-term keypair (a gatekeeper's or a master's).
struct keypair {
  key public_key{};
  key secret_key{};
};

/// Z85 (rfc.zeromq.org/spec/32): 32 bytes as 40 printable characters.
std::string z85_encode(const key& k);
/// Nothing unless `text` is exactly 40 characters of the Z85 alphabet.
std::optional<key> z85_decode(std::string_view text);

keypair generate();
keypair from_secret(const key& secret);

/// Reads a secret key from a file: a bare Z85 key first on a line (other
/// lines starting with `#` are comments; a key may itself start with `#`),
/// or ZeroMQ's certificate format (a line `secret-key = "..."`). Throws
/// std::runtime_error naming the file and what is wrong.
keypair read_secret_key(const std::string& path);
/// Reads a public key the same way (`public-key = "..."` in a certificate).
/// `text` may also be the Z85 key itself (40 characters, not a file).
key read_public_key(const std::string& path_or_key);
/// Public keys, one per line (Z85 first on the line; what follows it, blank
/// lines and other lines starting with `#` are ignored). Throws on a line
/// that is not a key.
std::set<key> read_key_list(const std::string& path);

/// A server's keys: its own (the first is current; during a rotation the
/// previous one is still accepted) and the client keys it admits.
struct server_keys {
  std::vector<keypair> own;
  std::set<key> allowed;
};
/// A client's keys: its own and the one server key it accepts.
struct client_keys {
  keypair own;
  key server{};
};

/// Why a CURVE handshake or message failed (each one a metric label).
enum class error : std::uint8_t {
  malformed,    ///< a command of the wrong name, size or version
  bad_box,      ///< a box that does not open (wrong key, tampered bytes)
  nonce,        ///< a nonce not above the last one (replayed or reordered)
  unknown_key,  ///< a client key the server does not list
};
std::string_view to_string(error e);

/// One end's CURVE state for one connection: the short-term keys, the
/// precomputed shared key, the nonce counters. Commands are bodies (the
/// bytes of one frame, name included); the session frames them.
class mechanism {
public:
  /// A client (connects, speaks first) or a server (binds).
  explicit mechanism(std::shared_ptr<const client_keys> keys);
  explicit mechanism(std::shared_ptr<const server_keys> keys);
  ~mechanism();
  mechanism(const mechanism&) = delete;
  mechanism& operator=(const mechanism&) = delete;

  bool is_server() const { return server_ != nullptr; }

  /// Client: the HELLO command body (empty when the server key is not a usable curve point).
  std::string hello();
  /// Client: WELCOME in, INITIATE (with `metadata`, ZMTP properties) out.
  std::optional<error> on_welcome(std::string_view body, std::string_view metadata, std::string& initiate);
  /// Client: READY in; `metadata` gets its properties.
  std::optional<error> on_ready(std::string_view body, std::string& metadata);
  /// Server: HELLO in, WELCOME out.
  std::optional<error> on_hello(std::string_view body, std::string& welcome);
  /// Server: INITIATE in (the client's key checked against the allowed
  /// keys), READY with `our_metadata` out; `metadata` gets the client's.
  std::optional<error> on_initiate(std::string_view body, std::string_view our_metadata, std::string& metadata,
                                   std::string& ready);

  /// After the handshake: appends one wire frame carrying `body` in a
  /// MESSAGE box, with `more` / `command` inside the box.
  void seal(std::string& out, bool more, bool command, std::string_view body);
  /// Opens a MESSAGE body: appends the frame's bytes to `plain` and sets
  /// `more` / `command`.
  std::optional<error> open(std::string_view body, std::string& plain, bool& more, bool& command);

  /// The peer's long-term public key (the client's, on a server, once INITIATE was accepted).
  const key& peer_key() const { return peer_long_; }
  /// Server: the public key of ours the client boxed its HELLO to (during a rotation, either).
  const key& own_key() const { return server_->own[own_index_].public_key; }

private:
  std::shared_ptr<const client_keys> client_;
  std::shared_ptr<const server_keys> server_;
  std::size_t own_index_ = 0;  ///< server: which of its keys the client used
  key short_public_{}, short_secret_{};
  key peer_short_{};  ///< the peer's short-term public key
  key peer_long_{};
  std::array<unsigned char, 96> cookie_{};  ///< client: from WELCOME, returned in INITIATE
  std::array<unsigned char, 32> cookie_key_{};
  std::array<unsigned char, 32> precomputed_{};  ///< crypto_box_beforenm of the short-term keys
  std::uint64_t nonce_ = 1;                      ///< ours, for the next box
  std::uint64_t peer_nonce_ = 0;                 ///< the peer's last
  std::string scratch_;
};

}  // namespace smockron::zmtp::curve
