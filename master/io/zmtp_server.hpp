// The master's ZeroMQ endpoints, spoken on the wire (ZMTP 3.0 through
// shared/protocol/zmtp_session.hpp; CURVE server when given keys) over TCP or IPC, on the master's own
// thread: the listener and its connections are sources of the master's
// event_loop. One class, two roles:
//
// - role sub, the accounting endpoint: gatekeepers' PUB sockets connect and
//   publish; we send our subscriptions (one topic per owned domain) and hand
//   every complete message to on_message. Subscriptions go out only after
//   the peer's READY arrived: a libzmq peer that has not sent its own READY
//   yet would take them for a handshake command and drop the connection.
// - role pub, the control endpoint: gatekeepers' SUB sockets connect and
//   subscribe; publish() queues a message for every peer subscribed to its
//   first frame, and the queues are written once per turn of the loop
//   (flush()), a writev of many messages per gatekeeper.
//
// Why not libzmq: at gatekeeper rates libzmq's receive path (an I/O thread
// that decodes every frame into a message object and hands it over a pipe,
// then one zmq_msg_recv per frame) costs several times the rule logic per
// message, and its send path wakes that I/O thread for nearly every message
// (an eventfd write and a context switch on a master that has one core).
// Here one recv() brings in up to 64 KiB (hundreds of messages) whose frames
// are views into that buffer, and one send() carries every DELAY_UNTIL of a
// turn. Any ZeroMQ PUB or SUB (libzmq 4.x, pyzmq, a zmq_proxy) can talk to
// the master.
//
// Bounds: at most `max_peers` connections (more are closed at once), a
// handshake must finish within `handshake_timeout`, one message is at most
// k_max_message bytes (accounting messages are under 6 KiB by the wire
// limits: a larger one is skipped on its own, the connection stays), output a
// subscriber-role peer does not read is capped, a publisher-role peer's queue
// holds at most `max_queued` messages (more are dropped for it, as a libzmq
// PUB past its high-water mark) and `max_subscriptions` topics; a peer
// breaking a bound is disconnected, never the daemon. TCP keepalive finds
// vanished gatekeepers.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "master/io/event_loop.hpp"
#include "shared/base/clock.hpp"
#include "shared/base/log.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/net.hpp"
#include "shared/protocol/zmtp_session.hpp"

namespace smockron::master {

class zmtp_server {
public:
  /// Largest message (all frames with their headers) a peer may send.
  static constexpr std::size_t k_max_message = 32 * 1024;
  /// A message over k_max_message is skipped on its own (its frames consumed
  /// by length, counted in smockron_master_accounting_oversized_total) and
  /// the connection stays; one declared over this is taken as a stream that
  /// cannot be read (framing fault).
  static constexpr std::uint64_t k_max_skip = 16 * 1024 * 1024;
  /// Frames kept per message; more set `truncated` (the message is malformed).
  static constexpr std::size_t k_max_frames = 8;

  struct options {
    zmtp::session::role role = zmtp::session::role::sub;
    /// The endpoint's name: metrics smockron_master_NAME_..., log lines, the config keys named in them.
    std::string name = "accounting";
    std::size_t max_peers = 1024;
    std::chrono::milliseconds handshake_timeout{10'000};
    int rcvbuf = 4 * 1024 * 1024;  ///< SO_RCVBUF of every connection (0 = kernel default)
    int sndbuf = 0;                ///< SO_SNDBUF of every connection (0 = kernel default)
    /// TCP peers allowed to connect (empty: anyone); others are closed at
    /// accept, counted (smockron_master_refused_connections_total) and logged.
    std::vector<cidr> allow = {};
    /// Role pub: messages queued for one peer since its output was last
    /// empty, beyond which more are dropped for it (0: no limit).
    std::size_t max_queued = 0;
    /// Role pub: topics one peer may subscribe to; more is a fault.
    std::size_t max_subscriptions = 10'000;
    /// CURVE (our keys and the gatekeepers' we admit); null: NULL, plaintext.
    std::shared_ptr<const zmtp::curve::server_keys> curve = nullptr;
  };

  using message_fn = std::function<void(std::span<const std::string_view> frames, bool truncated)>;

  /// Binds and listens on `endpoint` ("tcp://host:port", port may be "*" or
  /// 0; "ipc:///path" or "ipc://@abstract"), watched by `loop`. Throws
  /// std::runtime_error with a clear message when the endpoint is invalid or
  /// cannot be bound.
  zmtp_server(event_loop& loop, const std::string& endpoint, options o, const clock& clk, metrics::registry& reg);
  ~zmtp_server();
  zmtp_server(const zmtp_server&) = delete;
  zmtp_server& operator=(const zmtp_server&) = delete;

  /// The bound endpoint, with the port chosen by the kernel when it was "*".
  const std::string& endpoint() const { return endpoint_; }

  // ---- role sub (accounting) ----

  /// Prefix subscriptions, sent to every connected peer and to each new one.
  void subscribe(std::string_view topic);
  void unsubscribe(std::string_view topic);

