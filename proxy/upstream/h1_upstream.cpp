// An HTTP/1.1 upstream for a client stream (see h1_upstream.hpp).
#include "proxy/upstream/h1_upstream.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>

#include "proxy/codec/body_relay.hpp"

namespace smockron::proxy {
namespace {

/// Response bytes the client side holds untaken before the server is read again.
constexpr std::size_t k_response_buffer = 65536;

// One exchange's state: the client side calls it as its upstream_exchange,
// the exchange's coroutine (through stream_client) does the rest.
struct h1_upstream final : upstream_exchange {
  h1_upstream(executor_t ex, const clock& clk, const upstream_request& req)
      : dl(clk),
        wake(ex),
        st(&req.st),
        down(&req.down),
        rt(req.rt),
        r(req.r),
        head_request(req.req.head),
        has_body(req.req.body != http1::framing::none),
        chunked_body(req.req.body != http1::framing::length),
        retryable(req.req.body == http1::framing::none && http1::idempotent(req.req.method)) {
    head.reserve(512 + req.req.target.size());
    http1::write_request_head(head, req.req, req.hop);
  }

  void body_ready() override { wake.cancel(); }
  void consumed(std::size_t n) override {
    given -= std::min(n, given);
    wake.cancel();
  }
  void cancel() override {
    down = nullptr;
    st = nullptr;
    wake.cancel();
    if (fw.up.sock) {
      boost::system::error_code ignored;
      fw.up.sock->socket().cancel(ignored);
    }
  }
  void sweep(steady::time_point now) override {
    if (dl.passed(now) && fw.up.sock) {
      boost::system::error_code ignored;
      fw.up.sock->socket().cancel(ignored);
    }
  }
  /// The client side, once: the end or failure it hears is the last call.
  downstream* detach() { return std::exchange(down, nullptr); }

  io_deadline dl;
  forwarding fw;
  steady_timer wake;  ///< waits for request body bytes, or for the client to take response bytes
  h2_stream* st;
  downstream* down;  ///< null once the client side is done with it (or gone)
  std::shared_ptr<const runtime> rt;
  const route& r;
  std::string head;   ///< the request head, as it goes upstream
  std::string arena;  ///< the response fields' bytes
  bool head_request, has_body, chunked_body, retryable;
  std::size_t given = 0;  ///< response bytes handed to the client side and not taken yet
};

// The exchange's Client (h1_exchange.hpp) for a client stream.
struct stream_client {
  using result = void;

  std::shared_ptr<h1_upstream> x;
  proxy_metrics& metrics;

  bool retryable() const { return x->retryable; }
  io_deadline& deadline() { return x->dl; }
  forwarding& fwd() { return x->fw; }
  bool head_request() const { return x->head_request; }
  bool gone() const { return x->down == nullptr; }
  void submitted(std::size_t server) {
    if (x->down) x->down->on_submitted(*x->st, server);
  }
  void finish() const {}
  awaitable<bool> interim() { co_return true; }  // not passed on to an HTTP/2 client
  awaitable<void> fail(unsigned status, std::string_view why) {
    failed(status, why, false);
    co_return;
  }
  void failed(unsigned status, std::string_view why, bool started) {
    if (auto* d = x->detach()) d->on_failed(*x->st, status, why, started);
  }

