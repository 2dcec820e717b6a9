// smockron-proxy's HTTP path (Beast, C++20 coroutines): one coroutine per
// client connection reads a request head with a deadline, routes it,
// identifies the client, asks the gate, holds/rejects/forwards, and relays
// bodies in both directions through fixed buffers. Workers share nothing but
// the gate (sharded locks) and the immutable runtime configuration.
#include "proxy/server.hpp"

#include <sched.h>
#include <time.h>
#include <sys/socket.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>

#include <array>
#include <cstdio>
#include <condition_variable>
#include <list>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "proxy/accounting.hpp"
#include "proxy/control.hpp"
#include "proxy/drain_read.hpp"
#include "proxy/gate.hpp"
#include "proxy/identify.hpp"
#include "proxy/http1.hpp"
#include "proxy/routes.hpp"
#include "proxy/sys_io.hpp"
#include "smockron/admin_server.hpp"
#include "smockron/log.hpp"
#include "smockron/metrics.hpp"

namespace smockron::proxy {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using namespace asio::experimental::awaitable_operators;
// The concrete executor everywhere on the HTTP path: no type-erased
// any_io_executor copies per operation.
using executor_t = asio::io_context::executor_type;
template <class T>
using awaitable = asio::awaitable<T, executor_t>;
using tcp_socket = asio::basic_stream_socket<tcp, executor_t>;
using tcp_acceptor = asio::basic_socket_acceptor<tcp, executor_t>;
using steady_timer = asio::basic_waitable_timer<std::chrono::steady_clock, asio::wait_traits<std::chrono::steady_clock>, executor_t>;
constexpr auto nothrow = asio::as_tuple(asio::use_awaitable_t<executor_t>{});
using steady = std::chrono::steady_clock;

namespace {

enum class decision_label : std::uint8_t { accepted, delayed, rejected, unidentified };
constexpr std::array<std::string_view, 4> decision_names = {"accepted", "delayed", "rejected", "unidentified"};

}  // namespace

// Counters resolved once per configuration: nothing is looked up by name on the request path.
struct proxy_metrics {
  explicit proxy_metrics(metrics::registry& r)
      : reg(r),
        no_route(r.add_counter("smockron_proxy_no_route_total", "Requests that matched no route (404)")),
        bad_request(r.add_counter("smockron_proxy_bad_requests_total", "Requests refused as malformed (400) or with a body over max_body_bytes (413)")),
        header_too_large(r.add_counter("smockron_proxy_header_too_large_total", "Requests refused with 414 or 431")),
        header_timeout(r.add_counter("smockron_proxy_header_timeouts_total", "Clients that did not send a request head in time (408)")),
        client_gone_held(r.add_counter("smockron_proxy_held_client_disconnects_total",
                                       "Clients that disconnected while held (dropped, never forwarded)")),
        reject_too_long(r.add_counter("smockron_proxy_rejects_total", "Requests rejected with 503 by reason",
                                      metrics::labels({{"reason", "delay_too_long"}}))),
        reject_held_full(r.add_counter("smockron_proxy_rejects_total", "Requests rejected with 503 by reason",
                                       metrics::labels({{"reason", "held_full"}}))),
        reject_no_master(r.add_counter("smockron_proxy_rejects_total", "Requests rejected with 503 by reason",
                                       metrics::labels({{"reason", "no_master"}}))),
        upstream_connect(upstream_error("connect")),
        upstream_timeout(upstream_error("timeout")),
        upstream_reset(upstream_error("reset")),
        upstream_no_server(upstream_error("no_server")),
        accounting_sent(r.add_counter("smockron_proxy_accounting_messages_total", "Accounting messages published")),
        accounting_dropped(r.add_counter("smockron_proxy_accounting_dropped_total",
                                         "Accounting messages a master's full queue refused, or lost with its connection; "
                                         "the request still passed")),
        accounting_unsent(r.add_counter("smockron_proxy_accounting_unsent_total",
                                        "Accounting messages no connected master was subscribed to (master down or "
                                        "just reconnected); the request still passed")),
        accounting_lost(r.add_counter("smockron_proxy_accounting_lost_total",
                                      "Accounting messages queued for a master whose connection broke before they "
                                      "were written (once per master)")),
        delay_seconds(r.add_histogram("smockron_proxy_delay_seconds", "How long held requests were delayed",
                                      {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})) {}

  metrics::counter& upstream_error(std::string_view kind) {
    return reg.add_counter("smockron_proxy_upstream_errors_total", "Upstream failures by kind",
                           metrics::labels({{"kind", kind}}));
  }
  metrics::counter& decision(const std::string& domain, decision_label d) {
    return reg.add_counter("smockron_proxy_requests_total", "Requests by domain and gate decision",
                           metrics::labels({{"domain", domain}, {"decision", decision_names[static_cast<int>(d)]}}));
  }

  metrics::registry& reg;
  metrics::counter &no_route, &bad_request, &header_too_large, &header_timeout, &client_gone_held, &reject_too_long,
      &reject_held_full, &reject_no_master, &upstream_connect, &upstream_timeout, &upstream_reset, &upstream_no_server, &accounting_sent,
      &accounting_dropped, &accounting_unsent, &accounting_lost;
  metrics::histogram& delay_seconds;
};

// Everything a request needs from the configuration, immutable once built.
struct runtime {
  config::proxy_config cfg;
  route_table routes;
  std::vector<std::uint32_t> gate_domain;               // per routes.domains() index
  std::vector<std::array<metrics::counter*, 4>> counts;  // per domain index, by decision_label
  std::vector<std::vector<tcp::endpoint>> servers;       // per upstream, per server (resolved once)
  std::unique_ptr<jwt_verifier> jwt;
  gate_limits limits;
  steady::duration tick{};  // the connection watchdog's period (see connection)
  std::uint64_t generation = 0;

