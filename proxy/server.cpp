// smockron-proxy's HTTP path (Beast, C++20 coroutines): one coroutine per
// client connection reads a request head with a deadline, routes it,
// identifies the client, asks the gate, holds/rejects/forwards, and relays
// bodies in both directions through fixed buffers. Workers share nothing but
// the gate (sharded locks) and the immutable runtime configuration.
#include "proxy/server.hpp"

#include <sched.h>
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
#include <boost/beast/http.hpp>

#include <array>
#include <condition_variable>
#include <list>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "proxy/control.hpp"
#include "proxy/gate.hpp"
#include "proxy/identify.hpp"
#include "proxy/rewrite.hpp"
#include "proxy/routes.hpp"
#include "smockron/admin_server.hpp"
#include "smockron/log.hpp"
#include "smockron/metrics.hpp"

namespace smockron::proxy {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace asio::experimental::awaitable_operators;
// The concrete executor everywhere on the HTTP path: no type-erased
// any_io_executor copies per operation.
using executor_t = asio::io_context::executor_type;
template <class T>
using awaitable = asio::awaitable<T, executor_t>;
using tcp_stream = beast::basic_stream<tcp, executor_t>;
using tcp_socket = asio::basic_stream_socket<tcp, executor_t>;
using tcp_acceptor = asio::basic_socket_acceptor<tcp, executor_t>;
using steady_timer = asio::basic_waitable_timer<std::chrono::steady_clock, asio::wait_traits<std::chrono::steady_clock>, executor_t>;
constexpr auto nothrow = asio::as_tuple(asio::use_awaitable_t<executor_t>{});
using steady = std::chrono::steady_clock;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// True when the request asks for a protocol switch (WebSocket and friends).
template <class Fields>
bool is_upgrade(const http::header<true, Fields>& h) {
  if (h[http::field::upgrade].empty()) return false;
  for (auto it = h.find(http::field::connection); it != h.end() && it->name() == http::field::connection; ++it) {
    for (auto token : http::token_list{it->value()}) {
      if (iequals(token, "upgrade")) return true;
    }
  }
  return false;
}

enum class decision_label : std::uint8_t { accepted, delayed, rejected, unidentified };
constexpr std::array<std::string_view, 4> decision_names = {"accepted", "delayed", "rejected", "unidentified"};

}  // namespace

// Counters resolved once per configuration: nothing is looked up by name on the request path.
struct proxy_metrics {
  explicit proxy_metrics(metrics::registry& r)
      : reg(r),
        no_route(r.add_counter("smockron_proxy_no_route_total", "Requests that matched no route (404)")),
        bad_request(r.add_counter("smockron_proxy_bad_requests_total", "Requests refused as malformed (400)")),
        header_too_large(r.add_counter("smockron_proxy_header_too_large_total", "Requests refused with 414 or 431")),
        header_timeout(r.add_counter("smockron_proxy_header_timeouts_total", "Clients that did not send a request head in time (408)")),
        client_gone_held(r.add_counter("smockron_proxy_held_client_disconnects_total",
                                       "Clients that disconnected while held (dropped, never forwarded)")),
        reject_too_long(r.add_counter("smockron_proxy_rejects_total", "Requests rejected with 503 by reason",
                                      metrics::labels({{"reason", "delay_too_long"}}))),
        reject_held_full(r.add_counter("smockron_proxy_rejects_total", "Requests rejected with 503 by reason",
                                       metrics::labels({{"reason", "held_full"}}))),
        upstream_connect(upstream_error("connect")),
        upstream_timeout(upstream_error("timeout")),
        upstream_reset(upstream_error("reset")),
        upstream_no_server(upstream_error("no_server")),
        accounting_sent(r.add_counter("smockron_proxy_accounting_messages_total", "Accounting messages published")),
        accounting_dropped(r.add_counter("smockron_proxy_accounting_dropped_total",
                                         "Accounting messages dropped (send queue full); the request still passed")),
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
      &reject_held_full, &upstream_connect, &upstream_timeout, &upstream_reset, &upstream_no_server, &accounting_sent,
      &accounting_dropped;
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
  }
};

struct session_state {
  tcp_stream* client = nullptr;
  bool idle = true;
};

