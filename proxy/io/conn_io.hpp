// One client connection and the I/O every stage of a request uses on it:
// deadlines, reads, writes, the proxy's own small responses, and holding.
//
// Deadlines cost no timer operation per read or write: an operation sets
// `connection::deadline` (in the injected clock's time), and one watchdog
// timer per connection, waking at least every `tick` (half the shortest
// timeout), cancels the connection's sockets once the deadline has passed. Every deadline set
// later is further away than `tick`, so the watchdog always fires in time.
//
// Writes go out at once when the socket takes them (nearly always: a head
// and a small body), so the coroutine carries on without a trip through the
// scheduler, as nginx writes; only what the socket did not take waits. Reads
// are of two kinds (drain_read.hpp): the first read of a message head waits
// for readiness when the last read drained the socket; every other read tries
// at once, so an end of stream is never missed.
#pragma once

#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "proxy/codec/body_relay.hpp"
#include "proxy/codec/http1.hpp"
#include "proxy/io/asio_types.hpp"
#include "proxy/io/drain_read.hpp"
#include "proxy/io/link.hpp"
#include "shared/base/clock.hpp"

namespace smockron::proxy {

/// First read of a head: 1 KiB holds most request heads (as nginx's
/// client_header_buffer_size); the buffer grows when one is larger. Per idle
/// or held connection this is most of the memory it costs.
inline constexpr std::size_t k_head_read = 1024;
/// Body relay: bytes per read.
inline constexpr std::size_t k_relay_chunk = 16384;
/// An upstream's response head at most.
inline constexpr std::size_t k_max_response_head = 65536;

/// The upstream connection of the current request (cancelled with the
/// client connection when a deadline passes).
struct upstream_conn {
  std::optional<link> sock;
  std::size_t server = 0;  ///< index in its upstream's server list
  bool reused = false;     ///< taken from the pool (may have been closed by the server meanwhile)

  void use(link s, std::size_t srv, bool was_pooled) {
    sock.emplace(std::move(s));
    server = srv;
    reused = was_pooled;
  }
  void release() { sock.reset(); }
};

/// What became of the current request (forward() fills it; the access log
/// and the upstream metrics read it).
struct request_outcome {
  unsigned status = 0;                ///< sent to the client (0: nothing was)
  std::uint64_t bytes_in = 0;         ///< request body bytes relayed upstream
  std::uint64_t bytes_out = 0;        ///< response body bytes relayed to the client
  std::optional<std::size_t> server;  ///< the upstream server used, by index
  /// The response field the route's cost is read from (cost =
  /// "response_header:NAME"), from the head or the trailers; nothing: absent.
  std::optional<std::string> cost_field;
  bool cost_fields_several = false;  ///< more than one line of that name (malformed)
  /// Set at admission for a route whose cost is the request body's size and
  /// a body without a length: the bytes that fit then (-1: no bound known).
  /// A body growing past it is cut off, never forwarded whole (cut_by_cost).
  std::int64_t body_cost_limit = -1;
  bool cost_cut = false;  ///< it did: cut off, and the request refused (cost_over_limit)
};

/// What forwarding uses on a connection: the upstream connection in use, its
/// response, the body being relayed and the buffers of its next write. Made
/// by the first request forwarded and kept for the next ones, so a
/// connection whose requests are held or refused never carries it (most of
/// a held request's memory otherwise).
struct forwarding {
  upstream_conn up;
  boost::beast::flat_buffer upstream_in;
  http1::response_head response;
  // These live here rather than in a coroutine frame, which every request would allocate.
  std::optional<body_relay> relay;
  buffer_list bufs;
  std::string trailers;  ///< a chunked response's trailer section, kept when a cost is read from it
};

/// The deadline an exchange's reads and writes run under, kept in the
/// injected clock's (coarse) steady time. Whoever owns the sockets enforces
/// it: a client connection's watchdog, or the sweep of the HTTP/2
/// connection whose stream an upstream exchange serves. No timer operation
/// per read or write.
struct io_deadline {
  explicit io_deadline(const clock& c) : clk(c) {}

  const clock& clk;
  steady::time_point deadline = steady::time_point::max();
  bool expired = false;   ///< the last deadline passed (operations were cancelled)
  int reads_at_once = 0;  ///< read_more() results in a row without waiting

  /// Sets the deadline `d` from now. The coarse clock (a few ms resolution)
  /// is cheap enough per operation, and a deadline early by a few ms is no
  /// matter for timeouts of seconds (the enforcer's period leaves room for it).
  void expires_after(steady::duration d) {
    deadline = clk.coarse_steady_now() + d;
    expired = false;
  }
  void expires_never() {
    deadline = steady::time_point::max();
    expired = false;
  }
  /// True once when the deadline has passed at `now` (it is cleared: the enforcer cancels once).
  bool passed(steady::time_point now) {
    if (deadline > now) return false;
    expired = true;
    deadline = steady::time_point::max();
    return true;
  }
  /// An operation's error, as timed_out when the deadline cancelled it.
  boost::system::error_code classify(boost::system::error_code ec) const {
    return ec && expired ? make_error_code(asio::error::timed_out) : ec;
  }
};

/// One client connection and what its requests reuse: buffers, the parsed
/// head, and (once one was forwarded) what forwarding uses.
struct connection : io_deadline {
  /// `clk`: deadlines are kept in its (coarse) steady time; `t`: the watchdog's period.
  connection(tcp_socket s, const clock& clk, steady::duration t)
      : io_deadline(clk), client(std::move(s)), timer(client.get_executor()), tick(t) {}