  runtime(const config::proxy_config& c, domain_registry& domains, proxy_metrics& m, std::uint64_t gen)
      : cfg(c), routes(c), generation(gen) {
    for (const auto& d : routes.domains()) {
      gate_domain.push_back(domains.id(d));
      std::array<metrics::counter*, 4> row{};
      for (int i = 0; i < 4; ++i) row[static_cast<std::size_t>(i)] = &m.decision(d, static_cast<decision_label>(i));
      counts.push_back(row);
    }
    for (const auto& u : cfg.upstreams) {
      std::vector<tcp::endpoint> eps;
      for (const auto& s : u.servers) {
        boost::system::error_code ec;
        auto addr = asio::ip::make_address(s.host, ec);
        if (ec) {
          // Hostnames are resolved once here (control plane), not per connection.
          asio::io_context tmp;
          tcp::resolver resolver(tmp);
          auto results = resolver.resolve(s.host, std::to_string(s.port), ec);
          if (ec || results.empty()) throw std::runtime_error("cannot resolve upstream server " + s.to_string());
          eps.push_back(results.begin()->endpoint());
        } else {
          eps.emplace_back(addr, s.port);
        }
      }
      servers.push_back(std::move(eps));
    }
    std::string error;
    jwt = jwt_verifier::create(cfg.jwt, error);
    if (!jwt) throw std::runtime_error("proxy.jwt: " + error);
    limits.max_delay_us = cfg.max_delay.count();
    limits.max_held = cfg.max_held;
    limits.pacing_fresh_us = cfg.control_fresh.count();
    // Half the shortest deadline any operation sets (respond() writes within 10 s, refuse() lingers 5 s).
    steady::duration t = std::chrono::seconds(10);
    for (const auto d : {cfg.header_timeout, cfg.idle_timeout, cfg.connect_timeout, cfg.upstream_timeout, cfg.body_timeout}) {
      t = std::min<steady::duration>(t, d);
    }
    tick = std::max<steady::duration>(t / 2, std::chrono::milliseconds(1));
  }
};

// Buffers of one write (a head, body bytes, chunk framing); what was sent
// is dropped from the front.
struct buffer_list {
  std::array<asio::const_buffer, 16> items;
  std::size_t first = 0, count = 0;
  void add(const void* p, std::size_t n) { items[count++] = asio::const_buffer(p, n); }
  bool full() const { return count + 3 > items.size(); }
  bool empty() const { return first == count; }
  void clear() { first = count = 0; }
  std::span<const asio::const_buffer> span() const { return {items.data() + first, count - first}; }
  void consume(std::size_t n) {
    for (; first < count && n >= items[first].size(); ++first) n -= items[first].size();
    if (first < count) items[first] += n;
  }
};

// Relays one message body: decides which received bytes belong to it and
// how they go out: as received, de-chunked (for an HTTP/1.0 client), or
// re-framed as chunked (a body the upstream delimits by closing, for an
// HTTP/1.1 client). Bytes past the end of the message are left alone.
struct body_relay {
  body_relay(http1::framing in, http1::framing out, std::uint64_t length, std::size_t max_line)
      : in_framing(in), dechunk(in == http1::framing::chunked && out != http1::framing::chunked),
        rechunk(in == http1::framing::until_close && out == http1::framing::chunked), remaining(length),
        dec(max_line), done(in == http1::framing::none) {}

  http1::framing in_framing;
  bool dechunk, rechunk;
  std::uint64_t remaining;
  http1::chunked_decoder dec;
  std::uint64_t data_bytes = 0;  // payload bytes so far
  bool eof = false;              // the upstream closed (until_close bodies end so)
  bool done;
  std::array<char, 24> size_line{};

  // Adds to `out` what to send for the received bytes `in`; returns how
  // many bytes of `in` that used, or nothing on malformed chunked framing.
  std::optional<std::size_t> step(std::string_view in, buffer_list& out) {
    using http1::framing;
    std::size_t n = 0;
    switch (in_framing) {
      case framing::none: break;
      case framing::length:
        n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining, in.size()));
        remaining -= n;
        data_bytes += n;
        done = remaining == 0;
        if (n > 0) out.add(in.data(), n);
        break;
      case framing::chunked:
        while (n < in.size() && !dec.done() && !out.full()) {
          std::string_view data;
          const auto used = dec.feed(in.substr(n), data);
          if (!used) return std::nullopt;
          if (dechunk && !data.empty()) out.add(data.data(), data.size());
          n += *used;
          data_bytes += data.size();
        }
        done = dec.done();
        if (!dechunk && n > 0) out.add(in.data(), n);
        break;
      case framing::until_close:
        n = in.size();
        data_bytes += n;
        if (rechunk && n > 0) {
          const auto len = std::snprintf(size_line.data(), size_line.size(), "%zx\r\n", n);
          out.add(size_line.data(), static_cast<std::size_t>(len));
          out.add(in.data(), n);
          out.add("\r\n", 2);
        } else if (n > 0) {
          out.add(in.data(), n);
        }
        if (rechunk && eof) out.add("0\r\n\r\n", 5);
        done = eof;
        break;
    }
    return n;
  }
};

// The upstream connection of the current request (cancelled with the client
// connection when a deadline passes).
struct upstream_conn {
  std::optional<tcp_socket> sock;
  std::size_t server = 0;
  bool reused = false;

  void use(tcp_socket s, std::size_t srv, bool was_pooled) {
    sock.emplace(std::move(s));
    server = srv;
    reused = was_pooled;
  }
  void release() { sock.reset(); }
};

// One client connection and what its requests reuse: buffers, the parsed
// heads, the upstream connection in use. Deadlines cost no timer operation:
// an operation sets `deadline`, and a watchdog timer, never further away than
// half the shortest timeout (`tick`), cancels the connection's sockets once
// the deadline has passed. Every deadline set later is further away than
// `tick`, so the timer always fires in time.
struct connection {
  connection(tcp_socket s, steady::duration t) : client(std::move(s)), timer(client.get_executor()), tick(t) {}

  tcp_socket client;
  upstream_conn up;  // in use by the current request
  beast::flat_buffer in, upstream_in;
  std::string out;  // the head being written
  http1::request_head request;
  http1::response_head response;
  // The body being relayed and the buffers of its next write: here rather
  // than in forward()'s coroutine frame, which every request allocates
  // (2,480 -> 1,520 bytes; still over the 1 KB Asio recycles).
  std::optional<body_relay> relay;
  buffer_list bufs;
  steady_timer timer;
  steady::time_point deadline = steady::time_point::max();
  steady::duration tick;
  bool expired = false;  // the last deadline passed (operations were cancelled)
  int reads_at_once = 0;  // read_more() results in a row without waiting
  bool idle = true;      // between requests (cancelled at once when draining)
  bool closed = false;

