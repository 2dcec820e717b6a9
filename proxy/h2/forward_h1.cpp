// A stream's exchange with an HTTP/1.1 upstream (see connection.hpp).
#include "proxy/h2/connection.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "proxy/codec/body_relay.hpp"

namespace smockron::proxy {

using namespace h2_detail;

// A chunked response's trailer section (as the decoder kept it) becomes the
// stream's trailers, names lower-cased as HTTP/2 wants them (the decoder
// refused framing and connection fields).
void h2_connection::keep_trailers(h2_stream& st, std::string& section) {
  std::vector<h2::field> kept;
  http1::trailer_fields(section, [&](std::string_view n, std::string_view v) {
    char* p = section.data() + (n.data() - section.data());
    std::transform(p, p + n.size(), p,
                   [](char ch) { return static_cast<char>(std::tolower(static_cast<unsigned char>(ch))); });
    kept.push_back({n, v});
  });
  h2::copy_fields(kept, st.res().trailers_arena, st.res().trailers);
}

// Sends the request body to an HTTP/1.1 server as it arrives: as is with a
// content-length, chunked without one. The client's window opens as bytes go.
awaitable<bool> h2_connection::send_body_h1(h2_stream& st, connection& uc, bool chunked) {
  const runtime& rt = *st.rt;
  link& up = *uc.fwd().up.sock;
  std::string piece;
  for (;;) {
    if (st.closed) co_return false;
    if (!st.body_in.empty()) {
      piece.clear();
      const std::size_t n = st.body_in.size();
      if (chunked) {
        char size_line[24];
        const int len = std::snprintf(size_line, sizeof size_line, "%zx\r\n", n);
        piece.append(size_line, static_cast<std::size_t>(len));
      }
      piece.append(st.body_in);
      if (chunked) piece.append("\r\n");
      st.body_in.clear();
      auto [ec, wn] = co_await write(uc, up, asio::buffer(piece), rt.cfg.upstream_timeout);
      if (ec) co_return false;
      nghttp2_session_consume_stream(session_, st.id, n);  // the connection's part went at arrival
      flush();
      continue;
    }
    if (st.body_end) {
      if (chunked) {
        auto [ec, wn] = co_await write(uc, up, asio::buffer(std::string_view("0\r\n\r\n")), rt.cfg.upstream_timeout);
        if (ec) co_return false;
      }
      co_return true;
    }
    st.timer->expires_after(rt.cfg.body_timeout);
    auto [ec] = co_await st.timer->async_wait(nothrow);
    if (!ec && !st.closed && st.body_in.empty() && !st.body_end) {
      // The client sent nothing for body_timeout.
      reset(st, NGHTTP2_CANCEL);
      co_return false;
    }
  }
}

// One stream's exchange with an HTTP/1.1 server: a connection from the
// worker's pool (the same rules as an HTTP/1.1 client's), the head and body
// out, the response head in, the body back within the stream's window.
// (Two coroutines, not more: each frame is a cost every request pays.)
awaitable<void> h2_connection::forward_h1(std::shared_ptr<h2_stream> st) {
  auto self = shared_from_this();
  // Reset before its turn came (HEADERS then RST_STREAM): no upstream connection for it.
  if (st->closed) co_return;
  const runtime& rt = *st->rt;
  const route& r = *st->r;
  auto uc = std::make_shared<connection>(tcp_socket(exec_), s_.clk, rt.tick);
  st->res().up = uc;
  connection::watch(uc);
  struct closer {
    connection& c;
    ~closer() {
      c.fwd().up.release();
      c.close();
    }
  } guard{*uc};
  const auto sent = co_await exchange_head_h1(*st, *uc);
  if (!sent) co_return;
  const auto started = begin_response_h1(*st, *uc, *sent);
  if (started == response_start::failed) co_return;
  const http1::response_head& res = uc->fwd().response;
  auto& upstream_in = uc->fwd().upstream_in;
  if (started == response_start::with_body) {
    body_relay body(res.body, http1::framing::until_close, res.content_length,
                    static_cast<std::size_t>(rt.cfg.max_header_bytes));
    std::string trailer_section;  // a chunked response's trailers become the stream's
    body.dec.keep_trailers = &trailer_section;
    buffer_list& bufs = uc->fwd().bufs;
    for (;;) {
      bufs.clear();
      const auto used = body.step(view(upstream_in), bufs);
      if (!used) {
        s_.metrics.upstream_reset.inc();
        if (!st->closed) reset(*st, NGHTTP2_INTERNAL_ERROR);
        co_return;
      }
      for (const auto& b : bufs.span()) st->res().out.append(static_cast<const char*>(b.data()), b.size());
      upstream_in.consume(*used);
      if (body.done) break;
      if (st->closed) co_return;
      push_out(*st, {});
      // A client that does not take what it asked for (its window shut, or not reading) stalls only its stream.
      while (st->pending_out() >= k_stream_buffer) {
        st->timer->expires_after(rt.cfg.body_timeout);
        auto [tec] = co_await st->timer->async_wait(nothrow);
        if (st->closed) co_return;
        if (!tec && st->pending_out() >= k_stream_buffer) {
          s_.metrics.h2_stalled_window.inc();
          reset(*st, NGHTTP2_CANCEL);
          co_return;
        }
      }
      if (upstream_in.size() > 0) continue;
      auto [rec, n] =
          co_await read_more(*uc, *uc->fwd().up.sock, upstream_in.prepare(k_relay_chunk), rt.cfg.upstream_timeout);
      if (st->closed) co_return;
      if (rec == asio::error::eof && body.in_framing == http1::framing::until_close) {
        body.eof = true;
        continue;
      }
      if (rec) {
        (uc->classify(rec) == asio::error::timed_out ? s_.metrics.upstream_timeout : s_.metrics.upstream_reset).inc();
        reset(*st, NGHTTP2_INTERNAL_ERROR);
        co_return;
      }
      upstream_in.commit(n);
    }
    end_response_h1(*st, trailer_section);
  }
  if (res.keep_alive && upstream_in.size() == 0) w_.pool.give_back(rt, *uc, r.upstream_index);
}

void h2_connection::fail_h1(h2_stream& st, metrics::counter& m, unsigned status, std::string_view why) {
  m.inc();
  if (!st.closed) answer(st, status, why);
}

// The response head came (sent upstream at `sent`): counted, and submitted to the client.
h2_connection::response_start h2_connection::begin_response_h1(h2_stream& st, connection& uc, steady::time_point sent) {
  const runtime& rt = *st.rt;
  const route& r = *st.r;
  const http1::response_head& res = uc.fwd().response;
  const auto& counted = rt.upstream_metrics[r.upstream_index];
  counted.by_class[std::clamp<unsigned>(res.status / 100, 1, 5) - 1]->inc();
  counted.seconds->observe(std::chrono::duration<double>(s_.clk.steady_now() - sent).count());
  uc.fwd().upstream_in.consume(res.size);
  if (res.status == 101) {
    fail_h1(st, s_.metrics.upstream_reset, 502, "upstream switched protocols unasked\n");
    return response_start::failed;
  }
  finished(st, res.status);
  if (r.cost.after_response()) note_cost_fields(r, res.headers, st.outcome);
  std::vector<h2::field> fields;
  const bool has_body =
      res.body != http1::framing::none && !(res.body == http1::framing::length && res.content_length == 0);
  h2::response_fields(res, st.response_fields, res.body == http1::framing::length, st.res().fields_arena, fields);
  st.res().out_end = !has_body;
  submit(st, fields, has_body);
  return has_body ? response_start::with_body : response_start::without_body;
}

// The response body is complete: its trailers (a chunked response's) become the stream's.
void h2_connection::end_response_h1(h2_stream& st, std::string& trailer_section) {
  if (!trailer_section.empty()) {
    const route& r = *st.r;
    if (r.cost.after_response() && !st.outcome.cost_field) note_cost_trailer(r, trailer_section, st.outcome);
    keep_trailers(st, trailer_section);
  }
  st.res().out_end = true;
  push_out(st, {});
}

// The head (and body) out, the final response head in (1xx are not passed
// on), with the HTTP/1.1 retry rule: once, on a fresh connection, when a
// pooled one turned out dead and the request is idempotent without a body.
// The time the head went, or nothing (answered, or the stream is gone).
awaitable<std::optional<steady::time_point>> h2_connection::exchange_head_h1(h2_stream& st, connection& uc) {
  const runtime& rt = *st.rt;
  const route& r = *st.r;
  std::string head;
  head.reserve(512 + st.req.target.size());
  http1::write_request_head(head, st.req, hop(rt));
  const bool retryable = st.req.body == http1::framing::none && http1::idempotent(st.req.method);
  auto& upstream_in = uc.fwd().upstream_in;
  http1::response_head& res = uc.fwd().response;
  for (int attempt = 0;; ++attempt) {
    if (!(attempt == 0 && w_.pool.take_pooled(rt, uc, r.upstream_index, !retryable)) &&
        !co_await w_.pool.acquire(rt, uc, r.upstream_index, attempt == 0, !retryable)) {
      fail_h1(st, s_.metrics.upstream_no_server, 502, "upstream unavailable\n");
      co_return std::nullopt;
    }
    if (st.closed) {
      // Reset while the connection was taken or made: unused, it serves the next request.
      w_.pool.give_back(rt, uc, r.upstream_index);
      co_return std::nullopt;
    }
    st.outcome.server = uc.fwd().up.server;  // the access log's upstream (note_outcome)
    link& up = *uc.fwd().up.sock;
    const auto sent = s_.clk.steady_now();
    auto [wec, wn] = co_await write(uc, up, asio::buffer(head), rt.cfg.upstream_timeout);
    if (wec) {
      if (uc.fwd().up.reused && retryable && attempt == 0) continue;
      fail_h1(st, s_.metrics.upstream_reset, 502, "upstream write failed\n");
      co_return std::nullopt;
    }
    if (st.req.body != http1::framing::none && !co_await send_body_h1(st, uc, st.req.body == http1::framing::chunked)) {
      if (!st.closed) fail_h1(st, s_.metrics.upstream_reset, 502, "upstream write failed\n");  // not the client leaving
      co_return std::nullopt;
    }
    upstream_in.clear();
    boost::system::error_code ec;
    bool bad = false;
    for (std::size_t scanned = 0;;) {
      const auto parsed = http1::parse_response(view(upstream_in), k_max_response_head, st.req.head, res, scanned);
      if (parsed.status == http1::parse_status::complete) {
        if (res.status >= 200 || res.status == 101) break;
        upstream_in.consume(res.size);
        scanned = 0;
        continue;
      }
      bad = parsed.status != http1::parse_status::incomplete;
      if (bad) break;
      auto [rec, n] = co_await read_more(uc, up, upstream_in.prepare(k_head_read), rt.cfg.upstream_timeout);
      ec = rec ? uc.classify(rec) : ec;
      if (rec) break;
      upstream_in.commit(n);
    }
    if (st.closed) co_return std::nullopt;
    if (!ec && !bad) co_return sent;
    if (upstream_in.size() == 0 && uc.fwd().up.reused && retryable && attempt == 0 &&
        (ec == asio::error::eof || ec == asio::error::connection_reset)) {
      continue;
    }
    if (ec == asio::error::timed_out) fail_h1(st, s_.metrics.upstream_timeout, 504, "upstream timed out\n");
    else
      fail_h1(st, s_.metrics.upstream_reset, 502, bad ? "upstream sent a malformed response\n" : "upstream failed\n");
    co_return std::nullopt;
  }
}

}  // namespace smockron::proxy
