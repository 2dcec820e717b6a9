// One request's exchange with an HTTP/1.1 upstream, whatever the client's
// protocol: a connection from the worker's pool, the request out, the
// response head in (1xx passed on or not), the retry rule, the upstream's
// metrics, the response relayed, the connection back to the pool.
//
// What differs by client is the Client's part (its calls are listed at
// exchange_h1): where the request body comes from, where the response goes,
// how a failure is answered. There are two:
// - an HTTP/1.1 client connection (http1/forward.cpp): bytes relayed socket
//   to socket, the response re-framed for the client's version, a tunnel
//   after 101;
// - any `downstream` (h1_upstream.cpp): the response as fields and body
//   pieces, the same events an HTTP/2 upstream gives, so an HTTP/2 client's
//   stream is served alike whichever protocol its upstream speaks.
// A template rather than virtual calls: the HTTP/1.1 client's path is the
// proxy's busiest, and a virtual awaitable would cost a coroutine frame.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string_view>

#include "proxy/io/conn_io.hpp"
#include "proxy/request/proxy_metrics.hpp"
#include "proxy/request/routes.hpp"
#include "proxy/request/runtime.hpp"
#include "proxy/upstream/pool.hpp"
#include "shared/base/clock.hpp"

namespace smockron::proxy {

/// What an HTTP/1.1 exchange needs of its worker.
struct h1_exchange_env {
  upstream_pool& pool;
  proxy_metrics& metrics;
  const clock& clk;  ///< upstream response times
};

/// How a step of the exchange ended: go on, try once more on a fresh
/// connection, stop (the client has been answered, or is gone), or the
/// write to the upstream failed (timed out, or not).
enum class h1_step : std::uint8_t { next, retry, answered, write_failed, write_timed_out };

namespace h1_exchange_detail {

// The upstream failed before a response started: counted, and the client answered.
template <class Client>
awaitable<h1_step> upstream_failed(const h1_exchange_env& env, Client& cl, bool timed_out, std::string_view why) {
  if (timed_out) {
    env.metrics.upstream_timeout.inc();
    co_await cl.fail(504, "upstream timed out\n");
  } else {
    env.metrics.upstream_reset.inc();
    co_await cl.fail(502, why);
  }
  co_return h1_step::answered;
}

// Reads the response head up to a final one (or 101); each 1xx goes to the
// client's interim(). A pooled connection the server had closed (nothing
// came back) is worth one retry, when the request may be resent.
template <class Client>
awaitable<h1_step> read_response_head(const h1_exchange_env& env, const runtime& rt, Client& cl, bool retryable,
                                      int attempt) {
  forwarding& f = cl.fwd();
  io_deadline& d = cl.deadline();
  f.upstream_in.clear();
  boost::system::error_code ec;
  bool bad_head = false, interim = false, first_read = true;
  for (std::size_t scanned = 0;;) {
    const auto parsed =
        http1::parse_response(view(f.upstream_in), k_max_response_head, cl.head_request(), f.response, scanned);
    if (parsed.status == http1::parse_status::complete) {
      if (f.response.status >= 200 || f.response.status == 101) break;
      interim = true;  // a response has begun: no retry after this
      if (!co_await cl.interim()) co_return h1_step::answered;
      f.upstream_in.consume(f.response.size);
      scanned = 0;
      continue;
    }
    if (parsed.status != http1::parse_status::incomplete) {
      bad_head = true;
      break;
    }
    // The answer to a request just sent is rarely there yet: its first
    // read waits for readiness instead of trying a recv() that fails.
    const auto into = f.upstream_in.prepare(k_head_read);
    auto [rec, n] = first_read ? co_await read_first(d, *f.up.sock, into, rt.cfg.upstream_timeout)
                               : co_await read_more(d, *f.up.sock, into, rt.cfg.upstream_timeout);
    first_read = false;
    if (rec) {
      ec = d.classify(rec);
      break;
    }
    f.upstream_in.commit(n);
  }
  if (cl.gone()) co_return h1_step::answered;
  if (!ec && !bad_head) co_return h1_step::next;
  const bool nothing = f.upstream_in.size() == 0 && !interim;
  if (nothing && f.up.reused && retryable && attempt == 0 &&
      (ec == asio::error::eof || ec == asio::error::connection_reset)) {
    co_return h1_step::retry;
  }
  co_return co_await upstream_failed(env, cl, ec == asio::error::timed_out,
                                     bad_head ? "upstream sent a malformed response\n" : "upstream failed\n");
}

}  // namespace h1_exchange_detail

/// The exchange for the request of route `r`; the Client is kept in the
/// exchange's coroutine (no frame of its own), and what it makes of the
/// exchange is the result. A request that may have reached a pooled
/// connection's server is resent (once, on a fresh connection) only when
/// that is harmless: `retryable()` (no body, so nothing was consumed, and an
/// idempotent method).
///
/// The Client provides:
/// - `result`, the type of what it makes of it, and `result finish()`;
/// - `bool retryable()`;
/// - `io_deadline& deadline()`, `forwarding& fwd()` (the upstream connection,
///   its bytes and response);
/// - `void submitted(std::size_t server)`: the server the request goes to;
/// - `bool head_request()`: the request is HEAD (a response without body);
/// - `bool gone()`: the client has left (nothing more is done for it);
/// - `awaitable<h1_step> send_request()`: the head and body out on fwd().up
///   (write_failed, write_timed_out: the upstream did not take them;
///   answered: the client was answered, or left);
/// - `awaitable<bool> interim()`: a 1xx head in fwd().response, passed on
///   or not; false: the client failed;
/// - `awaitable<void> fail(unsigned status, std::string_view why)`: answers
///   when no response has started (the cause is counted already);
/// - `awaitable<bool> relay()`: the final response (its head parsed in
///   fwd().response and consumed); true when the upstream connection ended
///   clean (it goes back to the pool if the response kept it alive).
template <class Client>
awaitable<typename Client::result> exchange_h1(h1_exchange_env env, const runtime& rt, const route& r, Client cl) {
  forwarding& f = cl.fwd();
  // Whatever ends the exchange, the upstream connection is not left open
  // (give_back() has taken it when it goes back to the pool).
  struct release_guard {
    upstream_conn& up;
    ~release_guard() { up.release(); }
  } guard{f.up};
  const bool retryable = cl.retryable();
  auto sent = env.clk.steady_now();
  for (int attempt = 0;; ++attempt) {
    // A request that could not be resent makes sure a pooled connection is still open.
    if (!(attempt == 0 && env.pool.take_pooled(rt, f.up, r.upstream_index, !retryable)) &&
        !co_await env.pool.acquire(rt, cl.deadline(), f.up, r.upstream_index, attempt == 0, !retryable)) {
      if (cl.gone()) co_return cl.finish();
      env.metrics.upstream_no_server.inc();
      co_await cl.fail(502, "upstream unavailable\n");
      co_return cl.finish();
    }
    if (cl.gone()) {
      // Gone while the connection was taken or made: unused, it serves the next request.
      env.pool.give_back(rt, f.up, r.upstream_index);
      co_return cl.finish();
    }
    cl.submitted(f.up.server);  // the access log's upstream
    if (attempt > 0) sent = env.clk.steady_now();
    auto step = co_await cl.send_request();
    if (step == h1_step::write_failed || step == h1_step::write_timed_out) {
      // Before the server could have taken the request, on a pooled connection it had closed: once more.
      step = f.up.reused && retryable && attempt == 0
                 ? h1_step::retry
                 : co_await h1_exchange_detail::upstream_failed(env, cl, step == h1_step::write_timed_out,
                                                                "upstream write failed\n");
    }
    if (step == h1_step::next) step = co_await h1_exchange_detail::read_response_head(env, rt, cl, retryable, attempt);
    if (step == h1_step::answered) co_return cl.finish();
    if (step == h1_step::next) break;
  }
  const auto& counted = rt.upstream_metrics[r.upstream_index];
  counted.by_class[std::clamp<unsigned>(f.response.status / 100, 1, 5) - 1]->inc();
  counted.seconds->observe(std::chrono::duration<double>(env.clk.steady_now() - sent).count());
  f.upstream_in.consume(f.response.size);
  if (co_await cl.relay() && f.response.keep_alive && f.upstream_in.size() == 0) {
    env.pool.give_back(rt, f.up, r.upstream_index);
  }
  co_return cl.finish();
}

}  // namespace smockron::proxy