  // Set per operation: the coarse clock (a few ms resolution) is cheap
  // enough, and a deadline early by a few ms is no matter for timeouts of
  // seconds (tick leaves room for it).
  void expires_after(steady::duration d) {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    deadline = steady::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)) + d;
    expired = false;
  }
  void expires_never() {
    deadline = steady::time_point::max();
    expired = false;
  }
  /// An operation's error, as timed_out when the deadline cancelled it.
  boost::system::error_code classify(boost::system::error_code ec) const {
    return ec && expired ? make_error_code(asio::error::timed_out) : ec;
  }
  void close() {
    closed = true;
    timer.cancel();
  }
  static void watch(std::shared_ptr<connection> self) {
    connection& c = *self;
    const auto now = steady::now();
    if (c.deadline <= now) {
      c.expired = true;
      c.deadline = steady::time_point::max();
      boost::system::error_code ignored;
      c.client.cancel(ignored);
      if (c.up.sock) c.up.sock->cancel(ignored);
    }
    c.timer.expires_at(c.deadline - now < c.tick ? c.deadline : now + c.tick);
    c.timer.async_wait([self = std::move(self)](const boost::system::error_code&) mutable {
      if (!self->closed) watch(std::move(self));
    });
  }
};

// First read of a head: 1 KiB holds most request heads (as nginx's
// client_header_buffer_size); the buffer grows when one is larger. Per idle
// or held connection this is most of the memory it costs.
constexpr std::size_t k_head_read = 1024;
constexpr std::size_t k_relay_chunk = 16384;        // body relay: bytes per read
constexpr int k_reads_per_turn = 16;                // read_more(): reads without waiting before others get a turn
constexpr std::size_t k_max_response_head = 65536;  // an upstream's response head
constexpr auto k_linger = std::chrono::seconds(5);    // refuse(): reading what a refused client still sends (nginx's lingering_timeout)
constexpr std::size_t k_linger_bytes = 1 << 20;       // ... at most this much

