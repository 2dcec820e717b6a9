// One end of a ZMTP 3.0 connection (NULL or CURVE mechanism), without I/O:
// bytes in, bytes and events out. Both ends of the accounting stream use it,
// the proxy's sender (role pub, proxy/cluster/accounting_sender.hpp) and the
// master's receiver (role sub, master/io/zmtp_server.hpp), and the master's
// control publisher (role pub, the same zmtp_server); the transports
// only move bytes, keep deadlines and bound their output.
//
// The session checks the peer's greeting (ZMTP 3.x, NULL), its READY (a
// socket type that can talk to ours), then reads frames: PING is answered
// with PONG, ERROR ends the session, data messages are delivered (role sub)
// or read as subscriptions (role pub: 0x01/0x00-prefixed messages, or the
// SUBSCRIBE/CANCEL commands of ZMTP 3.1 peers). We announce 3.0, so a 3.1
// peer (libzmq 4.2+) talks 3.0 to us. Every failure is a `fault`, which is
// also the metric label the transports count it under.
//
// With keys (`security`), the mechanism is CURVE (zmtp_curve.hpp): the
// handshake is HELLO/WELCOME/INITIATE/READY, then every frame each way is a
// MESSAGE box. Such a session consumes each frame as it is opened (a box is
// opened once: its nonce is spent) and keeps an unfinished message's
// plaintext itself; what it sends must go through append()/append_framed(),
// which seal every frame. A peer that is not CURVE, or whose key is not
// listed, never gets past the handshake.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "shared/base/string_hash.hpp"
#include "shared/protocol/zmtp.hpp"
#include "shared/protocol/zmtp_curve.hpp"

namespace smockron::zmtp {

/// Why a connection ended: the `reason` label of the disconnect counters.
enum class fault : std::uint8_t {
  greeting,       ///< not a ZMTP 3.x greeting (older ZeroMQ, or not ZeroMQ at all)
  mechanism,      ///< a security mechanism other than ours (NULL, or CURVE when keys are configured)
  handshake,      ///< READY missing, malformed, repeated, or from a socket type that cannot talk to ours
  framing,        ///< reserved flag bits, a command with MORE, a frame or message over the bounds
  peer_error,     ///< the peer sent ERROR
  subscriptions,  ///< more subscriptions than allowed
  timeout,        ///< (transport) the handshake did not finish in time
  peer_limit,     ///< (transport) too many connections
  stalled,        ///< (transport) the peer does not read what we send
  connect,        ///< (transport) resolving or connecting failed
  closed,         ///< (transport) the peer closed the connection
  io,             ///< (transport) a socket error
  unknown_key,    ///< CURVE: the client's key is not listed
  bad_box,        ///< CURVE: a box that does not open (wrong server key, tampered bytes)
  nonce,          ///< CURVE: a nonce not above the last one (replayed or reordered)
};
inline constexpr std::size_t fault_count = 15;
std::string_view to_string(fault f);

/// Data messages a session delivers, and the events of a session's life.
class session_events {
public:
  virtual ~session_events() = default;
  /// The handshake finished (the peer's READY arrived).
  virtual void on_ready() {}
  /// Role sub: a complete message (frames point into the fed bytes, valid
  /// during the call); `truncated` when it had more than max_frames frames.
  virtual void on_message(std::span<const std::string_view> /*frames*/, bool /*truncated*/) {}
  /// Role sub: a message over max_message was skipped on its own (`bytes`: its size).
  virtual void on_oversized(std::uint64_t /*bytes*/) {}
  /// Role pub: the peer subscribed to (or cancelled) a topic prefix.
  virtual void on_subscription(bool /*subscribe*/, std::string_view /*topic*/) {}
};

class session {
public:
  /// Our socket type: pub sends data messages and takes subscriptions; sub
  /// receives data messages (and sends subscriptions, through its transport).
  enum class role : std::uint8_t { pub, sub };

  struct limits {
    std::size_t max_message = 32 * 1024;  ///< a message (all frames, headers included) or command at most
    /// Role sub: a message over max_message but at most this is skipped on
    /// its own (its frames consumed by length) and the session goes on; a
    /// larger one is a framing fault. 0: every oversized message is a fault.
    std::uint64_t max_skip = 0;
    std::size_t max_frames = 8;               ///< frames delivered per message; more set `truncated`
    std::size_t max_pong_backlog = SIZE_MAX;  ///< PING is not answered while `out` holds this much
  };

  /// Keys make the session CURVE: `client` when we connect, `server` when
  /// we bind (one of the two); none: NULL.
  struct security {
    std::shared_ptr<const curve::client_keys> client;
    std::shared_ptr<const curve::server_keys> server;
  };

  session(role r, limits l, security sec = {});

