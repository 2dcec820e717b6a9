// An HTTP/2 client connection's life (see connection.hpp).
#include "proxy/h2/connection.hpp"

#include <algorithm>
#include <array>

namespace smockron::proxy {

using namespace h2_detail;

bool h2_connection::start() {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
  nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(cb, on_invalid_frame);
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  // Windows open as bodies go upstream, not as they arrive: a held or slow stream buffers one window at most.
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_max_continuations(opt, static_cast<size_t>(rt_->cfg.http2_max_continuations));
  // Our own reset bucket counts and answers Rapid Reset; nghttp2's would close without telling us.
  nghttp2_option_set_stream_reset_rate_limit(opt, UINT64_MAX, UINT64_MAX);
  const int rv = nghttp2_session_server_new2(&session_, cb, this, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cb);
  if (rv != 0) return false;
  const auto& cfg = rt_->cfg;
  const std::array<nghttp2_settings_entry, 3> settings = {{
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, static_cast<uint32_t>(cfg.http2_max_concurrent_streams)},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(cfg.max_header_bytes)},
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
  }};
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings.data(), settings.size());
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, k_connection_window);
  c_.idle = true;
  c_.expires_after(cfg.idle_timeout);
  return true;
}

awaitable<void> h2_connection::read_loop() {
  auto self = shared_from_this();
  // What was read before the protocol was known (the preface, perhaps more).
  if (c_.in.size() > 0) {
    const auto pre = view(c_.in);
    receive(reinterpret_cast<const std::uint8_t*>(pre.data()), pre.size());
    c_.in.consume(c_.in.size());
  }
  while (!fatal_ && nghttp2_session_want_read(session_)) {
    auto [ec, n] = co_await c_.client.async_read_some(asio::buffer(in_), nothrow);
    if (ec) break;
    receive(in_.data(), n);
  }
  reading_done_ = true;
  sweep_timer_.cancel();
  flush();
}

void h2_connection::receive(const std::uint8_t* data, std::size_t n) {
  const auto rv = nghttp2_session_mem_recv(session_, data, n);
  if (rv < 0) {
    switch (rv) {
      case NGHTTP2_ERR_TOO_MANY_CONTINUATIONS:
        abuse(s_.metrics.h2_continuation_flood, NGHTTP2_ENHANCE_YOUR_CALM);
        break;
      case NGHTTP2_ERR_FLOODED: abuse(s_.metrics.h2_ack_flood, NGHTTP2_ENHANCE_YOUR_CALM); break;
      default: abuse(s_.metrics.h2_protocol_error, NGHTTP2_PROTOCOL_ERROR); break;
    }
  }
  forward_opened();
  update_deadline();
  flush();
}

void h2_connection::gather_output() {
  if (!h2::gather(session_, out_)) fatal_ = true;
}

std::string h2_connection::take_output() {
  std::string taken = h2::take_all(session_);
  if (!out_.empty()) taken.insert(0, std::exchange(out_, {}));
  return taken;
}

awaitable<void> h2_connection::write_loop() {
  auto self = shared_from_this();
  for (;;) {
    gather_output();
    if (out_.empty()) {
      // Done when neither side has more to say (GOAWAY sent, or the client gone).
      if (fatal_ || reading_done_ || (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_)))
        break;
      write_wake_.expires_at(steady::time_point::max());
      co_await write_wake_.async_wait(nothrow);
      continue;
    }
    // What the socket takes now goes without a trip through the scheduler (as HTTP/1.1 writes).
    buffer_list pending;
    pending.add(out_.data(), out_.size());
    boost::system::error_code ec;
    if (!send_now(c_.client, pending, ec)) {
      writing_ = true;
      c_.expires_after(rt_->cfg.body_timeout);  // a client that stops reading is a slow reader
      ec = std::get<0>(co_await asio::async_write(c_.client, pending.span(), nothrow));
      writing_ = false;
    }
    out_.clear();
    if (ec) {
      fatal_ = true;
      break;
    }
    update_deadline();
  }
  // The read loop may be waiting on the socket: it ends with it.
  sweep_timer_.cancel();
  boost::system::error_code ignored;
  c_.client.socket().cancel(ignored);
  c_.client.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

void h2_connection::update_deadline() {
  if (s_.draining && !goaway_sent_ && !fatal_) {
    // Draining: no new streams; those under way finish (RFC 9113 6.8).
    goaway_sent_ = true;
    nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(session_),
                          NGHTTP2_NO_ERROR, nullptr, 0);
    flush();
  }
  if (writing_) return;  // the write's own deadline stands
  c_.idle = streams_.empty();
  if (streams_.empty()) {
    if (s_.draining && !fatal_) {
      // Draining: an idle connection says GOAWAY and ends.
      nghttp2_session_terminate_session(session_, NGHTTP2_NO_ERROR);
      flush();
    }
    c_.expires_after(rt_->cfg.idle_timeout);
  } else {
    c_.expires_never();
  }
}

// A response that makes no progress for body_timeout (the client's window
// shut, or it stopped reading) is reset, whatever else the connection does:
// each stream is bounded, not only the connection's writes. The streams'
// upstream exchanges have their deadlines enforced here too (an HTTP/1.1
// one has no timer of its own), so the period is at most `tick`.
awaitable<void> h2_connection::sweep_loop() {
  auto self = shared_from_this();
  const auto timeout = rt_->cfg.body_timeout;
  const auto period = std::min<steady::duration>(
      std::clamp<steady::duration>(timeout / 4, std::chrono::milliseconds(10), std::chrono::seconds(1)), rt_->tick);
  std::vector<std::shared_ptr<h2_stream>> stalled;
  while (!reading_done_ && !fatal_) {
    sweep_timer_.expires_after(period);
    co_await sweep_timer_.async_wait(nothrow);
    if (reading_done_ || fatal_) break;
    const auto now = s_.clk.steady_now();
    for (const auto& [id, st] : streams_) {
      if (st->pending_out() > 0 && now - st->last_progress >= timeout) stalled.push_back(st);
      else if (st->up) st->up->sweep(now);
    }
    for (const auto& st : stalled) {
      s_.metrics.h2_stalled_window.inc();
      cancel_upstream(*st);
      reset(*st, NGHTTP2_CANCEL);
    }
    stalled.clear();
  }
}

void h2_connection::abuse(metrics::counter& kind, nghttp2_error_code code) {
  kind.inc();
  ending_ = true;  // nothing more of this connection goes upstream
  if (session_) nghttp2_session_terminate_session(session_, code);
  flush();
}

void h2_connection::teardown() {
  // The connection is gone: every stream still open ends as if the client reset it.
  auto streams = std::move(streams_);
  for (auto& [id, st] : streams) close_stream(*st, NGHTTP2_CANCEL);
}

awaitable<void> serve_h2(shared_state& s, worker& w, std::shared_ptr<connection> conn,
                         std::shared_ptr<const runtime> rt, const ip_address& peer, std::string peer_text) {
  auto h = std::make_shared<h2_connection>(s, w, std::move(conn), std::move(rt), peer, std::move(peer_text));
  co_await h->run();
}

}  // namespace smockron::proxy