  /// Who gets every complete message that arrives while the loop turns
  /// (frames point into an internal buffer, valid during the call).
  void on_message(message_fn f) { on_message_ = std::move(f); }
  /// Messages handed over so far.
  std::size_t delivered() const { return delivered_; }
  /// The connection whose message is being handed over (during on_message):
  /// an id unique for this subscriber's life.
  std::uint64_t current_peer() const { return current_peer_; }
  /// The gatekeeper that peer named in its READY (X-Gatekeeper, zmtp.hpp); 0: none.
  std::uint64_t current_gatekeeper() const { return current_gatekeeper_; }
  /// Who is told, with its id, when a connection closes (its gatekeeper left,
  /// or broke a bound): what it had open dies with it. The second argument
  /// is the gatekeeper it named when no other open connection names it (the
  /// gatekeeper is gone: a proxy has one connection per worker), else 0.
  void on_peer_closed(std::function<void(std::uint64_t peer, std::uint64_t gatekeeper_gone)> f) {
    on_closed_ = std::move(f);
  }
  // ---- role pub (control) ----

  /// What became of one published message.
  struct published {
    std::size_t queued = 0;   ///< peers it was queued for
    std::size_t dropped = 0;  ///< subscribed peers whose queue was full (max_queued)
  };
  /// Queues one message (its frames) for every peer subscribed to a prefix of
  /// its first frame; it leaves at the next flush() (or at once when a
  /// queue has grown past 64 KiB).
  published publish(std::span<const std::string_view> frames);
  /// Writes what publish() queued (as much as each peer's socket takes; the
  /// rest when it becomes writable).
  void flush();
  /// Who is told of each subscription a peer makes (its topic; cancels are not told).
  void on_subscription(std::function<void(std::string_view)> f) { on_subscription_ = std::move(f); }

  // ---- both ----

  /// After each turn of the loop: accepting resumes after a pause, handshakes
  /// that took too long end, closed connections are freed.
  void after_turn();

  /// One turn of the loop and after_turn(), with `f` for the messages
  /// (tests, and whoever has nothing else on the loop). Returns how many.
  std::size_t poll(std::chrono::milliseconds timeout, message_fn f);

  /// Peers that finished the handshake.
  std::size_t peers() const;

  /// New CURVE keys (a reload): new connections use them; a connected
  /// gatekeeper whose key is no longer listed is disconnected (unknown_key),
  /// and so is one whose handshake used a master key no longer configured
  /// (not counted: it connects again under the current key). A handshake
  /// under way is judged by the keys in force when it completes. Null and
  /// non-null cannot be swapped (a restart changes the mechanism).
  void set_curve(std::shared_ptr<const zmtp::curve::server_keys> keys);

private:
  struct peer;
  struct listener final : event_loop::source {
    zmtp_server& self;
    explicit listener(zmtp_server& s) : self(s) {}
    void on_ready(std::uint32_t) override { self.accept_all(); }
  };
  void peer_ready(peer& p, std::uint32_t events);
  void accept_all();
  bool admitted(const sockaddr_storage& from);
  void on_readable(peer& p);
  void parse(peer& p);
  void send_subscription(bool subscribe, std::string_view topic);
  void send(peer& p, std::string_view bytes);
  void flush(peer& p);
  void drop(peer& p, zmtp::fault why, std::string_view detail);
  /// CURVE: why the current keys no longer admit a peer that finished its
  /// handshake (unknown_key: its key is not listed; closed: it used a
  /// retired master key), if they do not.
  std::optional<zmtp::fault> unwelcome(const peer& p) const;
  /// Closes the peer when unwelcome(); true if it did.
  bool refuse_if_unwelcome(peer& p);
  void close(peer& p);
  void expire_handshakes();
  void update_interest(peer& p);

  event_loop& loop_;
  listener listener_{*this};
  message_fn on_message_;
  std::function<void(std::string_view)> on_subscription_;
  std::string message_;        ///< role pub: the message being published, framed
  std::vector<peer*> unsent_;  ///< role pub: peers with queued messages not yet flushed
  std::function<void(std::uint64_t, std::uint64_t)> on_closed_;
  std::size_t delivered_ = 0;
  std::uint64_t current_peer_ = 0;
  std::uint64_t current_gatekeeper_ = 0;
  std::uint64_t last_peer_id_ = 0;
  const clock& clock_;
  options opt_;
  std::string endpoint_;
  std::string unlink_path_;  ///< ipc socket file removed on destruction
  int listen_fd_ = -1;
  std::vector<std::unique_ptr<peer>> peers_;
  std::vector<std::string> topics_;     ///< role sub: what we subscribe to
  std::size_t subscription_bytes_ = 0;  ///< role sub: all subscription frames, as sent to a new peer
  std::chrono::steady_clock::time_point next_expiry_check_{};
  std::chrono::steady_clock::time_point accept_paused_until_{};
  bool accept_paused_ = false;
  std::atomic<std::size_t> ready_peers_{0};  ///< read by the admin thread

  metrics::counter& connections_;
  metrics::counter& refused_;
  metrics::counter* oversized_ = nullptr;             ///< role sub
  metrics::counter* faults_[zmtp::fault_count] = {};  ///< the faults this role can meet (others stay null)
  std::shared_ptr<spdlog::logger> log_;
  log::rate_limiter fault_log_;
};

}  // namespace smockron::master
