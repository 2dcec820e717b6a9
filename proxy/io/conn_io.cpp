// Connection I/O (see conn_io.hpp).
#include "proxy/io/conn_io.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/post.hpp>

#include <array>
#include <cerrno>

#include "proxy/io/sys_io.hpp"

namespace smockron::proxy {

namespace {
constexpr int k_reads_per_turn = 16;  // read_more(): reads without waiting before others get a turn
constexpr auto k_linger =
    std::chrono::seconds(5);  // refuse(): reading what a refused client still sends (nginx's lingering_timeout)
constexpr std::size_t k_linger_bytes = 1 << 20;  // ... at most this much
constexpr auto k_respond_timeout = std::chrono::seconds(10);
constexpr std::size_t k_hold_buffer = 64 * 1024;                // hold(): bytes read from a held client at most
constexpr auto k_hold_poll = std::chrono::milliseconds(100);    // hold(): beyond them, how often it looks for a FIN
constexpr std::size_t k_hold_read = 4096;                       // hold(): bytes per read
constexpr auto k_release_retry = std::chrono::milliseconds(1);  // a released hold not yet ended: cancel again
}  // namespace

void connection::watch(std::shared_ptr<connection> self) {
  connection& c = *self;
  const auto now = c.clk.steady_now();
  boost::system::error_code ignored;
  if (c.passed(now)) {
    c.client.socket().cancel(ignored);
    if (c.forwarding_ && c.forwarding_->up.sock) c.forwarding_->up.sock->socket().cancel(ignored);
  }
  const auto real_now = steady::now();
  if (c.hold_until <= real_now) {
    // Released: what the hold waits on is cancelled, and again at each look
    // until hold() has seen it and ended (hold_until back to max). One cancel
    // can miss: a TLS read is several socket reads, and the next may start
    // after it (a record cut across segments).
    c.released = true;
    c.client.socket().cancel(ignored);
  }
  // The timer runs on real steady time; the deadline is in the clock's time.
  steady::duration next = c.deadline - now < c.tick ? c.deadline - now : c.tick;
  if (c.hold_until != steady::time_point::max()) {
    next = std::min<steady::duration>(next, std::max<steady::duration>(c.hold_until - real_now, k_release_retry));
  }
  c.timer.expires_after(next);
  c.timer.async_wait([self = std::move(self)](const boost::system::error_code&) mutable {
    if (!self->closed) watch(std::move(self));
  });
}

bool send_now(link& s, buffer_list& b, boost::system::error_code& ec) {
  if (s.tls()) return false;
  std::array<iovec, 16> iov;
  const auto bufs = b.span();
  for (std::size_t i = 0; i < bufs.size(); ++i) iov[i] = {const_cast<void*>(bufs[i].data()), bufs[i].size()};
  msghdr msg{};
  msg.msg_iov = iov.data();
  msg.msg_iovlen = bufs.size();
  for (;;) {
    const auto n = sys::sendmsg(s.socket().native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      b.consume(static_cast<std::size_t>(n));
      return b.empty();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    ec.assign(errno, boost::system::system_category());
    return true;
  }
}

awaitable<std::tuple<boost::system::error_code, std::size_t>> read_more(io_deadline& c, link& s, asio::mutable_buffer b,
                                                                        std::optional<steady::duration> timeout) {
  if (tls_stream* tls = s.tls()) {
    // The SSL stream reads records itself (and answers at once from what it
    // has decrypted already); every read is progress for the deadline.
    if (timeout) c.expires_after(*timeout);
    auto r = co_await tls->async_read_some(b, nothrow);
    if (!std::get<0>(r) && timeout) c.expires_after(*timeout);
    co_return r;
  }
  for (;;) {
    const auto n = sys::recv(s.socket().native_handle(), b.data(), b.size(), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
      const boost::system::error_code ec = n > 0 ? boost::system::error_code{}
                                           : n == 0
                                               ? make_error_code(asio::error::eof)
                                               : boost::system::error_code(errno, boost::system::system_category());
      // Progress: the deadline starts again (a request head keeps its one deadline).
      if (timeout) c.expires_after(*timeout);
      else c.expired = false;
      if (++c.reads_at_once == k_reads_per_turn) {
        c.reads_at_once = 0;
        co_await asio::post(s.get_executor(), asio::use_awaitable_t<executor_t>{});
        if (c.expired) co_return std::tuple{make_error_code(asio::error::operation_aborted), std::size_t{0}};
      }
      co_return std::tuple{ec, n > 0 ? static_cast<std::size_t>(n) : std::size_t{0}};
    }
    c.reads_at_once = 0;
    if (timeout) c.expires_after(*timeout);
    // Nothing now, so no end of stream is pending either: the reactor's next
    // readiness event is sure to come (and unlike async_wait this re-arms
    // nothing in epoll).
    co_return co_await s.socket().async_read_some(drain_buffer(b), nothrow);
  }
}

awaitable<connection_next> respond(connection& c, unsigned version, unsigned status, std::string_view body,
                                   bool keep_alive, std::int64_t retry_after_s) {
  c.out.clear();
  http1::write_simple_response(c.out, version, status, body, keep_alive, retry_after_s, c.response_fields);
  buffer_list b;
  b.add(c.out.data(), c.out.size());
  boost::system::error_code ec;
  if (!send_now(c.client, b, ec)) ec = std::get<0>(co_await write(c, c.client, b, k_respond_timeout));
  co_return goes_on_if(!ec && keep_alive);
}

// Closing with unread bytes would reset the connection, and a reset can
// destroy the answer before the client reads it. So: end our side, then read
// and discard what comes for at most k_linger (as nginx's lingering close).
awaitable<connection_next> refuse(connection& c, unsigned version, unsigned status, std::string_view body) {
  co_await respond(c, version, status, body, false);
  boost::system::error_code ignored;
  c.client.socket().shutdown(tcp::socket::shutdown_send, ignored);
  // What is read is dropped: into the (no longer needed) head buffer, not a frame of 4 KiB.
  c.in.clear();
  const auto sink = c.in.prepare(std::max<std::size_t>(c.in.capacity(), k_head_read));
  const auto until = c.clk.steady_now() + k_linger;
  for (std::size_t total = 0; total < k_linger_bytes && c.clk.steady_now() < until;) {
    auto [ec, n] = co_await read_more(c, c.client, sink, k_linger);
    if (ec) break;
    total += n;
  }
  co_return connection_next::ends;
}

namespace {

// The client closed (or reset) its connection, whatever it sent before:
// POLLRDHUP reports a FIN even behind unread data.
bool client_gone(connection& c) {
  pollfd p{c.client.socket().native_handle(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

}  // namespace

namespace {

// Past k_hold_buffer nothing more is read while held: looks for the client
// leaving every k_hold_poll until the hold ends (a rare case: its own frame
// and timer are made only then).
awaitable<hold_end> watch_for_leaving(connection& c) {
  steady_timer tick(c.client.get_executor());
  while (!c.released && steady::now() < c.hold_until) {
    tick.expires_at(std::min(steady::now() + k_hold_poll, c.hold_until));
    co_await tick.async_wait(nothrow);
    if (client_gone(c)) co_return hold_end::client_left;
  }
  co_return hold_end::released;
}

}  // namespace

// What is read while held goes to the tail of `early`, which is grown only
// for the read: a read buffer in this frame would cost every held request
// its size for the whole hold.
awaitable<hold_end> hold(connection& c, steady::duration wait) {
  if (wait <= steady::duration::zero()) co_return hold_end::released;
  c.released = false;
  c.hold_until = steady::now() + wait;
  c.rewatch();
  struct end_hold {
    connection& c;
    ~end_hold() {
      c.hold_until = steady::time_point::max();
      c.released = false;
    }
  } guard{c};
  for (;;) {
    if (c.released) co_return hold_end::released;
    if (c.early.size() >= k_hold_buffer) co_return co_await watch_for_leaving(c);
    const std::size_t at = c.early.size();
    const std::size_t room = std::min(k_hold_read, k_hold_buffer - at);
    if (tls_stream* tls = c.client.tls()) {
      // TLS: what arrives are records, read (decrypted) through the session.
      c.early.resize(at + room);
      const auto [ec, n] = co_await tls->async_read_some(asio::buffer(c.early.data() + at, room), nothrow);
      c.early.resize(at + n);
      if (c.released) co_return hold_end::released;
      if (ec) co_return hold_end::client_left;
      continue;
    }
    const auto [ec] = co_await c.client.socket().async_wait(tcp::socket::wait_read, nothrow);
    if (c.released) co_return hold_end::released;
    if (ec) co_return hold_end::client_left;
    // Readable: the client left, or sent more (a body, a pipelined request):
    // kept in `early` for forwarding, so that a FIN behind it shows.
    if (client_gone(c)) co_return hold_end::client_left;
    c.early.resize(at + room);
    const auto n = sys::recv(c.client.socket().native_handle(), c.early.data() + at, room, MSG_DONTWAIT);
    c.early.resize(at + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) co_return hold_end::client_left;
  }
}

}  // namespace smockron::proxy