  link client;
  boost::beast::flat_buffer in;
  std::string out;     ///< the head being written
  std::string target;  ///< the request target normalized, when it differs (request.target then points here)
  std::string early;   ///< bytes after the head that arrived while the request was held (see hold())
  /// Header lines of the proxy's own for the current request's response (rate-limit
  /// fields, the decision): added to whatever answers it, the upstream or the proxy.
  std::string response_fields;
  request_outcome outcome;
  http1::request_head request;
  std::unique_ptr<forwarding> forwarding_;  ///< see fwd()
  steady_timer timer;
  steady::duration tick;
  bool idle = true;  ///< between requests (cancelled at once when draining)
  bool closed = false;
  /// The hold in progress (hold()) ends at this time of the watchdog's (real
  /// steady time; max: none): the watchdog ends it, so a held request waits
  /// on its socket alone, with no timer or operator of its own.
  steady::time_point hold_until = steady::time_point::max();
  bool released = false;  ///< the watchdog ended the hold (and cancelled the client's operations)

  void close() {
    closed = true;
    timer.cancel();
  }
  /// What forwarding uses, made on first use.
  forwarding& fwd() {
    if (!forwarding_) forwarding_ = std::make_unique<forwarding>();
    return *forwarding_;
  }
  /// Starts the watchdog; it stops after close().
  static void watch(std::shared_ptr<connection> self);
  /// Makes the watchdog look again now (a hold ends sooner than its next look).
  void rewatch() { timer.cancel(); }
};

/// The bytes of a receive buffer.
inline std::string_view view(const boost::beast::flat_buffer& b) {
  return {static_cast<const char*>(b.data().data()), b.size()};
}

/// Sends what the socket takes now, without waiting, and drops it from `b`.
/// Returns false when something is left to wait for (always, on a TLS link:
/// the SSL stream writes); true when all went or the socket failed (`ec`).
bool send_now(link& s, buffer_list& b, boost::system::error_code& ec);

/// Writes all of `b` within `timeout`.
inline auto write(io_deadline& c, link& s, const buffer_list& b, steady::duration timeout) {
  c.expires_after(timeout);
  return asio::async_write(s, b.span(), nothrow);
}
template <class Buffer>
auto write(io_deadline& c, link& s, const Buffer& b, steady::duration timeout) {
  c.expires_after(timeout);
  return asio::async_write(s, b, nothrow);
}

/// The first read of a request or response head (see drain_read.hpp; a TLS
/// link reads through its SSL stream, which may hold decrypted bytes already).
inline auto read_first(io_deadline& c, link& s, asio::mutable_buffer b, steady::duration timeout) {
  c.expires_after(timeout);
  if (s.tls()) return s.tls()->async_read_some(b, nothrow);
  return s.socket().async_read_some(drain_buffer(b), nothrow);
}

/// Any other read: tries at once, waits for readiness only when the socket
/// has nothing now. `timeout`: the deadline from now (each read is progress),
/// or none to keep the one running (a request head has one deadline for all
/// of it). A result at once is never a timeout; after a few of them in a row
/// the connection lets the others on its worker have a turn, so a transfer
/// between two fast peers cannot hold the worker for its whole length.
awaitable<std::tuple<boost::system::error_code, std::size_t>> read_more(io_deadline& c, link& s, asio::mutable_buffer b,
                                                                        std::optional<steady::duration> timeout);

/// What a stage leaves of the client connection: the next request may follow
/// on it, or it ends.
enum class connection_next : std::uint8_t { goes_on, ends };
/// `goes_on` when `go_on`.
constexpr connection_next goes_on_if(bool go_on) { return go_on ? connection_next::goes_on : connection_next::ends; }

/// How a hold ended: at its time, or because the client left first.
enum class hold_end : std::uint8_t { released, client_left };

/// Writes a small response generated by the proxy itself (`retry_after_s` >
/// 0 adds Retry-After); the connection goes on when `keep_alive` and the write succeeded.
awaitable<connection_next> respond(connection& c, unsigned version, unsigned status, std::string_view body,
                                   bool keep_alive, std::int64_t retry_after_s = 0);

/// Answers a request the proxy refuses while the client may still be
/// sending, then closes gracefully (lingering close): the connection ends.
awaitable<connection_next> refuse(connection& c, unsigned version, unsigned status, std::string_view body);

/// Holds for `wait` unless the client goes away first. Bytes the client sends meanwhile (a body, a pipelined request)
/// are read into `c.early` (at most 64 KiB; past that the socket is watched
/// for a FIN), so that a client that sends and leaves is seen leaving; they
/// go upstream after the head (forward()). A client that half-closes while
/// held counts as gone.
awaitable<hold_end> hold(connection& c, steady::duration wait);

}  // namespace smockron::proxy
