// What nghttp2 reports of an HTTP/2 upstream connection (see h2_upstream_conn.hpp).
#include "proxy/upstream/h2_upstream_conn.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>

namespace smockron::proxy {

using namespace h2_upstream_detail;

int h2_upstream_conn::on_header(nghttp2_session* session, const nghttp2_frame* f, const uint8_t* name, size_t namelen,
                                const uint8_t* value, size_t valuelen, uint8_t, void*) {
  if (f->hd.type != NGHTTP2_HEADERS) return 0;
  auto* s = static_cast<h2_upstream_stream*>(nghttp2_session_get_stream_user_data(session, f->hd.stream_id));
  if (!s || !s->down) return 0;
  const auto n = static_cast<std::uint32_t>(s->resp_arena.size());
  s->resp_arena.append(reinterpret_cast<const char*>(name), namelen);
  const auto v = static_cast<std::uint32_t>(s->resp_arena.size());
  s->resp_arena.append(reinterpret_cast<const char*>(value), valuelen);
  s->resp.push_back({n, static_cast<std::uint32_t>(namelen), v, static_cast<std::uint32_t>(valuelen)});
  return 0;
}

int h2_upstream_conn::on_frame_recv(nghttp2_session* session, const nghttp2_frame* f, void* ud) {
  auto& c = *static_cast<h2_upstream_conn*>(ud);
  if (f->hd.type == NGHTTP2_GOAWAY) {
    c.goaway = true;  // no new streams here; those under way finish
    return 0;
  }
  if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) return 0;
  auto* s = static_cast<h2_upstream_stream*>(nghttp2_session_get_stream_user_data(session, f->hd.stream_id));
  if (!s || !s->down) return 0;
  s->last_activity = c.pool.clk.steady_now();
  const bool end_stream = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (f->hd.type == NGHTTP2_HEADERS) {
    const auto fields = s->response();
    if (!s->got_head) {
      // 1xx heads are not passed on; the final one is.
      const bool interim = !fields.empty() && fields.front().name == ":status" && fields.front().value.starts_with('1');
      if (!interim) {
        s->got_head = true;
        const auto& counted = c.rt->upstream_metrics[c.upstream];
        const unsigned code = fields.empty() ? 0 : static_cast<unsigned>(fields.front().value[0] - '0');
        counted.by_class[std::clamp<unsigned>(code, 1, 5) - 1]->inc();
        counted.seconds->observe(std::chrono::duration<double>(s->last_activity - s->sent).count());
        s->down->on_response(*s->st, fields, end_stream);
      }
    } else {
      s->down->on_trailers(*s->st, fields);
    }
    s->resp.clear();
    s->resp_arena.clear();
  }
  if (end_stream && s->got_head) {
    if (auto* d = s->detach()) d->on_end(*s->st);
  }
  return 0;
}

int h2_upstream_conn::on_data_chunk(nghttp2_session* session, uint8_t, int32_t id, const uint8_t* data, size_t len,
                                    void*) {
  auto* s = static_cast<h2_upstream_stream*>(nghttp2_session_get_stream_user_data(session, id));
  if (!s || !s->down) {
    nghttp2_session_consume(session, id, len);  // nobody reads it
    return 0;
  }
  // The connection's window opens at once, the stream's as the client takes
  // the bytes: a slow client stalls its own stream (one window buffered), never its neighbours.
  nghttp2_session_consume_connection(session, len);
  s->down->on_data(*s->st, {reinterpret_cast<const char*>(data), len});
  return 0;
}

int h2_upstream_conn::on_stream_close(nghttp2_session*, int32_t id, uint32_t error_code, void* ud) {
  auto& c = *static_cast<h2_upstream_conn*>(ud);
  const auto it = c.streams.find(id);
  if (it == c.streams.end()) return 0;
  auto s = std::move(it->second);
  c.streams.erase(it);
  // Refused unprocessed (REFUSED_STREAM, or beyond a GOAWAY's last stream,
  // RFC 9113 8.7): safe to send again elsewhere, if no body byte went yet.
  if (s->down && error_code == NGHTTP2_REFUSED_STREAM && !s->got_head && !s->body_sent && ++s->attempts < k_attempts) {
    s->id = -1;
    s->deferred = false;
    s->conn = nullptr;  // the client's calls wait for its next connection
    // The same object goes on (the client stream points to it), on the next turn: not from within nghttp2's call.
    auto held = std::make_shared<std::unique_ptr<h2_upstream_stream>>(std::move(s));
    asio::post(c.pool.ex, [&pool = c.pool, alive = c.alive, held] {
      if (*alive && (*held)->down) pool.place(std::move(*held));
    });
    return 0;
  }
  if (auto* d = s->detach()) {
    if (error_code != NGHTTP2_NO_ERROR) c.pool.metrics.upstream_reset.inc();
    d->on_failed(*s->st, 502, "upstream reset the stream\n", s->got_head);
  }
  if (c.active() == 0) c.idle_since = c.pool.clk.steady_now();
  return 0;
}

ssize_t h2_upstream_conn::read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                                    nghttp2_data_source* source, void*) {
  auto* s = static_cast<h2_upstream_stream*>(source->ptr);
  if (!s->down) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // the client left: the stream is reset
  bool eof = false;
  const std::size_t n = s->down->take_body(*s->st, buf, length, eof);
  if (n == 0 && !eof) {
    s->deferred = true;
    return NGHTTP2_ERR_DEFERRED;
  }
  if (eof) *flags |= NGHTTP2_DATA_FLAG_EOF;
  if (n > 0) s->body_sent = true;
  return static_cast<ssize_t>(n);
}

}  // namespace smockron::proxy