struct worker {
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
  std::set<session_state*> sessions;
  std::minstd_rand sample_rng{std::random_device{}()};
  asio::steady_timer flush_timer{ioc};
  std::thread thread;
};

struct server::impl {
  impl(const config::proxy_config& cfg, const clock& clk)
      : clock_(clk), metrics_(registry_), gate_(static_cast<std::size_t>(cfg.max_control_entries)), accounting_ctx_(accounting_context()), control_ctx_(1), log_(log::get("proxy")),
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
      w->accounting = std::make_unique<accounting_publisher>(accounting_ctx_, cfg.accounting, static_cast<int>(cfg.accounting_hwm),
                                                             metrics_.accounting_sent, metrics_.accounting_dropped);
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

  // The accounting I/O thread runs SCHED_BATCH: it never preempts a worker
  // when a message is queued, but drains the queue when the worker waits or
  // its time slice ends. Woken for every message instead, on a saturated
  // core it cost a context switch and a loopback send per request (a quarter
  // of the proxy's CPU). Same weight as any thread: it is never starved.
  static zmq::context_t accounting_context() {
    zmq::context_t ctx(1);
    if (zmq_ctx_set(ctx.handle(), ZMQ_THREAD_SCHED_POLICY, SCHED_BATCH) != 0) {
      log::get("proxy")->warn("accounting I/O thread: cannot set SCHED_BATCH ({})", zmq_strerror(zmq_errno()));
    }
    return ctx;
  }

  admin_server::response admin(std::string_view path) {
    if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", registry_.render()};
    if (path == "/livez") return {200, "text/plain", "ok\n"};
    if (path == "/readyz") {
      if (draining_) return {503, "text/plain", "draining\n"};
      const int up = control_->connected(), all = control_->endpoints();
      std::string body = "ready\nmasters connected: " + std::to_string(up) + "/" + std::to_string(all) + "\n";
      if (up == 0) body += "no master reachable: every request passes (fail-open)\n";
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
      // First message of a batch: hand the batch to ZeroMQ within a millisecond.
      w.flush_timer.expires_after(std::chrono::milliseconds(1));
      w.flush_timer.async_wait([&w](const boost::system::error_code&) { w.accounting->flush(); });
    }
  }

  // Writes a small response generated by the proxy itself.
  static awaitable<bool> respond(tcp_stream& client, unsigned version, http::status status, std::string body,
                                 bool keep_alive, std::int64_t retry_after_s = 0) {
    http::response<http::string_body> res{status, version};
    res.set(http::field::server, "smockron");
    res.set(http::field::content_type, "text/plain; charset=utf-8");
    if (retry_after_s > 0) res.set(http::field::retry_after, std::to_string(retry_after_s));
    res.keep_alive(keep_alive);
    if (!keep_alive) res.set(http::field::connection, "close");  // explicit even for HTTP/1.0
    res.body() = std::move(body);
    res.prepare_payload();
    client.expires_after(std::chrono::seconds(10));
    auto [ec, n] = co_await http::async_write(client, res, nothrow);
    (void)n;
    co_return !ec && keep_alive;
  }

  enum class head_status : std::uint8_t { ok, closed, timeout, line_too_long, headers_too_large, obs_fold };

  // Reads until the request head (up to the blank line) is in `buf`, within
  // `limit` bytes; the caller has set the deadline.
  static awaitable<head_status> read_head(tcp_stream& client, beast::flat_buffer& buf, std::uint64_t limit) {
    std::size_t scanned = 0;
    for (;;) {
      const std::string_view data(static_cast<const char*>(buf.data().data()), buf.size());
      const auto end = data.find("\r\n\r\n", scanned > 3 ? scanned - 3 : 0);
      if (end != std::string_view::npos && end + 4 <= limit) {
        const std::string_view head = data.substr(0, end + 2);
        // A header line starting with SP/HT continues the previous one (obs-fold, RFC 9112 5.2).
        if (head.find("\r\n ") != std::string_view::npos || head.find("\r\n\t") != std::string_view::npos) {
          // Leading blank lines before the request line are allowed; folding after it is not.
          const auto line_end = head.find("\r\n", head.find_first_not_of("\r\n"));
          const auto fold = std::min(head.find("\r\n ", line_end), head.find("\r\n\t", line_end));
          if (fold != std::string_view::npos) co_return head_status::obs_fold;
        }
        co_return head_status::ok;
      }
      if (data.size() >= limit || end != std::string_view::npos) {
        const auto line_end = data.find("\r\n");
        co_return line_end == std::string_view::npos || line_end >= limit ? head_status::line_too_long
                                                                           : head_status::headers_too_large;
      }
      scanned = data.size();
      auto [ec, n] = co_await client.async_read_some(buf.prepare(std::min<std::uint64_t>(std::max<std::size_t>(1024, data.size()), limit - data.size())), nothrow);
      if (ec == beast::error::timeout) co_return head_status::timeout;
      if (ec) co_return head_status::closed;
      buf.commit(n);
    }
  }

