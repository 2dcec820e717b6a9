// An HTTP/1.1 client's request on an HTTP/2 upstream (see bridge.hpp).
#include "proxy/http1/bridge.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "proxy/codec/body_relay.hpp"
#include "proxy/request/cost.hpp"
#include "proxy/request/h2_stream.hpp"
#include "proxy/request/request_steps.hpp"
#include "proxy/upstream/h2_upstream.hpp"

namespace smockron::proxy {

using namespace asio::experimental::awaitable_operators;

namespace {

// An HTTP/1.1 client's request on an HTTP/2 upstream: the upstream stream's
// events arrive here and wake the coroutine that writes the response.
class h1_bridge : public downstream {
public:
  h1_bridge(executor_t ex, std::size_t max_header) : st(1, max_header), body_wake(ex), resp_wake(ex) {}

  void on_response(h2_stream&, const std::vector<h2::field>& f, bool end_stream) override {
    h2::copy_fields(f, head_arena, head);
    got_head = true;
    ended = end_stream;
    resp_wake.cancel();
  }
  void on_data(h2_stream&, std::string_view data) override {
    st.res().out.append(data);
    resp_wake.cancel();
  }
  void on_trailers(h2_stream&, const std::vector<h2::field>& f) override {
    h2::copy_fields(f, trailer_arena, trailers);
  }
  void on_end(h2_stream&) override {
    st.up = nullptr;
    ended = true;
    resp_wake.cancel();
    body_wake.cancel();
  }
  void on_failed(h2_stream&, unsigned status, std::string_view why, bool started) override {
    st.up = nullptr;
    failed = status;
    failed_why = why;
    failed_started = started;
    resp_wake.cancel();
    body_wake.cancel();
  }
  std::size_t take_body(h2_stream&, std::uint8_t* buf, std::size_t n, bool& eof) override {
    const std::size_t taken = st.take_body(buf, n, eof);
    if (taken > 0) body_wake.cancel();  // room to read more from the client
    return taken;
  }
  void attach(h2_stream&, upstream_exchange* up) override { st.up = up; }
  void on_submitted(h2_stream&, std::size_t server) override { st.outcome.server = server; }