// Sends what the socket takes now, without waiting, and drops it from `b`.
// Returns false when something is left to wait for; true when all went or
// the socket failed (`ec`).
bool send_now(tcp_socket& s, buffer_list& b, boost::system::error_code& ec) {
  std::array<iovec, 16> iov;
  const auto bufs = b.span();
  for (std::size_t i = 0; i < bufs.size(); ++i) iov[i] = {const_cast<void*>(bufs[i].data()), bufs[i].size()};
  msghdr msg{};
  msg.msg_iov = iov.data();
  msg.msg_iovlen = bufs.size();
  for (;;) {
    const auto n = sys::sendmsg(s.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
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

struct worker {
  // Declared before ioc, so destroyed after it: sessions still suspended at
  // shutdown are destroyed with the io_context and unregister themselves.
  std::set<connection*> sessions;
  // Sockets are only touched from this worker's thread: the reactor needs no locking.
  asio::io_context ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  std::optional<tcp_acceptor> acceptor;
  std::unique_ptr<accounting_publisher> accounting;
  std::shared_ptr<const runtime> rt;
  // Upstream pool: per upstream, per server: idle keep-alive connections and passive health.
  struct server_slot {
    std::vector<tcp_socket> idle;
    steady::time_point down_until{};
  };
  std::vector<std::vector<server_slot>> pool;
  std::vector<std::size_t> round_robin;
  std::uint64_t pool_generation = ~0ULL;
  std::minstd_rand sample_rng{std::random_device{}()};
  asio::steady_timer flush_timer{ioc};
  std::thread thread;
};

struct server::impl {
  impl(const config::proxy_config& cfg, const clock& clk)
      : clock_(clk), metrics_(registry_), gate_(static_cast<std::size_t>(cfg.max_control_entries), std::random_device{}() / (std::random_device::max() + 1.0)), control_ctx_(1), log_(log::get("proxy")),
        access_log_(log::get("proxy.access")) {
    auto first = std::make_shared<const runtime>(cfg, domains_, metrics_, 0);
    runtime_ = first;
    registry_.add_callback("smockron_proxy_held_requests", "Requests currently held", "",
                           [this] { return static_cast<double>(gate_.held()); });
    registry_.add_callback("smockron_proxy_control_entries", "Entries in the control memory", "",
                           [this] { return static_cast<double>(gate_.entries()); });
    registry_.add_callback("smockron_proxy_control_dropped_updates",
                           "DELAY_UNTIL updates dropped because the control memory was full (those keys fail open)", "",
                           [this] { return static_cast<double>(gate_.dropped_updates()); });
    registry_.add_callback("smockron_proxy_open_connections", "Open client connections", "",
                           [this] { return static_cast<double>(connections_.load()); });
    const std::size_t threads = cfg.threads > 0 ? static_cast<std::size_t>(cfg.threads)
                                                : std::max(1u, std::thread::hardware_concurrency());
    const tcp::endpoint listen(asio::ip::make_address(cfg.listen.host), cfg.listen.port);
    std::uint16_t port = cfg.listen.port;
    for (std::size_t i = 0; i < threads; ++i) {
      auto w = std::make_unique<worker>();
      w->rt = first;
      w->accounting = std::make_unique<accounting_publisher>(
          w->ioc, cfg.accounting, static_cast<std::size_t>(cfg.accounting_hwm),
          accounting_publisher::counters{metrics_.accounting_sent, metrics_.accounting_dropped, metrics_.accounting_unsent,
                                         metrics_.accounting_lost});
      // One acceptor per worker on the same port (SO_REUSEPORT): the kernel spreads connections.
      w->acceptor.emplace(w->ioc.get_executor());
      const tcp::endpoint ep(listen.address(), port);
      w->acceptor->open(ep.protocol());
      w->acceptor->set_option(asio::socket_base::reuse_address(true));
      int one = 1;
      ::setsockopt(w->acceptor->native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
      w->acceptor->bind(ep);
      w->acceptor->listen(asio::socket_base::max_listen_connections);
      port = w->acceptor->local_endpoint().port();
      workers_.push_back(std::move(w));
    }
    port_ = port;
    control_ = std::make_unique<control_subscriber>(control_ctx_, cfg.control, gate_, domains_, clock_, registry_);
    control_->set_domains(first->routes.domains());
    admin_ = std::make_unique<admin_server>(admin_ioc_, cfg.admin, [this](std::string_view path) { return admin(path); });
  }

  admin_server::response admin(std::string_view path) {
    if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", registry_.render()};
    if (path == "/livez") return {200, "text/plain", "ok\n"};
    if (path == "/readyz") {
      if (draining_) return {503, "text/plain", "draining\n"};
      const int up = control_->connected(), all = control_->endpoints();
      std::string body = "ready\nmasters connected: " + std::to_string(up) + "/" + std::to_string(all) + "\n";
      if (up == 0) {
        body += current()->cfg.fail_closed ? "no master reachable: requests are refused with 503 (fail_closed)\n"
                                           : "no master reachable: every request passes (fail-open)\n";
      }
      return {200, "text/plain", body};
    }
    return {404, "text/plain", "not found (try /metrics, /livez, /readyz)\n"};
  }

  std::shared_ptr<const runtime> current() {
    std::lock_guard lock(runtime_mutex_);
    return runtime_;
  }

  // ---- per request -------------------------------------------------------

  void publish(worker& w, const runtime& rt, const route& r, wire::status st, std::string_view id, std::int64_t now_ms,
               std::int64_t delayed_ms) {
    if (st == wire::status::rejected && rt.cfg.rejected_sample < 1.0) {
      if (std::uniform_real_distribution<double>(0, 1)(w.sample_rng) >= rt.cfg.rejected_sample) return;
    }
    wire::accounting m;
    m.domain = r.domain;
    m.state = st;
    m.identifier = id;
    m.received_ms = now_ms;
    m.delayed_ms = delayed_ms;
    const bool first = w.accounting->publish(m);
    if (st == wire::status::delayed) {
      // A reservation goes out at once: other gatekeepers learn of it one
      // round trip later, and every millisecond of that round trip is a
      // window in which two of them can reserve the same instant.
      w.accounting->flush();
    } else if (first) {
      // First message of a batch: the batch leaves within accounting_flush.
      w.flush_timer.expires_after(rt.cfg.accounting_flush);
      w.flush_timer.async_wait([&w](const boost::system::error_code& ec) {
        // Re-arming cancels a wait: that batch already left with an immediate flush.
        if (ec != asio::error::operation_aborted) w.accounting->flush();
      });
    }
  }

  // ---- I/O helpers ---------------------------------------------------------
  // Writes go out at once when the socket takes them (nearly always: a head
  // and a small body), so the coroutine carries on without a trip through the
  // scheduler, as nginx writes; only what the socket did not take waits.
  // Reads are of two kinds (drain_read.hpp): the first read of a message head
  // waits for readiness when the last read drained the socket; every other
  // read tries at once, so an end of stream is never missed.

  static auto write(connection& c, tcp_socket& s, const buffer_list& b, steady::duration timeout) {
    c.expires_after(timeout);
    return asio::async_write(s, b.span(), nothrow);
  }
  template <class Buffer>
  static auto write(connection& c, tcp_socket& s, const Buffer& b, steady::duration timeout) {
    c.expires_after(timeout);
    return asio::async_write(s, b, nothrow);
  }
  // The first read of a request or response head (see drain_read.hpp).
  static auto read_first(connection& c, tcp_socket& s, asio::mutable_buffer b, steady::duration timeout) {
    c.expires_after(timeout);
    return s.async_read_some(drain_buffer(b), nothrow);
  }
  // Any other read: tries at once, waits for readiness only when the socket
  // has nothing now. `timeout`: the deadline from now (each read is
  // progress), or none to keep the one running (a request head has one
  // deadline for all of it). A result at once is never a timeout; after
  // k_reads_per_turn of them in a row the connection lets the others on its
  // worker have a turn, so a transfer between two fast peers cannot hold the
  // worker for its whole length.
  static awaitable<std::tuple<boost::system::error_code, std::size_t>> read_more(
      connection& c, tcp_socket& s, asio::mutable_buffer b, std::optional<steady::duration> timeout) {
    for (;;) {
      const auto n = sys::recv(s.native_handle(), b.data(), b.size(), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        const boost::system::error_code ec = n > 0    ? boost::system::error_code{}
                                             : n == 0 ? make_error_code(asio::error::eof)
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
      co_return co_await s.async_read_some(drain_buffer(b), nothrow);
    }
  }

  // Writes a small response generated by the proxy itself. Returns whether
  // the connection goes on.
  static awaitable<bool> respond(connection& c, unsigned version, unsigned status, std::string_view body, bool keep_alive,
                                 std::int64_t retry_after_s = 0) {
    c.out.clear();
    http1::write_simple_response(c.out, version, status, body, keep_alive, retry_after_s);
    buffer_list b;
    b.add(c.out.data(), c.out.size());
    boost::system::error_code ec;
    if (!send_now(c.client, b, ec)) ec = std::get<0>(co_await write(c, c.client, b, std::chrono::seconds(10)));
    co_return !ec && keep_alive;
  }

  // Answers a request the proxy refuses while the client may still be
  // sending (a head or body it will not read), then closes gracefully: closing
  // with unread bytes would reset the connection, and a reset can destroy the
  // answer before the client reads it. So: end our side, then read and
  // discard what comes for at most k_linger (as nginx's lingering close).
  static awaitable<bool> refuse(connection& c, unsigned version, unsigned status, std::string_view body) {
    co_await respond(c, version, status, body, false);
    boost::system::error_code ignored;
    c.client.shutdown(tcp::socket::shutdown_send, ignored);
    std::array<char, 4096> sink;
    const auto until = steady::now() + k_linger;
    for (std::size_t total = 0; total < k_linger_bytes && steady::now() < until;) {
      auto [ec, n] = co_await read_more(c, c.client, asio::buffer(sink), k_linger);
      if (ec) break;
      total += n;
    }
    co_return false;
  }

  // Holds until `release` (steady time) unless the client goes away first.
  static awaitable<bool> hold(connection& c, steady::time_point release) {
    steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_at(release);
    auto first = co_await (timer.async_wait(nothrow) || c.client.async_wait(tcp::socket::wait_read, nothrow));
    if (first.index() == 0) co_return true;
    // Readable: either the client closed (EOF/reset) or it sent more bytes
    // (body or a pipelined request), which stay queued for later.
    char ch;
    const auto n = ::recv(c.client.native_handle(), &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) co_return false;
    co_await timer.async_wait(nothrow);
    co_return true;
  }

  // After a 101 response: the response head to the client, then bytes both
  // ways until either side ends.
  static awaitable<void> tunnel(connection& c, const runtime& rt) {
    c.out.clear();
    http1::write_response_head(c.out, c.response, 11, http1::framing::none, true, true);
    if (auto [ec, n] = co_await write(c, c.client, asio::buffer(c.out), rt.cfg.upstream_timeout); ec) co_return;
    const auto idle = rt.cfg.idle_timeout;
    co_await (pump(c, c.client, *c.up.sock, c.in, idle) && pump(c, *c.up.sock, c.client, c.upstream_in, idle));
  }

  // Copies bytes one way until EOF or error (WebSocket and other upgraded
  // protocols); the connection's idle deadline covers both directions.
  static awaitable<void> pump(connection& c, tcp_socket& from, tcp_socket& to, beast::flat_buffer& pending,
                              steady::duration idle) {
    if (pending.size() > 0) {
      auto [ec, n] = co_await write(c, to, pending.data(), idle);
      if (ec) co_return;
      pending.consume(n);
    }
    std::array<char, 16384> buf;
    for (;;) {
      auto [ec, n] = co_await read_more(c, from, asio::buffer(buf), idle);
      if (ec) break;
      auto [wec, wn] = co_await write(c, to, asio::buffer(buf.data(), n), idle);
      (void)wn;
      if (wec) break;
    }
    boost::system::error_code ignored;
    to.shutdown(tcp::socket::shutdown_send, ignored);
  }

  // ---- upstream pool -------------------------------------------------------

  // The fast path of acquire(): the next server in the rotation is up and has
  // an idle connection.
  bool take_pooled(worker& w, const runtime& rt, connection& c, std::size_t upstream, bool check_idle) {
    upstream_conn& up = c.up;
    if (w.pool_generation != rt.generation) return false;
    auto& slots = w.pool[upstream];
    const std::size_t s = w.round_robin[upstream] % slots.size();
    auto& slot = slots[s];
    if (slot.idle.empty() || (slot.down_until != steady::time_point{} && slot.down_until > steady::now())) return false;
    if (check_idle && !still_open(slot.idle.back())) return false;  // acquire() drops it
    ++w.round_robin[upstream];
    up.use(std::move(slot.idle.back()), s, true);
    slot.idle.pop_back();
    return true;
  }

  // An idle pooled connection the upstream has neither closed nor written to.
  static bool still_open(tcp_socket& sock) {
    char ch;
    const auto n = ::recv(sock.native_handle(), &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

  // Puts a connection into `c.up`: reused from the pool or newly connected
  // (round-robin, passive health). `check_idle`: make sure a pooled
  // connection is still open before using it (worth a syscall only when the
  // request could not be resent). Returns false when no server answered.
  awaitable<bool> acquire(worker& w, const runtime& rt, connection& c, std::size_t upstream, bool allow_reuse,
                          bool check_idle) {
    upstream_conn& up = c.up;
    if (w.pool_generation != rt.generation) {
      w.pool.clear();
      w.pool.resize(rt.servers.size());
      for (std::size_t u = 0; u < rt.servers.size(); ++u) w.pool[u].resize(rt.servers[u].size());
      w.round_robin.assign(rt.servers.size(), 0);
      w.pool_generation = rt.generation;
    }
    auto& slots = w.pool[upstream];
    const auto& cfg = rt.cfg.upstreams[upstream];
    const auto now = steady::now();
    up.release();
    for (std::size_t attempt = 0; attempt < slots.size(); ++attempt) {
      const std::size_t s = w.round_robin[upstream]++ % slots.size();
      auto& slot = slots[s];
      if (slot.down_until > now && attempt + 1 < slots.size()) continue;  // skip a down server unless it is the last chance
      while (allow_reuse && !slot.idle.empty()) {
        tcp_socket sock = std::move(slot.idle.back());
        slot.idle.pop_back();
        if (check_idle && !still_open(sock)) continue;
        up.use(std::move(sock), s, true);
        co_return true;
      }
      up.use(tcp_socket(w.ioc.get_executor()), s, false);
      c.expires_after(rt.cfg.connect_timeout);
      auto [ec] = co_await up.sock->async_connect(rt.servers[upstream][s], nothrow);
      if (ec) {
        (c.expired ? metrics_.upstream_timeout : metrics_.upstream_connect).inc();
        slot.down_until = steady::now() + cfg.fail_timeout;
        up.release();
        continue;
      }
      up.sock->set_option(tcp::no_delay(true), ec);
      slot.down_until = {};
      co_return true;
    }
    co_return false;
  }

  void give_back(worker& w, const runtime& rt, connection& c, std::size_t upstream) {
    upstream_conn& up = c.up;
    if (w.pool_generation == rt.generation && up.sock) {
      auto& slot = w.pool[upstream][up.server];
      if (static_cast<std::int64_t>(slot.idle.size()) < rt.cfg.upstreams[upstream].keepalive) {
        slot.idle.push_back(std::move(*up.sock));
      }
    }
    up.release();
  }

  // ---- bodies --------------------------------------------------------------

  static std::string_view view(const beast::flat_buffer& b) {
    return {static_cast<const char*>(b.data().data()), b.size()};
  }

  // ---- one request ---------------------------------------------------------

  static bool idempotent(std::string_view m) {
    return m == "GET" || m == "HEAD" || m == "OPTIONS" || m == "PUT" || m == "DELETE" || m == "TRACE";
  }

  // Forwards an admitted request and relays the response. Returns whether the
  // client connection may be kept alive.
  awaitable<bool> forward(worker& w, const runtime& rt, const route& r, connection& c, http1::request_head& req,
                          std::string_view client_ip) {
    const unsigned version = req.version;
    const bool has_body = req.body != http1::framing::none;
    // A request that may have reached a pooled connection's server is resent
    // only when that is harmless: no body (nothing consumed) and an idempotent
    // method (RFC 9110 9.2.2: a proxy must not retry POST, PATCH, ...).
    const bool retryable = !has_body && idempotent(req.method);
    if (req.expect_continue && has_body && version >= 11) {
      // The proxy answers 100-continue itself, once the gate has admitted the request.
      static constexpr std::string_view k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
      auto [ec, n] = co_await write(c, c.client, asio::buffer(k_continue), rt.cfg.body_timeout);
      if (ec) co_return false;
    }
    c.out.clear();
    http1::write_request_head(c.out, req, {client_ip, "http", req.upgrade});
    c.in.consume(req.size);  // the head: what follows is body (or the next request)

    upstream_conn& up = c.up;
    struct release_guard {
      upstream_conn& up;
      ~release_guard() { up.release(); }
    } guard{up};
    http1::response_head& res = c.response;
    // A pooled connection may have been closed by the upstream just now: a
    // retryable request is retried once on a fresh connection.
    for (int attempt = 0;; ++attempt) {
      // A request that could not be resent makes sure a pooled connection is still open.
      if (!(attempt == 0 && take_pooled(w, rt, c, r.upstream_index, !retryable)) &&
          !co_await acquire(w, rt, c, r.upstream_index, attempt == 0, !retryable)) {
        metrics_.upstream_no_server.inc();
        co_return co_await respond(c, version, 502, "upstream unavailable\n", false);
      }
      // The head and the body bytes at hand share one write; the rest of the
      // body is streamed from the client through c.in (bytes past its end
      // stay there: a pipelined request).
      body_relay& body = c.relay.emplace(req.body, req.body, req.content_length, static_cast<std::size_t>(rt.cfg.max_header_bytes));
      buffer_list& bufs = c.bufs;
      bufs.clear();
      bufs.add(c.out.data(), c.out.size());
      bool upstream_failed = false;
      for (;;) {
        const auto used = body.step(view(c.in), bufs);
        // Refused mid-body: the upstream got part of it and its connection is
        // dropped with `up`; the client hears why, then the connection closes.
        if (!used) {
          metrics_.bad_request.inc();
          co_return co_await refuse(c, version, 400, "bad request: " + std::string(body.dec.error()) + "\n");
        }
        if (rt.cfg.max_body_bytes > 0 && body.data_bytes > rt.cfg.max_body_bytes) {
          metrics_.bad_request.inc();
          co_return co_await refuse(c, version, 413, "request body too large\n");
        }
        if (!bufs.empty()) {
          boost::system::error_code ec;
          if (!send_now(*up.sock, bufs, ec)) ec = std::get<0>(co_await write(c, *up.sock, bufs, rt.cfg.upstream_timeout));
          if (ec) {
            upstream_failed = true;
            break;
          }
        }
        c.in.consume(*used);
        bufs.clear();
        if (body.done) break;
        if (c.in.size() > 0) continue;
        auto [ec, n] = co_await read_more(c, c.client, c.in.prepare(k_relay_chunk), rt.cfg.body_timeout);
        if (ec) co_return false;  // the client failed mid-body: nothing sensible to answer
        c.in.commit(n);
      }
      if (upstream_failed) {
        if (up.reused && retryable && attempt == 0) continue;
        metrics_.upstream_reset.inc();
        co_return co_await respond(c, version, 502, "upstream write failed\n", false);
      }
      // The response head, skipping or passing on 1xx informational responses (but not 101).
      c.upstream_in.clear();
      boost::system::error_code ec;
      bool bad_head = false, interim = false, first_read = true;
      for (std::size_t scanned = 0;;) {
        const auto parsed = http1::parse_response(view(c.upstream_in), k_max_response_head, req.head, res, scanned);
        if (parsed.status == http1::parse_status::complete) {
          if (res.status >= 200 || res.status == 101) break;
          interim = true;  // a response has begun: no retry after this
          if (version >= 11) {  // never to an HTTP/1.0 client (RFC 9110 15.2)
            c.out.clear();
            http1::write_response_head(c.out, res, 11, http1::framing::none, true, false);
            auto [wec, wn] = co_await write(c, c.client, asio::buffer(c.out), rt.cfg.upstream_timeout);
            if (wec) co_return false;
          }
          c.upstream_in.consume(res.size);
          scanned = 0;
          continue;
        }
        if (parsed.status != http1::parse_status::incomplete) {
          bad_head = true;
          break;
        }
        // The answer to a request just sent is rarely there yet: its first
        // read waits for readiness instead of trying a recv() that fails.
        const auto into = c.upstream_in.prepare(k_head_read);
        auto [rec, n] = first_read ? co_await read_first(c, *up.sock, into, rt.cfg.upstream_timeout)
                                   : co_await read_more(c, *up.sock, into, rt.cfg.upstream_timeout);
        first_read = false;
        if (rec) {
          ec = c.classify(rec);
          break;
        }
        c.upstream_in.commit(n);
      }
      if (ec || bad_head) {
        const bool nothing = c.upstream_in.size() == 0;
        if (nothing && !interim && up.reused && retryable && attempt == 0 &&
            (ec == asio::error::eof || ec == asio::error::connection_reset)) {
          continue;
        }
        if (ec == asio::error::timed_out) {
          metrics_.upstream_timeout.inc();
          co_return co_await respond(c, version, 504, "upstream timed out\n", false);
        }
        metrics_.upstream_reset.inc();
        co_return co_await respond(c, version, 502, bad_head ? "upstream sent a malformed response\n" : "upstream failed\n",
                                   false);
      }
      break;
    }
    c.upstream_in.consume(res.size);

    if (res.status == 101) {
      if (!req.upgrade) {
        metrics_.upstream_reset.inc();
        co_return co_await respond(c, version, 502, "upstream switched protocols unasked\n", false);
      }
      co_await tunnel(c, rt);
      co_return false;
    }

    using http1::framing;
    framing out = res.body;
    if (res.body == framing::until_close && version >= 11) out = framing::chunked;  // keep the client connection
    if (res.body == framing::chunked && version < 11) out = framing::until_close;   // HTTP/1.0 knows no chunks
    const bool keep = req.keep_alive && !draining_ && out != framing::until_close;
    c.out.clear();
    http1::write_response_head(c.out, res, version >= 11 ? 11 : 10, out, keep, false);
    body_relay& body = c.relay.emplace(res.body, out, res.content_length, static_cast<std::size_t>(rt.cfg.max_header_bytes));
    buffer_list& bufs = c.bufs;
    bufs.clear();
    bufs.add(c.out.data(), c.out.size());
    for (;;) {
      const auto used = body.step(view(c.upstream_in), bufs);
      if (!used) {
        metrics_.upstream_reset.inc();
        co_return false;  // malformed chunked framing; the response has started: closing is the only signal left
      }
      if (!bufs.empty()) {
        boost::system::error_code ec;
        if (!send_now(c.client, bufs, ec)) ec = std::get<0>(co_await write(c, c.client, bufs, rt.cfg.body_timeout));
        if (ec) co_return false;
      }
      c.upstream_in.consume(*used);
      bufs.clear();
      if (body.done) break;
      if (c.upstream_in.size() > 0) continue;  // more at hand than one write took
      auto [ec, n] = co_await read_more(c, *up.sock, c.upstream_in.prepare(k_relay_chunk), rt.cfg.upstream_timeout);
      if (ec == asio::error::eof && res.body == framing::until_close) {
        body.eof = true;
        continue;
      }
      if (ec) {
        (c.classify(ec) == asio::error::timed_out ? metrics_.upstream_timeout : metrics_.upstream_reset).inc();
        co_return false;  // the response has started: the only honest signal left is closing
      }
      c.upstream_in.commit(n);
    }
    if (res.keep_alive && c.upstream_in.size() == 0) give_back(w, rt, c, r.upstream_index);
    co_return keep;
  }

  awaitable<void> session(worker& w, tcp_socket socket) {
    auto conn = std::make_shared<connection>(std::move(socket), w.rt->tick);
    connection& c = *conn;
    ++connections_;
    struct guard {
      impl& s;
      worker& w;
      connection& c;
      ~guard() {
        w.sessions.erase(&c);
        c.close();
        --s.connections_;
      }
    };
    w.sessions.insert(&c);
    guard g{*this, w, c};
    connection::watch(conn);
    boost::system::error_code ignored;
    c.client.set_option(tcp::no_delay(true), ignored);
    const auto remote = c.client.remote_endpoint(ignored);
    ip_address peer;
    if (auto parsed = parse_ip(remote.address().to_string())) peer = *parsed;
    const std::string peer_text = format_ip(peer);
    http1::request_head& req = c.request;

    for (bool first = true;; first = false) {
      if (w.rt->generation != generation_.load(std::memory_order_acquire)) w.rt = current();
      // Between requests the connection is idle: closed after idle_timeout, or at once when draining.
      // On a new connection the header_timeout runs from the accept: one deadline for the whole head.
      bool head_deadline_running = false;
      if (c.in.size() == 0) {
        head_deadline_running = first;
        if (draining_) co_return;
        c.idle = true;
        auto [ec, n] = co_await read_first(c, c.client, c.in.prepare(k_head_read),
                                           first ? w.rt->cfg.header_timeout : w.rt->cfg.idle_timeout);
        if (ec) co_return;  // closed, or silent until the deadline
        c.in.commit(n);
        // A reload may have happened while this connection was idle.
        if (w.rt->generation != generation_.load(std::memory_order_acquire)) w.rt = current();
      }
      c.idle = false;
      const std::shared_ptr<const runtime> rt_hold = w.rt;
      const runtime& rt = *rt_hold;
      c.tick = rt.tick;

      // The request head, within max_header_bytes and header_timeout.
      if (!head_deadline_running) c.expires_after(rt.cfg.header_timeout);
      const auto limit = static_cast<std::size_t>(rt.cfg.max_header_bytes);
      http1::parse_result parsed;
      for (std::size_t scanned = 0;;) {
        parsed = http1::parse_request(view(c.in), limit, req, scanned);
        if (parsed.status != http1::parse_status::incomplete) break;
        auto [ec, n] = co_await read_more(c, c.client, c.in.prepare(std::min(std::max(k_head_read, c.in.size()), limit - c.in.size())),
                                          std::nullopt);
        if (ec) {
          if (c.expired) {
            metrics_.header_timeout.inc();
            co_await respond(c, 11, 408, "request head not received in time\n", false);
          }
          co_return;
        }
        c.in.commit(n);
      }
      switch (parsed.status) {
        case http1::parse_status::complete: break;
        case http1::parse_status::line_too_long:
          metrics_.header_too_large.inc();
          co_await refuse(c, 11, 414, "request line too long\n");
          co_return;
        case http1::parse_status::headers_too_large:
          metrics_.header_too_large.inc();
          co_await refuse(c, 11, 431, "request headers too large\n");
          co_return;
        default:
          metrics_.bad_request.inc();
          co_await refuse(c, 11, 400, "bad request: " + std::string(parsed.reason) + "\n");
          co_return;
      }
      const unsigned version = req.version;
      if (req.body == http1::framing::length && rt.cfg.max_body_bytes > 0 && req.content_length > rt.cfg.max_body_bytes) {
        metrics_.bad_request.inc();
        co_await refuse(c, version, 413, "request body too large\n");
        co_return;
      }
      const std::string_view target = req.target;
      // Unread body bytes would be parsed as the next request: close after answering instead.
      const bool can_answer_and_continue = req.keep_alive && req.body == http1::framing::none && !draining_;
      const route* r = rt.routes.match(req.host, target.substr(0, target.find('?')));
      if (!r) {
        metrics_.no_route.inc();
        if (!co_await respond(c, version, 404, "no route\n", can_answer_and_continue)) co_return;
        c.in.consume(req.size);
        continue;
      }
      const std::int64_t now_us = clock_.wall_us();
      const std::int64_t now_ms = now_us / 1000;
      const auto& counts = rt.counts[r->domain_index];
      identify_context ictx{&rt.cfg.trusted_proxies, rt.jwt.get(), now_us / 1'000'000};
      const auto who = identify(r->identify, req.headers, target, peer, ictx);
      // Behind trusted proxies the client may be further out than the peer.
      std::string forwarded_client;
      if (!rt.cfg.trusted_proxies.empty()) forwarded_client = format_ip(client_address(req.headers, peer, rt.cfg.trusted_proxies));
      const std::string_view client_ip = forwarded_client.empty() ? std::string_view(peer_text) : forwarded_client;
      // fail_closed: no master has published this domain's policy lately
      // (none reachable, or none owns the domain): refuse rather than pass.
      if (rt.cfg.fail_closed && !gate_.covered(rt.gate_domain[r->domain_index], now_us)) {
        counts[static_cast<int>(decision_label::rejected)]->inc();
        metrics_.reject_no_master.inc();
        if (rt.cfg.access_log) {
          log_access(peer, std::string(req.method) + " " + std::string(req.target), 503, "rejected", who ? &*who : nullptr, 0);
        }
        if (!co_await respond(c, version, 503, "no rate-limit master covers this route, retry later\n",
                              can_answer_and_continue, 1)) {
          co_return;
        }
        c.in.consume(req.size);
        continue;
      }
      gate_decision d;
      if (who) d = gate_.decide(rt.gate_domain[r->domain_index], who->value, now_us, rt.limits);
      if (!who) {
        counts[static_cast<int>(decision_label::unidentified)]->inc();
      } else if (d.v == verdict::reject) {
        counts[static_cast<int>(decision_label::rejected)]->inc();
        (d.reason == reject_reason::delay_too_long ? metrics_.reject_too_long : metrics_.reject_held_full).inc();
        publish(w, rt, *r, wire::status::rejected, who->value, now_ms, 0);
        if (rt.cfg.access_log) log_access(peer, std::string(req.method) + " " + std::string(req.target), 503, "rejected", &*who, 0);
        if (!co_await respond(c, version, 503, "rate limit exceeded, retry later\n", can_answer_and_continue, d.retry_after_s)) {
          co_return;
        }
        c.in.consume(req.size);
        continue;
      } else if (d.v == verdict::delay) {
        counts[static_cast<int>(decision_label::delayed)]->inc();
        // Reported when the hold starts, with the time it will be forwarded:
        // the master then knows every gatekeeper's reservations within a round
        // trip, which is what holds one limit across gatekeepers. A prepaid
        // slot (given back by a held client that left) was reported already.
        if (!d.prepaid) publish(w, rt, *r, wire::status::delayed, who->value, now_ms, (d.release_us + 999) / 1000);
        metrics_.delay_seconds.observe(static_cast<double>(d.release_us - now_us) / 1e6);
        c.expires_never();
        const bool stayed = co_await hold(c, steady::now() + std::chrono::microseconds(d.release_us - clock_.wall_us()));
        gate_.release_held();
        if (!stayed) {
          metrics_.client_gone_held.inc();
          gate_.cancel(rt.gate_domain[r->domain_index], who->value, d, clock_.wall_us());
          co_return;
        }
      } else {
        counts[static_cast<int>(decision_label::accepted)]->inc();
        publish(w, rt, *r, wire::status::accepted, who->value, now_ms, 0);
      }
      // The head's views do not outlive forwarding (the buffer is reused): what the log needs is copied.
      std::string logged_request;
      if (rt.cfg.access_log) logged_request.append(req.method).append(" ").append(req.target);
      const auto started = rt.cfg.access_log ? steady::now() : steady::time_point{};
      const bool keep = co_await forward(w, rt, *r, c, req, client_ip);
      if (rt.cfg.access_log) {
        log_access(peer, logged_request, 0, d.v == verdict::delay ? "delayed" : who ? "accepted" : "unidentified",
                   who ? &*who : nullptr, std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - started).count());
      }
      if (!keep) co_return;
    }
  }

  void log_access(const ip_address& peer, std::string_view request, unsigned status, std::string_view decision,
                  const identity* who, std::int64_t upstream_ms) {
    access_log_->info("{} \"{}\" status={} decision={} source={} upstream_ms={}", format_ip(peer), request,
                      status ? std::to_string(status) : std::string("-"), decision,
                      who && who->source ? config::to_string(*who->source) : std::string("-"), upstream_ms);
  }

  awaitable<void> accept_loop(worker& w) {
    for (;;) {
      auto [ec, socket] = co_await w.acceptor->async_accept(nothrow);
      if (ec == asio::error::operation_aborted || !w.acceptor->is_open()) co_return;
      if (ec) {
        // EMFILE and friends: back off briefly instead of spinning.
        steady_timer t(w.ioc.get_executor(), std::chrono::milliseconds(50));
        co_await t.async_wait(nothrow);
        continue;
      }
      asio::co_spawn(w.ioc.get_executor(), session(w, std::move(socket)), asio::detached);
    }
  }

  void run() {
    for (auto& w : workers_) {
      asio::co_spawn(w->ioc.get_executor(), accept_loop(*w), asio::detached);
      w->thread = std::thread([&ioc = w->ioc] {
        auto guard = asio::make_work_guard(ioc);
        ioc.run();
      });
    }
    std::thread admin_thread([this] {
      auto guard = asio::make_work_guard(admin_ioc_);
      admin_ioc_.run();
    });
    log_->info("smockron-proxy listening on {} ({} worker threads), admin {}", current()->cfg.listen.host + ":" + std::to_string(port_),
               workers_.size(), current()->cfg.admin.to_string());
    {
      std::unique_lock lock(stop_mutex_);
      stop_cv_.wait(lock, [this] { return stop_requested_; });
    }
    // Stop accepting, close idle keep-alive connections, let in-flight and held requests finish.
    draining_ = true;
    for (auto& w : workers_) {
      asio::post(w->ioc, [&w = *w] {
        beast::error_code ignored;
        w.acceptor->close(ignored);
        for (auto* c : w.sessions) {
          if (c->idle) c->client.cancel(ignored);
        }
      });
    }
    const auto deadline = steady::now() + current()->cfg.grace_period;
    while (connections_.load() > 0 && steady::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (connections_.load() > 0) log_->warn("grace period over: closing {} connection(s)", connections_.load());
    // Nothing accepted is lost: the last batches are written before the
    // workers stop (at most 1 s; a master that does not read gets less).
    const auto drain_until = steady::now() + std::chrono::seconds(1);
    for (;;) {
      struct pass {
        std::atomic<std::size_t> answered{0}, busy{0};
      };
      auto p = std::make_shared<pass>();  // outlives a pass cut short by the deadline
      for (auto& w : workers_) {
        asio::post(w->ioc, [&w = *w, p] {
          w.accounting->flush();
          if (!w.accounting->idle()) ++p->busy;
          ++p->answered;
        });
      }
      while (p->answered.load() < workers_.size() && steady::now() < drain_until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if ((p->answered.load() == workers_.size() && p->busy.load() == 0) || steady::now() >= drain_until) break;
    }
    for (auto& w : workers_) w->ioc.stop();
    for (auto& w : workers_) w->thread.join();
    admin_->stop();
    admin_ioc_.stop();
    admin_thread.join();
    control_.reset();
    log_->info("stopped");
  }

  void stop() {
    std::lock_guard lock(stop_mutex_);
    stop_requested_ = true;
    stop_cv_.notify_all();
  }

  void reload(const config::proxy_config& next) {
    const auto old = current();
    if (next.listen != old->cfg.listen || next.admin != old->cfg.admin || next.threads != old->cfg.threads ||
        next.accounting != old->cfg.accounting || next.control != old->cfg.control ||
        next.max_control_entries != old->cfg.max_control_entries) {
      log_->warn("reload: listen, admin, threads, master endpoints and max_control_entries change only after a restart");
    }
    std::shared_ptr<const runtime> fresh;
    try {
      fresh = std::make_shared<const runtime>(next, domains_, metrics_, old->generation + 1);
    } catch (const std::exception& e) {
      log_->error("reload rejected: {}", e.what());
      return;
    }
    control_->set_domains(fresh->routes.domains());
    {
      std::lock_guard lock(runtime_mutex_);
      runtime_ = fresh;
    }
    generation_.store(fresh->generation, std::memory_order_release);
    log_->info("configuration reloaded: {} route(s), {} upstream(s)", fresh->routes.routes().size(), next.upstreams.size());
  }

  const clock& clock_;
  metrics::registry registry_;
  proxy_metrics metrics_;
  gate gate_;
  domain_registry domains_;
  // Accounting and control have a ZeroMQ context (and I/O thread) each: see accounting_context().
  zmq::context_t control_ctx_;
  std::shared_ptr<spdlog::logger> log_, access_log_;
  std::mutex runtime_mutex_;
  std::shared_ptr<const runtime> runtime_;
  std::atomic<std::uint64_t> generation_{0};
  std::vector<std::unique_ptr<worker>> workers_;
  std::unique_ptr<control_subscriber> control_;
  asio::io_context admin_ioc_{1};
  std::unique_ptr<admin_server> admin_;
  std::uint16_t port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<int> connections_{0};
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
};

server::server(const config::proxy_config& cfg, const clock& clk) : impl_(std::make_unique<impl>(cfg, clk)) {}
server::~server() = default;
void server::run() { impl_->run(); }
void server::stop() { impl_->stop(); }
void server::reload(const config::proxy_config& next) { impl_->reload(next); }
std::uint16_t server::port() const { return impl_->port_; }
std::uint16_t server::admin_port() const { return impl_->admin_->port(); }

}  // namespace smockron::proxy