  // Holds until `release` (steady time) unless the client goes away first.
  static awaitable<bool> hold(tcp_stream& client, steady::time_point release) {
    steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_at(release);
    auto first = co_await (timer.async_wait(nothrow) || client.socket().async_wait(tcp::socket::wait_read, nothrow));
    if (first.index() == 0) co_return true;
    // Readable: either the client closed (EOF/reset) or it sent more bytes
    // (body or a pipelined request), which stay queued for later.
    char c;
    const auto n = ::recv(client.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) co_return false;
    co_await timer.async_wait(nothrow);
    co_return true;
  }

  // Relays one message (header + body) from `in` to `out` through the
  // session's fixed buffer. Returns {read error, write error}.
  template <bool isRequest>
  static awaitable<std::pair<beast::error_code, beast::error_code>> relay(tcp_stream& out, tcp_stream& in,
                                                                           beast::flat_buffer& in_buf,
                                                                           http::parser<isRequest, http::buffer_body>& p,
                                                                           std::span<char> chunk, steady::duration read_timeout,
                                                                           steady::duration write_timeout) {
    http::serializer<isRequest, http::buffer_body> sr{p.get()};
    // The header goes out on its own only when no body bytes are at hand yet
    // (e.g. a slow stream); otherwise header and first body bytes share one
    // write: one syscall and one packet for a small message.
    if (!p.is_done() && in_buf.size() == 0) {
      out.expires_after(write_timeout);
      if (auto [ec, n] = co_await http::async_write_header(out, sr, nothrow); ec) co_return std::pair{beast::error_code{}, ec};
    }
    for (;;) {
      if (!p.is_done()) {
        p.get().body().data = chunk.data();
        p.get().body().size = chunk.size();
        in.expires_after(read_timeout);
        auto [ec, n] = co_await http::async_read_some(in, in_buf, p, nothrow);
        if (ec == http::error::need_buffer) ec = {};
        if (ec) co_return std::pair{ec, beast::error_code{}};
        p.get().body().size = chunk.size() - p.get().body().size;
        p.get().body().more = !p.is_done();
        // No body bytes (only chunk framing was read): never hand the chunked
        // serializer a non-null empty buffer, it would write a 0-size chunk,
        // i.e. the terminator, in the middle of the body.
        if (p.get().body().size == 0) {
          if (!p.is_done()) continue;
          p.get().body().data = nullptr;
        } else {
          p.get().body().data = chunk.data();
        }
      } else {
        p.get().body().data = nullptr;
        p.get().body().size = 0;
        p.get().body().more = false;
      }
      out.expires_after(write_timeout);
      auto [ec, n] = co_await http::async_write(out, sr, nothrow);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) co_return std::pair{beast::error_code{}, ec};
      // The write that carried more=false finished the message (the chunked
      // serializer may not report done yet; writing again would repeat "0\r\n\r\n").
      if (sr.is_done() || p.is_done()) break;
    }
    co_return std::pair{beast::error_code{}, beast::error_code{}};
  }

  // Copies bytes one way until EOF or error (WebSocket and other upgraded protocols).
  static awaitable<void> pump(tcp_stream& from, tcp_stream& to, beast::flat_buffer& pending,
                              steady::duration idle) {
    if (pending.size() > 0) {
      to.expires_after(idle);
      auto [ec, n] = co_await asio::async_write(to, pending.data(), nothrow);
      if (ec) co_return;
      pending.consume(n);
    }
    std::array<char, 16384> buf;
    for (;;) {
      from.expires_after(idle);
      auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), nothrow);
      if (ec) break;
      to.expires_after(idle);
      auto [wec, wn] = co_await asio::async_write(to, asio::buffer(buf.data(), n), nothrow);
      (void)wn;
      if (wec) break;
    }
    beast::error_code ignored;
    to.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  // An upstream connection: reused from the pool or newly connected (round-robin, passive health).
  struct upstream_conn {
    std::unique_ptr<tcp_stream> stream;
    std::size_t server = 0;
    bool reused = false;
  };

  // `check_idle`: make sure a pooled connection is still open before using it
  // (worth a syscall only when a request body could not be replayed).
  awaitable<upstream_conn> acquire(worker& w, const runtime& rt, std::size_t upstream, bool allow_reuse, bool check_idle) {
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
    upstream_conn c;
    for (std::size_t attempt = 0; attempt < slots.size(); ++attempt) {
      const std::size_t s = w.round_robin[upstream]++ % slots.size();
      auto& slot = slots[s];
      if (slot.down_until > now && attempt + 1 < slots.size()) continue;  // skip a down server unless it is the last chance
      while (allow_reuse && !slot.idle.empty()) {
        tcp_socket sock = std::move(slot.idle.back());
        slot.idle.pop_back();
        // Drop connections the upstream has closed (or written to) while idle.
        char ch;
        if (check_idle) {
          const auto n = ::recv(sock.native_handle(), &ch, 1, MSG_PEEK | MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || n > 0) continue;
        }
        c.stream = std::make_unique<tcp_stream>(std::move(sock));
        c.server = s;
        c.reused = true;
        co_return c;
      }
      tcp_stream stream(w.ioc.get_executor());
      stream.expires_after(rt.cfg.connect_timeout);
      auto [ec] = co_await stream.async_connect(rt.servers[upstream][s], nothrow);
      if (ec) {
        (ec == beast::error::timeout ? metrics_.upstream_timeout : metrics_.upstream_connect).inc();
        slot.down_until = steady::now() + cfg.fail_timeout;
        continue;
      }
      stream.socket().set_option(tcp::no_delay(true));
      slot.down_until = {};
      c.stream = std::make_unique<tcp_stream>(std::move(stream));
      c.server = s;
      co_return c;
    }
    co_return c;
  }

  void give_back(worker& w, const runtime& rt, std::size_t upstream, upstream_conn& c) {
    if (w.pool_generation != rt.generation || !c.stream) return;
    auto& slot = w.pool[upstream][c.server];
    if (static_cast<std::int64_t>(slot.idle.size()) >= rt.cfg.upstreams[upstream].keepalive) return;
    c.stream->expires_never();
    slot.idle.push_back(c.stream->release_socket());
  }

  // Forwards an admitted request and relays the response. Returns whether the
  // client connection may be kept alive.
  awaitable<bool> forward(worker& w, const runtime& rt, const route& r, tcp_stream& client, beast::flat_buffer& buf,
                          http::request_parser<http::buffer_body>& parser, const std::string& client_ip,
                          std::span<char> chunk) {
    auto& req = parser.get();
    const unsigned version = req.version();
    const bool client_keep_alive = req.keep_alive();
    const bool head = req.method() == http::verb::head;
    const bool tunnel = is_upgrade(req);
    const bool has_body = !parser.is_done();
    // A request that may have reached a pooled connection's server is resent
    // only when that is harmless: no body (nothing consumed) and an idempotent
    // method (RFC 9110 9.2.2: a proxy must not retry POST, PATCH, ...).
    const http::verb m = req.method();
    const bool retryable = !has_body && (m == http::verb::get || m == http::verb::head || m == http::verb::options ||
                                         m == http::verb::put || m == http::verb::delete_ || m == http::verb::trace);
    if (iequals(req[http::field::expect], "100-continue")) {
      // The proxy answers 100-continue itself, once the gate has admitted the request.
      req.erase(http::field::expect);
      if (has_body) {
        client.expires_after(rt.cfg.body_timeout);
        static constexpr std::string_view k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
        auto [ec, n] = co_await asio::async_write(client, asio::buffer(k_continue), nothrow);
        if (ec) co_return false;
      }
    }
    rewrite_request(req, {client_ip, "http", tunnel});
    req.version(11);

    const auto upstream_timeout = rt.cfg.upstream_timeout;
    const auto body_timeout = rt.cfg.body_timeout;
    upstream_conn up;
    std::optional<http::response_parser<http::buffer_body>> rp;
    beast::flat_buffer ubuf;
    // A pooled connection may have been closed by the upstream just now: a
    // retryable request is retried once on a fresh connection.
    for (int attempt = 0; attempt < 2; ++attempt) {
      up = co_await acquire(w, rt, r.upstream_index, attempt == 0, has_body);
      if (!up.stream) {
        metrics_.upstream_no_server.inc();
        co_return co_await respond(client, version, http::status::bad_gateway, "upstream unavailable\n", false);
      }
      auto [read_ec, write_ec] = co_await relay<true>(*up.stream, client, buf, parser, chunk, body_timeout, upstream_timeout);
      if (read_ec) co_return false;  // the client failed mid-body: nothing sensible to answer
      if (write_ec) {
        if (up.reused && retryable) continue;
        metrics_.upstream_reset.inc();
        co_return co_await respond(client, version, http::status::bad_gateway, "upstream write failed\n", false);
      }
      ubuf.clear();
      beast::error_code ec;
      for (;;) {  // skip/forward 1xx informational responses (but not 101)
        rp.emplace();
        rp->body_limit(boost::none);
        if (head) rp->skip(true);
        up.stream->expires_after(upstream_timeout);
        auto [hec, n] = co_await http::async_read_header(*up.stream, ubuf, *rp, nothrow);
        ec = hec;
        if (ec) break;
        const unsigned code = rp->get().result_int();
        if (code < 100 || code >= 200 || code == 101) break;
        http::response<http::empty_body> info{rp->get().result(), 11};
        for (const auto& f : rp->get()) info.insert(f.name_string(), f.value());
        client.expires_after(upstream_timeout);
        auto [wec, wn] = co_await http::async_write(client, info, nothrow);
        if (wec) co_return false;
      }
      if (ec) {
        if (up.reused && retryable && (ec == http::error::end_of_stream || ec == asio::error::connection_reset)) continue;
        if (ec == beast::error::timeout) {
          metrics_.upstream_timeout.inc();
          co_return co_await respond(client, version, http::status::gateway_timeout, "upstream timed out\n", false);
        }
        metrics_.upstream_reset.inc();
        co_return co_await respond(client, version, http::status::bad_gateway, "upstream failed\n", false);
      }
      break;
    }
    if (!rp || !up.stream) co_return false;
    auto& res = rp->get();

    if (tunnel && res.result() == http::status::switching_protocols) {
      rewrite_response(res, true);
      http::response<http::empty_body> sw{res.result(), 11};
      for (const auto& f : res) sw.insert(f.name_string(), f.value());
      client.expires_after(upstream_timeout);
      if (auto [ec, n] = co_await http::async_write(client, sw, nothrow); ec) co_return false;
      const auto idle = rt.cfg.idle_timeout;
      co_await (pump(client, *up.stream, buf, idle) && pump(*up.stream, client, ubuf, idle));
      co_return false;
    }

    rewrite_response(res, false);
    const bool eof_body = !head && !res.has_content_length() && !res.chunked() && !rp->is_done();
    if (eof_body && version >= 11) res.chunked(true);  // keep the client connection: re-frame as chunked
    const bool keep = client_keep_alive && !draining_ && !(eof_body && version < 11);
    res.keep_alive(keep);
    res.version(version >= 11 ? 11 : 10);
    auto [read_ec, write_ec] = co_await relay<false>(client, *up.stream, ubuf, *rp, chunk, upstream_timeout, body_timeout);
    if (read_ec && read_ec != http::error::end_of_stream) {
      (read_ec == beast::error::timeout ? metrics_.upstream_timeout : metrics_.upstream_reset).inc();
      co_return false;  // the response has started: the only honest signal left is closing
    }
    if (write_ec) co_return false;
    if (rp->keep_alive() && rp->is_done() && parser.is_done()) give_back(w, rt, r.upstream_index, up);
    co_return keep;
  }

  awaitable<void> session(worker& w, tcp_socket socket) {
    ++connections_;
    struct guard {
      impl& s;
      worker& w;
      session_state& st;
      ~guard() {
        w.sessions.erase(&st);
        --s.connections_;
      }
    };
    tcp_stream client(std::move(socket));
    session_state state{&client, true};
    w.sessions.insert(&state);
    guard g{*this, w, state};
    beast::error_code ignored;
    client.socket().set_option(tcp::no_delay(true), ignored);
    const auto remote = client.socket().remote_endpoint(ignored);
    ip_address peer;
    if (auto parsed = parse_ip(remote.address().to_string())) peer = *parsed;
    beast::flat_buffer buf;
    // One relay buffer per connection (requests on it are sequential),
    // allocated at the first forward: held and refused requests never need it.
    std::unique_ptr<std::array<char, 16384>> chunk;

    for (bool first = true;; first = false) {
      if (w.rt->generation != generation_.load(std::memory_order_acquire)) w.rt = current();
      // Between requests the connection is idle: closed after idle_timeout, or at once when draining.
      // On a new connection the header_timeout runs from the accept: one deadline for the whole head.
      bool head_deadline_running = false;
      if (buf.size() == 0) {
        head_deadline_running = first;
        if (draining_) co_return;
        state.idle = true;
        client.expires_after(first ? w.rt->cfg.header_timeout : w.rt->cfg.idle_timeout);
        // 1 KiB holds most request heads; the buffer grows when one is larger.
        auto [ec, n] = co_await client.async_read_some(buf.prepare(1024), nothrow);
        if (ec) co_return;
        buf.commit(n);
        // A reload may have happened while this connection was idle.
        if (w.rt->generation != generation_.load(std::memory_order_acquire)) w.rt = current();
      }
      state.idle = false;
      const std::shared_ptr<const runtime> rt_hold = w.rt;
      const runtime& rt = *rt_hold;

      // The whole head is buffered and scanned before Beast parses it: size
      // classification (414 vs 431) and shapes Beast would accept (obs-fold).
      if (!head_deadline_running) client.expires_after(rt.cfg.header_timeout);
      const auto head = co_await read_head(client, buf, rt.cfg.max_header_bytes);
      if (head != head_status::ok) {
        switch (head) {
          case head_status::line_too_long:
            metrics_.header_too_large.inc();
            co_await respond(client, 11, http::status::uri_too_long, "request line too long\n", false);
            break;
          case head_status::headers_too_large:
            metrics_.header_too_large.inc();
            co_await respond(client, 11, http::status::request_header_fields_too_large, "request headers too large\n", false);
            break;
          case head_status::obs_fold:
            metrics_.bad_request.inc();
            co_await respond(client, 11, http::status::bad_request, "bad request: obsolete line folding\n", false);
            break;
          case head_status::timeout:
            metrics_.header_timeout.inc();
            co_await respond(client, 11, http::status::request_timeout, "request head not received in time\n", false);
            break;
          default: break;  // closed
        }
        co_return;
      }
      http::request_parser<http::buffer_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(rt.cfg.max_header_bytes));
      if (rt.cfg.max_body_bytes > 0) parser.body_limit(rt.cfg.max_body_bytes);
      else parser.body_limit(boost::none);
      auto [ec, n] = co_await http::async_read_header(client, buf, parser, nothrow);
      if (ec) {
        metrics_.bad_request.inc();
        co_await respond(client, 11, http::status::bad_request, "bad request: " + ec.message() + "\n", false);
        co_return;
      }
      auto& req = parser.get();
      const unsigned version = req.version();
      // Request-smuggling shapes the parser lets through are refused outright.
      if (req.count(http::field::content_length) > 1 ||
          (req.count(http::field::transfer_encoding) > 0 && req.count(http::field::content_length) > 0) ||
          (req.count(http::field::transfer_encoding) > 0 && (!req.chunked() || version < 11)) ||
          req.count(http::field::host) > 1 || (version >= 11 && req.count(http::field::host) == 0)) {
        metrics_.bad_request.inc();
        co_await respond(client, version, http::status::bad_request, "bad request: ambiguous framing or host\n", false);
        co_return;
      }
      const std::string_view target = req.target();
      const route* r = rt.routes.match(req[http::field::host], target.substr(0, target.find('?')));
      if (!r) {
        metrics_.no_route.inc();
        // Unread body bytes would be parsed as the next request: close instead.
        if (!co_await respond(client, version, http::status::not_found, "no route\n", req.keep_alive() && parser.is_done())) {
          co_return;
        }
        continue;
      }
      const std::int64_t now_us = clock_.wall_us();
      const std::int64_t now_ms = now_us / 1000;
      const auto& counts = rt.counts[r->domain_index];
      identify_context ictx{&rt.cfg.trusted_proxies, rt.jwt.get(), now_us / 1'000'000};
      const auto who = identify(r->identify, req, target, peer, ictx);
      const std::string client_ip = format_ip(client_address(req, peer, rt.cfg.trusted_proxies));
      gate_decision d;
      if (who) {
        d = gate_.decide(rt.gate_domain[r->domain_index], who->value, now_us, rt.limits);
      }
      if (!who) {
        counts[static_cast<int>(decision_label::unidentified)]->inc();
      } else if (d.v == verdict::reject) {
        counts[static_cast<int>(decision_label::rejected)]->inc();
        (d.reason == reject_reason::delay_too_long ? metrics_.reject_too_long : metrics_.reject_held_full).inc();
        publish(w, rt, *r, wire::status::rejected, who->value, now_ms, 0);
        log_access(rt, peer, req, 503, "rejected", who ? &*who : nullptr, 0);
        if (!co_await respond(client, version, http::status::service_unavailable, "rate limit exceeded, retry later\n",
                              req.keep_alive() && parser.is_done() && !draining_, d.retry_after_s)) {
          co_return;
        }
        continue;
      } else if (d.v == verdict::delay) {
        counts[static_cast<int>(decision_label::delayed)]->inc();
        // Reported when the hold starts, with the time it will be forwarded:
        // the master then knows every gatekeeper's reservations within a round
        // trip, which is what holds one limit across gatekeepers. A prepaid
        // slot (given back by a held client that left) was reported already.
        if (!d.prepaid) publish(w, rt, *r, wire::status::delayed, who->value, now_ms, (d.release_us + 999) / 1000);
        metrics_.delay_seconds.observe(static_cast<double>(d.release_us - now_us) / 1e6);
        const bool stayed = co_await hold(client, steady::now() + std::chrono::microseconds(d.release_us - clock_.wall_us()));
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
      const auto started = steady::now();
      if (!chunk) chunk = std::make_unique<std::array<char, 16384>>();
      const bool keep = co_await forward(w, rt, *r, client, buf, parser, client_ip, *chunk);
      if (rt.cfg.access_log) {
        log_access(rt, peer, req, 0, d.v == verdict::delay ? "delayed" : who ? "accepted" : "unidentified",
                   who ? &*who : nullptr, std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - started).count());
      }
      if (!keep) co_return;
    }
  }

  void log_access(const runtime& rt, const ip_address& peer, const http::request<http::buffer_body>& req, unsigned status,
                  std::string_view decision, const identity* who, std::int64_t upstream_ms) {
    if (!rt.cfg.access_log) return;
    access_log_->info("{} \"{} {}\" status={} decision={} source={} upstream_ms={}", format_ip(peer),
                      std::string_view(req.method_string()), std::string_view(req.target()),
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
        for (auto* s : w.sessions) {
          if (s->idle) s->client->socket().cancel(ignored);
        }
      });
    }
    const auto deadline = steady::now() + current()->cfg.grace_period;
    while (connections_.load() > 0 && steady::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (connections_.load() > 0) log_->warn("grace period over: closing {} connection(s)", connections_.load());
    for (auto& w : workers_) {
      asio::post(w->ioc, [&w = *w] { w.accounting->flush(); });  // nothing accepted is lost
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
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
  zmq::context_t accounting_ctx_, control_ctx_;
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