  h2_stream st;  ///< the request body and response bytes (no client session behind it)
  steady_timer body_wake, resp_wake;
  std::string head_arena, trailer_arena;
  std::vector<h2::field> head, trailers;
  bool got_head = false, ended = false, failed_started = false, body_done = false, body_failed = false;
  bool response_done = false;  ///< the response side finished (or the client went away)
  unsigned failed = 0;
  std::string_view failed_why;
};

// Reads the request body from the client (bytes after the head in c.in
// first) and hands its payload to the upstream stream, at most one chunk
// ahead of what the upstream took.
awaitable<void> pump_body(h1_bridge& b, connection& c, const runtime& rt, proxy_metrics& metrics) {
  const http1::request_head& req = c.request;
  body_relay relay(req.body, http1::framing::until_close, req.content_length,
                   static_cast<std::size_t>(rt.cfg.max_header_bytes));
  buffer_list bufs;
  for (;;) {
    bufs.clear();
    const auto used = relay.step(view(c.in), bufs);
    if (!used) {
      b.body_failed = true;
      break;
    }
    // Over a bound, the step's bytes never go: the upstream stream is reset, never ended.
    if (cut_by_cost(c.outcome, relay.data_bytes)) {
      metrics.reject_cost_over_limit.inc();  // counted before the refusal goes out
      b.body_failed = true;
      break;
    }
    if (rt.cfg.max_body_bytes > 0 && relay.data_bytes > rt.cfg.max_body_bytes) {
      b.body_failed = true;
      break;
    }
    for (const auto& x : bufs.span()) b.st.body_in.append(static_cast<const char*>(x.data()), x.size());
    b.st.outcome.bytes_in = relay.data_bytes;
    c.in.consume(*used);
    if (relay.done) b.st.body_end = true;
    if (b.st.up) b.st.up->body_ready();
    if (relay.done) {
      b.body_done = true;
      co_return;
    }
    while (b.st.body_in.size() - b.st.body_at >= k_relay_chunk && !b.ended && b.failed == 0 && !b.response_done) {
      b.body_wake.expires_at(steady::time_point::max());
      co_await b.body_wake.async_wait(nothrow);
    }
    // Answered (or failed, or the client gone) before the body was all sent.
    if (b.ended || b.failed != 0 || b.response_done) co_return;
    if (c.in.size() > 0) continue;
    auto [ec, n] = co_await read_more(c, c.client, c.in.prepare(k_relay_chunk), rt.cfg.body_timeout);
    if (ec) {
      b.body_failed = true;
      break;
    }
    c.in.commit(n);
  }
  // The client's body failed: the upstream stream is reset, the response side learns it.
  if (b.st.up) {
    b.st.up->cancel();
    b.st.up = nullptr;
  }
  b.resp_wake.cancel();
}

// Writes the response to the client as the upstream's events come.
awaitable<connection_next> pump_response(h1_bridge& b, connection& c, const runtime& rt, const route& r,
                                         bool& chunked) {
  const unsigned version = c.request.version >= 11 ? 11 : 10;
  const auto wait = [&]() -> awaitable<void> {
    b.resp_wake.expires_at(steady::time_point::max());
    co_await b.resp_wake.async_wait(nothrow);
  };
  while (!b.got_head && b.failed == 0 && !b.body_failed) co_await wait();
  if (!b.got_head) {
    if (c.outcome.cost_cut) {  // its body grew past what its cost may
      const refusal no = refusal_for_cost_cut(r);
      c.outcome.status = no.status;
      co_return co_await respond(c, version, no.status, no.text, false);
    }
    const unsigned status = b.body_failed ? 400 : b.failed;
    c.outcome.status = status;
    co_return co_await respond(
        c, version, status, b.body_failed ? std::string_view("bad request: the request body failed\n") : b.failed_why,
        false);
  }
  unsigned status = 0;
  bool has_length = false;
  for (const auto& f : b.head) {
    if (f.name == ":status") status = static_cast<unsigned>(std::atoi(std::string(f.value).c_str()));
    if (f.name == "content-length") has_length = true;
  }
  c.outcome.status = status;
  const bool no_body = c.request.head || status == 204 || status == 304 || (b.ended && b.st.pending_out() == 0);
  chunked = !no_body && !has_length && version >= 11;
  const bool until_close = !no_body && !has_length && version < 11;
  std::string& out = c.out;
  out.clear();
  out.append(version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ").append(std::to_string(status)).append(" ");
  out.append(http1::reason_phrase(status).empty() ? "-" : http1::reason_phrase(status)).append("\r\n");
  for (const auto& f : b.head) {
    if (f.name.starts_with(':')) continue;
    out.append(f.name).append(": ").append(f.value).append("\r\n");
  }
  if (no_body && !has_length && !c.request.head && status != 204 && status != 304) out.append("content-length: 0\r\n");
  if (chunked) out.append("transfer-encoding: chunked\r\n");
  out.append(c.response_fields);
  if (until_close) out.append("connection: close\r\n");
  out.append("\r\n");
  std::string piece;
  for (bool first = true;; first = false) {
    auto& res = b.st.res();
    const std::size_t n = res.out.size() - res.out_at;
    piece.clear();
    if (first) piece.swap(out);
    if (n > 0 && !no_body) {
      if (chunked) {
        char line[24];
        const int len = std::snprintf(line, sizeof line, "%zx\r\n", n);
        piece.append(line, static_cast<std::size_t>(len));
      }
      piece.append(res.out, res.out_at, n);
      if (chunked) piece.append("\r\n");
      c.outcome.bytes_out += n;
    }
    res.out.clear();
    res.out_at = 0;
    const bool last = b.ended || b.failed != 0;
    if (last && chunked && b.failed == 0) {
      piece.append("0\r\n");
      for (const auto& t : b.trailers) piece.append(t.name).append(": ").append(t.value).append("\r\n");
      piece.append("\r\n");
    }
    if (!piece.empty()) {
      auto [ec, wn] = co_await write(c, c.client, asio::buffer(piece), rt.cfg.body_timeout);
      if (ec) co_return connection_next::ends;
      if (n > 0 && b.st.up) b.st.up->consumed(n);
    }
    if (last) break;
    if (b.body_failed) co_return connection_next::ends;
    // The flags are looked at again after the write: an end that came meanwhile found no wait to cancel.
    if (b.st.pending_out() == 0 && !b.ended && b.failed == 0 && !b.body_failed) co_await wait();
  }
  // A response that failed midway can only be ended by closing.
  co_return goes_on_if(b.failed == 0 && !until_close);
}

}  // namespace

awaitable<connection_next> forward_to_h2(shared_state& s, worker& w, std::shared_ptr<const runtime> rt, const route& r,
                                         connection& c, const http1::forward_info& hop) {
  http1::request_head& req = c.request;
  if (req.expect_continue && req.body != http1::framing::none && req.version >= 11) {
    static constexpr std::string_view k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
    auto [ec, n] = co_await write(c, c.client, asio::buffer(k_continue), rt->cfg.body_timeout);
    if (ec) co_return connection_next::ends;
  }
  h1_bridge b(c.client.get_executor(), static_cast<std::size_t>(rt->cfg.max_header_bytes));
  b.st.req = req;
  // The fields go into the upstream stream now: the head's bytes may go after this.
  w.h2_pool.start(upstream_request{b.st, b, req, hop, rt, r});
  c.in.consume(req.size);
  if (!c.early.empty()) {  // what came while it was held follows what came with the head
    const auto room = c.in.prepare(c.early.size());
    std::memcpy(room.data(), c.early.data(), c.early.size());
    c.in.commit(c.early.size());
    std::string().swap(c.early);
  }
  if (req.body == http1::framing::none) b.st.body_end = b.body_done = true;
  bool chunked = false;
  connection_next next = connection_next::ends;
  if (req.body == http1::framing::none) {
    next = co_await pump_response(b, c, *rt, r, chunked);
  } else {
    const auto both = [&]() -> awaitable<void> {
      co_await (pump_body(b, c, *rt, s.metrics) && [&]() -> awaitable<void> {
        next = co_await pump_response(b, c, *rt, r, chunked);
        // The body pump stops: waiting for room the upstream may never make, or
        // for client bytes nobody will take (the connection ends then).
        b.response_done = true;
        b.body_wake.cancel();
        if (!b.body_done) {
          boost::system::error_code ignored;
          c.client.socket().cancel(ignored);
        }
      }());
    };
    co_await both();
  }
  c.outcome.bytes_in = b.st.outcome.bytes_in;
  c.outcome.server = b.st.outcome.server;  // the bridge's stream kept these (the client's outcome has the rest)
  if (r.cost.after_response()) {           // charged by the session once this returns
    note_cost_fields(r, b.head, c.outcome);
    if (!c.outcome.cost_field) note_cost_fields(r, b.trailers, c.outcome);
  }
  if (b.st.up) {
    b.st.up->cancel();  // the client went away first
    b.st.up = nullptr;
  }
  if (!b.body_done || s.draining || !req.keep_alive) next = connection_next::ends;
  co_return next;
}

}  // namespace smockron::proxy
