// Forwarding (see forward.hpp).
#include "proxy/http1/forward.hpp"

#include "proxy/request/cost.hpp"
#include "proxy/request/request_steps.hpp"
#include "proxy/upstream/h1_exchange.hpp"

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

// An HTTP/1.1 client connection as an HTTP/1.1 exchange's client
// (h1_exchange.hpp): the request body streamed from its socket, the
// response re-framed for its version and written to it, a tunnel after 101.
// Each step either goes on or answers the client itself (then `next` says
// whether the connection goes on).
struct h1_client {
  using result = connection_next;

  forward_env& env;
  const runtime& rt;
  const route& r;
  connection& c;
  unsigned version = c.request.version;
  connection_next next = connection_next::ends;

  bool retryable() const { return c.request.body == http1::framing::none && http1::idempotent(c.request.method); }
  io_deadline& deadline() { return c; }
  forwarding& fwd() { return c.fwd(); }
  void submitted(std::size_t server) { c.outcome.server = server; }
  bool head_request() const { return c.request.head; }
  static constexpr bool gone() { return false; }
  connection_next finish() const { return next; }

  awaitable<h1_step> send_request();
  awaitable<bool> interim();
  /// Not a coroutine: the one it returns is the only frame.
  awaitable<bool> relay() { return c.fwd().response.status == 101 ? switch_protocols() : relay_response(); }
  awaitable<bool> switch_protocols();
  awaitable<void> fail(unsigned status, std::string_view body) {
    c.outcome.status = status;
    next = co_await respond(c, version, status, body, false);
  }
  /// Sets `next`; true when the whole response came (the upstream connection may be reused).
  awaitable<bool> relay_response();
  awaitable<void> tunnel();
  awaitable<void> pump(link& from, link& to, boost::beast::flat_buffer& pending);
};

// The head (in c.out) and the body go out on the upstream connection: the
// head and the body bytes at hand share one write; the rest of the body is
// streamed from the client through c.in (bytes past its end stay there: a
// pipelined request). The proxy answers 100-continue itself, once the
// upstream connection is there.
awaitable<h1_step> h1_client::send_request() {
  const http1::request_head& req = c.request;
  if (req.expect_continue && req.body != http1::framing::none && version >= 11) {
    static constexpr std::string_view k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
    if (auto [ec, n] = co_await write(c, c.client, asio::buffer(k_continue), rt.cfg.body_timeout); ec) {
      next = connection_next::ends;
      co_return h1_step::answered;
    }
  }
  const auto max_line = static_cast<std::size_t>(rt.cfg.max_header_bytes);
  body_relay& body = c.fwd().relay.emplace(req.body, req.body, req.content_length, max_line);
  const relay_leg leg{
      c.client, c.in, *c.fwd().up.sock, rt.cfg.body_timeout, rt.cfg.upstream_timeout, rt.cfg.max_body_bytes};
  const relay_end end = co_await relay_body(c, leg, body);
  c.outcome.bytes_in = body.data_bytes;
  switch (end.what) {
    case relay_end::kind::done: co_return h1_step::next;
    // Refused mid-body: the upstream got part of it and its connection is
    // dropped with `up`; the client hears why, then the connection closes.
    case relay_end::kind::bad_framing:
      env.metrics.bad_request.inc();
      c.outcome.status = 400;
      next = co_await refuse(c, version, 400, "bad request: " + std::string(body.dec.error()) + "\n");
      co_return h1_step::answered;
    case relay_end::kind::too_large:
      env.metrics.bad_request.inc();
      c.outcome.status = 413;
      next = co_await refuse(c, version, 413, "request body too large\n");
      co_return h1_step::answered;
    case relay_end::kind::cost_cut: {
      env.metrics.reject_cost_over_limit.inc();
      const refusal no = refusal_for_cost_cut(r);
      c.outcome.status = no.status;
      next = co_await refuse(c, version, no.status, no.text);
      co_return h1_step::answered;
    }
    case relay_end::kind::write_failed:
      co_return c.classify(end.ec) == asio::error::timed_out ? h1_step::write_timed_out : h1_step::write_failed;
    case relay_end::kind::read_failed: break;
  }
  next = connection_next::ends;  // the client failed mid-body: nothing sensible to answer
  co_return h1_step::answered;
}

// A 1xx informational response goes on to an HTTP/1.1 client (never to
// HTTP/1.0, RFC 9110 15.2).
awaitable<bool> h1_client::interim() {
  if (version < 11) co_return true;
  c.out.clear();
  http1::write_response_head(c.out, c.fwd().response, 11, http1::framing::none, true, false);
  auto [ec, n] = co_await write(c, c.client, asio::buffer(c.out), rt.cfg.upstream_timeout);
  if (ec) next = connection_next::ends;
  co_return !ec;
}

// After 101: a tunnel, when the request asked for one.
awaitable<bool> h1_client::switch_protocols() {
  if (!c.request.upgrade) {
    env.metrics.upstream_reset.inc();
    co_await fail(502, "upstream switched protocols unasked\n");
    co_return false;
  }
  co_await tunnel();
  next = connection_next::ends;
  co_return false;
}

// The response head and body to the client, re-framed for its version:
// HTTP/1.0 knows no chunks, and an HTTP/1.1 client keeps its connection when
// a body that ends by closing is sent chunked.
awaitable<bool> h1_client::relay_response() {
  using http1::framing;
  const http1::request_head& req = c.request;
  const http1::response_head& res = c.fwd().response;
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
    case relay_end::kind::bad_framing: env.metrics.upstream_reset.inc(); co_return false;
    case relay_end::kind::read_failed:
      (end.ec == asio::error::timed_out ? env.metrics.upstream_timeout : env.metrics.upstream_reset).inc();
      co_return false;
    default: co_return false;  // the client failed
  }
  next = goes_on_if(keep_client);
  co_return true;
}

// After a 101 response: the response head to the client, then bytes both
// ways until either side ends.
awaitable<void> h1_client::tunnel() {
  c.outcome.status = 101;
  c.out.clear();
  http1::write_response_head(c.out, c.fwd().response, 11, http1::framing::none, true, true);
  if (auto [ec, n] = co_await write(c, c.client, asio::buffer(c.out), rt.cfg.upstream_timeout); ec) co_return;
  co_await (pump(c.client, *c.fwd().up.sock, c.in) && pump(*c.fwd().up.sock, c.client, c.fwd().upstream_in));
}

// Copies bytes one way until EOF or error; the connection's idle deadline
// covers both directions.
awaitable<void> h1_client::pump(link& from, link& to, boost::beast::flat_buffer& pending) {
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
  const http1::request_head& req = c.request;
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
  // Not a coroutine: the exchange's is the only frame.
  return exchange_h1(h1_exchange_env{env.pool, env.metrics, env.clk}, rt, r, h1_client{env, rt, r, c});
}

}  // namespace smockron::proxy