  awaitable<h1_step> send_request();
  awaitable<bool> relay();
  void deliver_head(bool body);
  void deliver_trailers(std::string& section);
  /// Waits until the client side calls (or `timeout` passes: false).
  awaitable<bool> wait(std::optional<steady::duration> timeout) {
    x->dl.expires_never();
    if (timeout) x->wake.expires_after(*timeout);
    else x->wake.expires_at(steady::time_point::max());
    auto [ec] = co_await x->wake.async_wait(nothrow);
    co_return ec == asio::error::operation_aborted;
  }
};

// The head, then the body as the client side gives it: as is with a
// content-length, chunked without one.
awaitable<h1_step> stream_client::send_request() {
  const runtime& rt = *x->rt;
  link& up = *x->fw.up.sock;
  auto [ec, n] = co_await write(x->dl, up, asio::buffer(x->head), rt.cfg.upstream_timeout);
  if (gone()) co_return h1_step::answered;
  if (!ec && x->has_body) {
    std::array<std::uint8_t, k_relay_chunk> buf;
    std::string piece;
    // body_timeout ran out: answered unless the body came meanwhile (in the
    // turn the timer completed, when body_ready() could no longer cancel it).
    bool timed_out = false;
    for (;;) {
      bool eof = false;
      const std::size_t got = x->down->take_body(*x->st, buf.data(), buf.size(), eof);
      if (got == 0 && !eof) {
        if (timed_out) {
          failed(408, "request body timed out\n", false);  // the client sent nothing for body_timeout
          co_return h1_step::answered;
        }
        timed_out = !co_await wait(rt.cfg.body_timeout);
        if (gone()) co_return h1_step::answered;
        continue;
      }
      timed_out = false;
      piece.clear();
      if (got > 0 && x->chunked_body) {
        char size_line[24];
        const int len = std::snprintf(size_line, sizeof size_line, "%zx\r\n", got);
        piece.append(size_line, static_cast<std::size_t>(len));
      }
      piece.append(reinterpret_cast<const char*>(buf.data()), got);
      if (got > 0 && x->chunked_body) piece.append("\r\n");
      if (eof && x->chunked_body) piece.append("0\r\n\r\n");
      std::tie(ec, n) = co_await write(x->dl, up, asio::buffer(piece), rt.cfg.upstream_timeout);
      if (gone()) co_return h1_step::answered;
      if (ec || eof) break;
    }
  }
  if (!ec) co_return h1_step::next;
  co_return x->dl.classify(ec) == asio::error::timed_out ? h1_step::write_timed_out : h1_step::write_failed;
}

// The head as fields (`body`: a body follows), the proxy's own lines added by the client side.
void stream_client::deliver_head(bool body) {
  const http1::response_head& res = x->fw.response;
  std::vector<h2::field> fields;
  // A length is kept when the DATA carry exactly it, and on a HEAD response (the length the GET would have).
  h2::response_fields(res, {}, res.body == http1::framing::length || x->head_request, x->arena, fields);
  x->down->on_response(*x->st, fields, !body);
}

// A chunked response's trailer section (as the decoder kept it) becomes
// the stream's trailers, names lower-cased as HTTP/2 wants them (the
// decoder refused framing and connection fields).
void stream_client::deliver_trailers(std::string& section) {
  std::vector<h2::field> kept;
  http1::trailer_fields(section, [&](std::string_view n, std::string_view v) {
    char* p = section.data() + (n.data() - section.data());
    std::transform(p, p + n.size(), p,
                   [](char ch) { return static_cast<char>(std::tolower(static_cast<unsigned char>(ch))); });
    kept.push_back({n, v});
  });
  if (!kept.empty()) x->down->on_trailers(*x->st, kept);
}

// The final response to the client side, its body in pieces as the client
// takes them. True when the whole response came.
awaitable<bool> stream_client::relay() {
  const runtime& rt = *x->rt;
  const http1::response_head& res = x->fw.response;
  if (res.status == 101) {
    metrics.upstream_reset.inc();
    failed(502, "upstream switched protocols unasked\n", false);
    co_return false;
  }
  const bool body =
      res.body != http1::framing::none && !(res.body == http1::framing::length && res.content_length == 0);
  deliver_head(body);
  if (body) {
    body_relay& relay = x->fw.relay.emplace(res.body, http1::framing::until_close, res.content_length,
                                            static_cast<std::size_t>(rt.cfg.max_header_bytes));
    std::string trailer_section;
    relay.dec.keep_trailers = &trailer_section;
    auto& in = x->fw.upstream_in;
    buffer_list& bufs = x->fw.bufs;
    for (;;) {
      if (gone()) co_return false;
      bufs.clear();
      const auto used = relay.step(view(in), bufs);
      if (!used) {
        metrics.upstream_reset.inc();
        failed(502, "upstream sent a malformed body\n", true);
        co_return false;
      }
      for (const auto& b : bufs.span()) {
        x->given += b.size();
        x->down->on_data(*x->st, {static_cast<const char*>(b.data()), b.size()});
      }
      in.consume(*used);
      if (relay.done) break;
      // A client that does not take what it asked for stalls only its stream
      // (the client side resets a stream that makes no progress).
      while (x->given >= k_response_buffer && !gone()) co_await wait(std::nullopt);
      if (gone()) co_return false;
      if (in.size() > 0) continue;
      auto [ec, n] = co_await read_more(x->dl, *x->fw.up.sock, in.prepare(k_relay_chunk), rt.cfg.upstream_timeout);
      if (gone()) co_return false;
      if (ec == asio::error::eof && relay.in_framing == http1::framing::until_close) {
        relay.eof = true;
        continue;
      }
      if (ec) {
        (x->dl.classify(ec) == asio::error::timed_out ? metrics.upstream_timeout : metrics.upstream_reset).inc();
        failed(502, "upstream failed\n", true);
        co_return false;
      }
      in.commit(n);
    }
    if (!trailer_section.empty()) deliver_trailers(trailer_section);
  }
  if (auto* d = x->detach()) d->on_end(*x->st);
  co_return true;
}

}  // namespace

void start_h1_upstream(const h1_exchange_env& env, executor_t ex, const upstream_request& req) {
  auto x = std::make_shared<h1_upstream>(ex, env.clk, req);
  req.down.attach(req.st, x.get());
  asio::co_spawn(ex, exchange_h1(env, *req.rt, req.r, stream_client{x, env.metrics}), asio::detached);
}

}  // namespace smockron::proxy