  /// What a NULL session sends at once on connecting: greeting and READY (the
  /// NULL mechanism needs nothing from the peer first; a libzmq peer reads
  /// exactly its greeting before READY).
  static std::string_view hello(role r);
  /// What this session sends at once: hello(r) for NULL; for CURVE the
  /// greeting, and a client's HELLO.
  void start(std::string& out);
  /// Names this end's gatekeeper in its READY (X-Gatekeeper, zmtp.hpp; 16
  /// hex digits): call before start(). Empty: not named.
  void name_gatekeeper(std::string id) { own_gatekeeper_ = std::move(id); }
  /// The gatekeeper the peer named in its READY (16 hex digits as a number);
  /// 0: none, or not 16 hex digits.
  std::uint64_t peer_gatekeeper() const { return peer_gatekeeper_; }

  /// Appends one frame to send (`flags`: flag_more / flag_command), sealed
  /// when the session is CURVE. Only once ready(), for CURVE.
  void append(std::string& out, std::uint8_t flags, std::string_view body);
  /// Appends frames already framed in the clear (append_frame's output),
  /// sealing each one when the session is CURVE.
  void append_framed(std::string& out, std::string_view framed);
  bool secure() const { return mechanism_ != nullptr; }
  /// CURVE: the peer's long-term public key (a server knows it once ready()).
  const curve::key* peer_key() const { return mechanism_ ? &mechanism_->peer_key() : nullptr; }
  /// CURVE server: which of its own public keys the peer's handshake used (once past HELLO).
  const curve::key* own_key() const { return mechanism_ && mechanism_->is_server() ? &mechanism_->own_key() : nullptr; }

  /// Parses the bytes received so far (`in`, from the first not yet
  /// consumed). Returns how many bytes are consumed; the rest (an unfinished
  /// message) must be fed again with what follows. Replies (PONG) are
  /// appended to `out`. After a fault nothing more is parsed: see failed().
  std::size_t feed(std::string_view in, session_events& ev, std::string& out);

  bool ready() const { return phase_ == phase::messages; }
  std::optional<fault> failed() const { return fault_; }
  /// What went wrong, for a log line (peer text made printable).
  const std::string& detail() const { return detail_; }

private:
  enum class phase : std::uint8_t { greeting, handshake, messages, failed };
  bool fail(fault f, std::string detail);
  /// Checks the peer's greeting; false while incomplete or on a fault.
  bool greet(std::string_view in);
  /// Starts or continues skipping an oversized message at frame `f`
  /// (`before`: bytes of the message already read); false on a fault.
  bool skip_frame(const frame& f, std::size_t before, session_events& ev);
  bool command(std::string_view body, session_events& ev, std::string& out);
  bool data(std::span<const std::string_view> frames, bool truncated, session_events& ev);
  /// feed() for CURVE, past the greeting: frame by frame.
  std::size_t feed_curve(std::string_view in, std::size_t pos, session_events& ev, std::string& out);
  bool curve_handshake(std::string_view body, std::string& out, session_events& ev);
  bool curve_fail(curve::error e, std::string_view during);
  /// Checks the Socket-Type in READY's properties (or CURVE's INITIATE/READY
  /// metadata), and reads the peer's X-Gatekeeper.
  bool peer_type_fits(std::string_view metadata);
  /// Our READY's properties (the body after the command name).
  std::string own_properties() const;

  role role_;
  limits limits_;
  phase phase_ = phase::greeting;
  std::optional<fault> fault_;
  std::string detail_;
  std::uint64_t skip_ = 0;                       ///< bytes of an oversized message still to discard
  std::uint64_t skipped_ = 0;                    ///< bytes of it discarded or due so far
  bool skip_more_ = false;                       ///< the message being discarded has more frames
  std::size_t served_ = 0;                       ///< commands inside the unfinished message served up to this offset
  std::unique_ptr<curve::mechanism> mechanism_;  ///< CURVE; null: NULL
  std::string plain_;                            ///< CURVE: the unfinished message's frames, opened
  std::array<std::size_t, 17> plain_ends_{};     ///< CURVE: where each of its frames ends in plain_
  std::size_t plain_count_ = 0;                  ///< CURVE: its frames kept (at most max_frames)
  bool plain_truncated_ = false;
  bool hello_seen_ = false;  ///< CURVE: HELLO (server) or WELCOME (client) done
  std::string own_gatekeeper_;
  std::uint64_t peer_gatekeeper_ = 0;
};

/// The topic prefixes a peer subscribed to, with ZeroMQ's counting (a topic
/// subscribed twice needs two cancels). Matching is by prefix; an exact
/// "domain\0" topic (what the master subscribes) is one hash lookup.
class subscription_set {
public:
  explicit subscription_set(std::size_t max) : max_(max) {}
  /// False when the set is full (`max` topics).
  bool apply(bool subscribe, std::string_view topic);
  bool matches(std::string_view topic) const;
  bool empty() const { return subs_.empty(); }
  void clear() {
    subs_.clear();
    open_prefixes_ = 0;
  }

private:
  std::size_t max_;
  string_map<std::uint32_t> subs_;  ///< topic -> times subscribed
  std::size_t open_prefixes_ = 0;   ///< topics not ending in \0: a topic may match them by prefix
};

}  // namespace smockron::zmtp
