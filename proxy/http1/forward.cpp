// Forwarding (see forward.hpp).
#include "proxy/http1/forward.hpp"

#include "proxy/request/cost.hpp"
#include "proxy/request/request_steps.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>

#include <array>
#include <cstring>

namespace smockron::proxy {

using namespace asio::experimental::awaitable_operators;

namespace {

// One direction of a body relay: bytes come from `from` (some may be
// buffered in `pending` already) and go to `to`.
struct relay_leg {
  link& from;
  boost::beast::flat_buffer& pending;
  link& to;
  steady::duration read_timeout, write_timeout;
  std::uint64_t max_bytes = 0;  ///< payload bound (0 = none)
};

struct relay_end {
  enum class kind : std::uint8_t { done, bad_framing, too_large, cost_cut, write_failed, read_failed };
  kind what = kind::done;
  boost::system::error_code ec;  ///< read_failed: the read's error, timed_out when the deadline passed
};

// Relays one body, the head in c.out going out in its first write. Bytes
// past the body's end stay in `leg.pending` (a pipelined request).
awaitable<relay_end> relay_body(connection& c, const relay_leg& leg, body_relay& body) {
  using kind = relay_end::kind;
  buffer_list& bufs = c.fwd().bufs;
  bufs.clear();
  bufs.add(c.out.data(), c.out.size());
  for (;;) {
    const auto used = body.step(view(leg.pending), bufs);
    if (!used) co_return relay_end{kind::bad_framing, {}};
    // Checked before the step's bytes go: a body over a bound never reaches the upstream whole.
    if (leg.max_bytes > 0 && body.data_bytes > leg.max_bytes) co_return relay_end{kind::too_large, {}};
    if (cut_by_cost(c.outcome, body.data_bytes)) co_return relay_end{kind::cost_cut, {}};
    if (!bufs.empty()) {
      boost::system::error_code ec;
      if (!send_now(leg.to, bufs, ec)) ec = std::get<0>(co_await write(c, leg.to, bufs, leg.write_timeout));
      if (ec) co_return relay_end{kind::write_failed, ec};
    }
    leg.pending.consume(*used);
    bufs.clear();
    if (body.done) co_return relay_end{kind::done, {}};
    if (leg.pending.size() > 0) continue;  // more at hand than one write took
    auto [ec, n] = co_await read_more(c, leg.from, leg.pending.prepare(k_relay_chunk), leg.read_timeout);
    if (ec == asio::error::eof && body.in_framing == http1::framing::until_close) {
      body.eof = true;
      continue;
    }
    if (ec) co_return relay_end{kind::read_failed, c.classify(ec)};
    leg.pending.commit(n);
  }
}

// One request's exchange with its upstream. Each step either goes on or
// answers the client itself (then `next` says whether the connection goes on).
struct exchange {
  forward_env& env;
  const runtime& rt;
  const route& r;
  connection& c;
  http1::request_head& req = c.request;
  http1::response_head& res = c.fwd().response;
  unsigned version = req.version;
  // A request that may have reached a pooled connection's server is resent
  // only when that is harmless: no body (nothing consumed) and an idempotent method.
  bool retryable = req.body == http1::framing::none && http1::idempotent(req.method);
  connection_next next = connection_next::ends;

  enum class step : std::uint8_t { next, retry, answered };

  awaitable<step> send_request(int attempt);
  awaitable<step> read_response_head(int attempt);
  awaitable<connection_next> relay_response();
  awaitable<void> tunnel();
  awaitable<void> pump(link& from, link& to, boost::beast::flat_buffer& pending);

  awaitable<step> answer(unsigned status, std::string_view body) {
    c.outcome.status = status;
    next = co_await respond(c, version, status, body, false);
    co_return step::answered;
  }
};

// Takes an upstream connection and writes the head (in c.out) and the body:
// the head and the body bytes at hand share one write; the rest of the body
// is streamed from the client through c.in (bytes past its end stay there:
// a pipelined request).
awaitable<exchange::step> exchange::send_request(int attempt) {
  // A request that could not be resent makes sure a pooled connection is still open.
  if (!(attempt == 0 && env.pool.take_pooled(rt, c, r.upstream_index, !retryable)) &&
      !co_await env.pool.acquire(rt, c, r.upstream_index, attempt == 0, !retryable)) {
    env.metrics.upstream_no_server.inc();
    co_return co_await answer(502, "upstream unavailable\n");
  }
  const auto max_line = static_cast<std::size_t>(rt.cfg.max_header_bytes);
  body_relay& body = c.fwd().relay.emplace(req.body, req.body, req.content_length, max_line);
  const relay_leg leg{
      c.client, c.in, *c.fwd().up.sock, rt.cfg.body_timeout, rt.cfg.upstream_timeout, rt.cfg.max_body_bytes};
  c.outcome.server = c.fwd().up.server;
  const relay_end end = co_await relay_body(c, leg, body);
  c.outcome.bytes_in = body.data_bytes;
  switch (end.what) {
    case relay_end::kind::done: co_return step::next;
    // Refused mid-body: the upstream got part of it and its connection is
    // dropped with `up`; the client hears why, then the connection closes.
    case relay_end::kind::bad_framing:
      env.metrics.bad_request.inc();
      c.outcome.status = 400;
      next = co_await refuse(c, version, 400, "bad request: " + std::string(body.dec.error()) + "\n");
      co_return step::answered;
    case relay_end::kind::too_large:
      env.metrics.bad_request.inc();
      c.outcome.status = 413;
      next = co_await refuse(c, version, 413, "request body too large\n");
      co_return step::answered;
    case relay_end::kind::cost_cut: {
      env.metrics.reject_cost_over_limit.inc();
      const refusal no = refusal_for_cost_cut(r);
      c.outcome.status = no.status;
      next = co_await refuse(c, version, no.status, no.text);
      co_return step::answered;
    }
    case relay_end::kind::write_failed:
      if (c.fwd().up.reused && retryable && attempt == 0) co_return step::retry;
      env.metrics.upstream_reset.inc();
      co_return co_await answer(502, "upstream write failed\n");
    case relay_end::kind::read_failed: break;
  }
  next = connection_next::ends;  // the client failed mid-body: nothing sensible to answer
  co_return step::answered;
}

// Reads the response head, passing 1xx informational responses on to an
// HTTP/1.1 client (never to HTTP/1.0, RFC 9110 15.2) and stopping at a final
// one or 101.
awaitable<exchange::step> exchange::read_response_head(int attempt) {
  c.fwd().upstream_in.clear();
  boost::system::error_code ec;
  bool bad_head = false, interim = false, first_read = true;
  for (std::size_t scanned = 0;;) {
    const auto parsed = http1::parse_response(view(c.fwd().upstream_in), k_max_response_head, req.head, res, scanned);
    if (parsed.status == http1::parse_status::complete) {
      if (res.status >= 200 || res.status == 101) break;
      interim = true;  // a response has begun: no retry after this
      if (version >= 11) {
        c.out.clear();
        http1::write_response_head(c.out, res, 11, http1::framing::none, true, false);
        auto [wec, wn] = co_await write(c, c.client, asio::buffer(c.out), rt.cfg.upstream_timeout);
        if (wec) {
          next = connection_next::ends;
          co_return step::answered;
        }
      }
      c.fwd().upstream_in.consume(res.size);
      scanned = 0;
      continue;
    }
    if (parsed.status != http1::parse_status::incomplete) {
      bad_head = true;
      break;
    }
    // The answer to a request just sent is rarely there yet: its first
    // read waits for readiness instead of trying a recv() that fails.
    const auto into = c.fwd().upstream_in.prepare(k_head_read);
    auto [rec, n] = first_read ? co_await read_first(c, *c.fwd().up.sock, into, rt.cfg.upstream_timeout)
                               : co_await read_more(c, *c.fwd().up.sock, into, rt.cfg.upstream_timeout);
    first_read = false;
    if (rec) {
      ec = c.classify(rec);
      break;
    }
    c.fwd().upstream_in.commit(n);
  }
  if (!ec && !bad_head) co_return step::next;
  // A pooled connection the server closed just now: nothing came back.
  const bool nothing = c.fwd().upstream_in.size() == 0 && !interim;
  if (nothing && c.fwd().up.reused && retryable && attempt == 0 &&
      (ec == asio::error::eof || ec == asio::error::connection_reset)) {
    co_return step::retry;
  }
  if (ec == asio::error::timed_out) {
    env.metrics.upstream_timeout.inc();
    co_return co_await answer(504, "upstream timed out\n");
  }
  env.metrics.upstream_reset.inc();
  co_return co_await answer(502, bad_head ? "upstream sent a malformed response\n" : "upstream failed\n");
}

// The response head and body to the client, re-framed for its version:
// HTTP/1.0 knows no chunks, and an HTTP/1.1 client keeps its connection when
// a body that ends by closing is sent chunked.
awaitable<connection_next> exchange::relay_response() {
  using http1::framing;
  framing out = res.body;
  if (res.body == framing::until_close && version >= 11) out = framing::chunked;
  if (res.body == framing::chunked && version < 11) out = framing::until_close;
  const bool keep_client = req.keep_alive && !env.draining && out != framing::until_close;
  c.out.clear();
  http1::write_response_head(c.out, res, version >= 11 ? 11 : 10, out, keep_client, false, c.response_fields);
  const auto max_line = static_cast<std::size_t>(rt.cfg.max_header_bytes);
  body_relay& body = c.fwd().relay.emplace(res.body, out, res.content_length, max_line);
  // A cost read from the response: in its head, else in its trailers.
  const bool cost_field = r.cost.after_response();
  if (cost_field) {
    note_cost_fields(r, res.headers, c.outcome);
    c.fwd().trailers.clear();
    if (!c.outcome.cost_field && res.body == framing::chunked) body.dec.keep_trailers = &c.fwd().trailers;
  }
  const relay_leg leg{*c.fwd().up.sock, c.fwd().upstream_in, c.client, rt.cfg.upstream_timeout, rt.cfg.body_timeout, 0};
  c.outcome.status = res.status;
  const relay_end end = co_await relay_body(c, leg, body);
  c.outcome.bytes_out = body.data_bytes;
  if (cost_field && !c.fwd().trailers.empty()) {
    note_cost_trailer(r, c.fwd().trailers, c.outcome);
    std::string().swap(c.fwd().trailers);
  }
  // Once the response has started, closing is the only honest signal left.
  switch (end.what) {
    case relay_end::kind::done: break;
    case relay_end::kind::bad_framing: env.metrics.upstream_reset.inc(); co_return connection_next::ends;
    case relay_end::kind::read_failed:
      (end.ec == asio::error::timed_out ? env.metrics.upstream_timeout : env.metrics.upstream_reset).inc();
      co_return connection_next::ends;
    default: co_return connection_next::ends;  // the client failed
  }
  if (res.keep_alive && c.fwd().upstream_in.size() == 0) env.pool.give_back(rt, c, r.upstream_index);
  co_return goes_on_if(keep_client);
}

// After a 101 response: the response head to the client, then bytes both
// ways until either side ends.
awaitable<void> exchange::tunnel() {
  c.outcome.status = 101;
  c.out.clear();
  http1::write_response_head(c.out, res, 11, http1::framing::none, true, true);
  if (auto [ec, n] = co_await write(c, c.client, asio::buffer(c.out), rt.cfg.upstream_timeout); ec) co_return;
  co_await (pump(c.client, *c.fwd().up.sock, c.in) && pump(*c.fwd().up.sock, c.client, c.fwd().upstream_in));
}

// Copies bytes one way until EOF or error; the connection's idle deadline
// covers both directions.
awaitable<void> exchange::pump(link& from, link& to, boost::beast::flat_buffer& pending) {
  const auto idle = rt.cfg.idle_timeout;
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
  to.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

}  // namespace

awaitable<connection_next> forward(forward_env& env, const runtime& rt, const route& r, connection& c,
                                   const http1::forward_info& hop) {
  exchange x{env, rt, r, c};
  const http1::request_head& req = c.request;
  if (req.expect_continue && req.body != http1::framing::none && x.version >= 11) {
    // The proxy answers 100-continue itself, once the gate has admitted the request.
    static constexpr std::string_view k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
    auto [ec, n] = co_await write(c, c.client, asio::buffer(k_continue), rt.cfg.body_timeout);
    if (ec) co_return connection_next::ends;
  }
  c.out.clear();
  http1::forward_info info = hop;
  info.tunnel = req.upgrade;
  http1::write_request_head(c.out, req, info);
  c.in.consume(req.size);  // the head: what follows is body (or the next request)
  if (!c.early.empty()) {  // what came while it was held follows what came with the head
    const auto room = c.in.prepare(c.early.size());
    std::memcpy(room.data(), c.early.data(), c.early.size());
    c.in.commit(c.early.size());
    std::string().swap(c.early);  // up to 64 KiB: not kept for the rest of a keep-alive connection
  }
  struct release_guard {
    upstream_conn& up;
    ~release_guard() { up.release(); }
  } guard{c.fwd().up};
  // A pooled connection may have been closed by the upstream just now: a
  // retryable request is retried once on a fresh connection.
  auto sent = env.clk.steady_now();
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0) sent = env.clk.steady_now();
    auto st = co_await x.send_request(attempt);
    if (st == exchange::step::next) st = co_await x.read_response_head(attempt);
    if (st == exchange::step::answered) co_return x.next;
    if (st == exchange::step::next) break;
  }
  const auto& counted = rt.upstream_metrics[r.upstream_index];
  counted.by_class[std::clamp<unsigned>(c.fwd().response.status / 100, 1, 5) - 1]->inc();
  counted.seconds->observe(std::chrono::duration<double>(env.clk.steady_now() - sent).count());
  c.fwd().upstream_in.consume(c.fwd().response.size);
  if (c.fwd().response.status == 101) {
    if (!req.upgrade) {
      env.metrics.upstream_reset.inc();
      c.outcome.status = 502;
      co_return co_await respond(c, x.version, 502, "upstream switched protocols unasked\n", false);
    }
    co_await x.tunnel();
    co_return connection_next::ends;
  }
  co_return co_await x.relay_response();
}

}  // namespace smockron::proxy
