// What nghttp2 reports of a client connection (see connection.hpp).
#include "proxy/h2/connection.hpp"

#include "proxy/request/cost.hpp"
#include "proxy/request/request_steps.hpp"

#include <algorithm>
#include <cstring>

namespace smockron::proxy {

using namespace h2_detail;

int h2_connection::on_begin_headers(nghttp2_session*, const nghttp2_frame* f, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  if (static_cast<std::int64_t>(h.streams_.size()) >= h.rt_->cfg.http2_max_concurrent_streams) {
    // Before the client has our SETTINGS it may open more: each is refused.
    h.s_.metrics.h2_too_many_streams.inc();
    h.reset(f->hd.stream_id, NGHTTP2_REFUSED_STREAM);
    return 0;
  }
  h.streams_.emplace(f->hd.stream_id, std::make_shared<h2_stream>(
                                          f->hd.stream_id, static_cast<std::size_t>(h.rt_->cfg.max_header_bytes)));
  h.c_.idle = false;
  return 0;
}

int h2_connection::on_header(nghttp2_session*, const nghttp2_frame* f, const uint8_t* name, size_t namelen,
                             const uint8_t* value, size_t valuelen, uint8_t, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  if (f->hd.type != NGHTTP2_HEADERS) return 0;
  const auto st = h.find(f->hd.stream_id);
  if (!st || st->dispatched) return 0;  // refused, or request trailers (not forwarded)
  st->fields.add({reinterpret_cast<const char*>(name), namelen}, {reinterpret_cast<const char*>(value), valuelen});
  return 0;
}

int h2_connection::on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  const auto now = h.s_.clk.steady_now();
  const bool end_stream = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  switch (f->hd.type) {
    case NGHTTP2_HEADERS: {
      const auto st = h.find(f->hd.stream_id);
      if (!st) break;
      if (!st->dispatched) {
        h.dispatch(st, end_stream);
      } else if (end_stream && !st->too_large) {  // trailers end the request body
        st->body_end = true;
        if (st->up) st->up->body_ready();
        h.body_progress(st);
      }
      break;
    }
    case NGHTTP2_DATA: {
      if (!end_stream) break;
      if (const auto st = h.find(f->hd.stream_id); st && !st->too_large) {
        st->body_end = true;
        if (st->up) st->up->body_ready();
        h.body_progress(st);
      }
      break;
    }
    default: break;
  }
  h.flooded(h.flood_.received(f->hd.type, f->hd.flags, f->hd.length, now));
  return 0;
}

int h2_connection::on_data_chunk(nghttp2_session* session, uint8_t, int32_t id, const uint8_t* data, size_t len,
                                 void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  const auto st = h.find(id);
  if (!st || st->too_large || st->refused) {
    // Nobody will read it: the window opens again at once.
    nghttp2_session_consume(session, id, len);
    return 0;
  }
  st->outcome.bytes_in += len;
  // A body over a bound (its cost, the body's size, grown past what fits;
  // or max_body_bytes) is never forwarded as if complete: answered if nothing
  // else has answered it (a cost that can never fit, or 413), else reset with
  // its upstream side.
  const auto max = h.rt_->cfg.max_body_bytes;
  const bool cut = cut_by_cost(st->outcome, st->outcome.bytes_in);
  if (cut || (max > 0 && st->outcome.bytes_in > max)) {
    st->too_large = true;
    nghttp2_session_consume(session, id, len);
    h.drop_body(*st);
    (cut ? h.s_.metrics.reject_cost_over_limit : h.s_.metrics.bad_request).inc();
    if (st->status == 0 && !st->held && !st->forwarding) {
      const refusal no = cut ? refusal_for_cost_cut(*st->r) : refusal{413, "request body too large\n", 0};
      h.answer(*st, no.status, no.text);
    } else {
      h.cancel_upstream(*st);
      h.reset(*st, NGHTTP2_CANCEL);
    }
    return 0;
  }
  nghttp2_session_consume_connection(session, len);  // the stream's part when the bytes go upstream
  st->body_in.append(reinterpret_cast<const char*>(data), len);
  if (st->up) st->up->body_ready();
  h.body_progress(st);
  return 0;
}

int h2_connection::on_stream_close(nghttp2_session*, int32_t id, uint32_t error_code, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  const auto it = h.streams_.find(id);
  if (it == h.streams_.end()) return 0;
  const auto st = it->second;
  h.streams_.erase(it);
  h.close_stream(*st, error_code);
  h.update_deadline();
  return 0;
}

int h2_connection::on_frame_send(nghttp2_session*, const nghttp2_frame* f, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  if (f->hd.type == NGHTTP2_DATA) h.flood_.data_sent();  // earns the client WINDOW_UPDATEs
  // A complete response to a request the client is still sending: it may stop
  // (RFC 9113 8.1), and the stream does not stay open on its word.
  if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) && (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    if (const auto st = h.find(f->hd.stream_id); st && !st->body_end) {
      h.drop_body(*st);
      h.reset(st->id, NGHTTP2_NO_ERROR);  // not counted against the reset bound: the answer is complete
    }
  }
  return 0;
}

int h2_connection::on_invalid_frame(nghttp2_session*, const nghttp2_frame* f, int lib_error, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  // Beyond the limit before the client acknowledged our SETTINGS: the stream
  // is refused. After: nghttp2 ends the connection (PROTOCOL_ERROR; RFC 9113
  // 5.4 lets a stream error be treated so), a client that ignores a limit it
  // acknowledged being no client to keep.
  const bool over_limit = lib_error == NGHTTP2_ERR_REFUSED_STREAM ||
                          (lib_error == NGHTTP2_ERR_PROTO && f->hd.type == NGHTTP2_HEADERS &&
                           static_cast<std::int64_t>(h.streams_.size()) >= h.rt_->cfg.http2_max_concurrent_streams);
  if (over_limit) h.s_.metrics.h2_too_many_streams.inc();
  // nghttp2 resets the stream for what the client sent (a window overflowed,
  // a malformed field section, a frame in the wrong state): a reset the
  // client caused, counted now, within the read, so that a burst of them ends
  // the connection before the streams after them in that read are opened.
  if (f->hd.stream_id != 0) {
    if (const auto st = h.find(f->hd.stream_id)) st->resetting = true;  // never forwarded now
    h.flooded(h.flood_.server_reset(NGHTTP2_PROTOCOL_ERROR, h.s_.clk.steady_now()));
  }
  return 0;
}

ssize_t h2_connection::read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                                 nghttp2_data_source* source, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  auto& st = *static_cast<h2_stream*>(source->ptr);
  const std::size_t n = std::min(length, st.pending_out());
  std::memcpy(buf, st.res().out.data() + st.res().out_at, n);
  st.res().out_at += n;
  st.outcome.bytes_out += n;
  if (n > 0) st.last_progress = h.s_.clk.coarse_steady_now();
  if (st.res().out_at == st.res().out.size()) {
    st.res().out.clear();
    st.res().out_at = 0;
  }
  if (n == 0 && !st.res().out_end) {
    st.res().deferred = true;
    return NGHTTP2_ERR_DEFERRED;
  }
  if (st.res().out_end && st.pending_out() == 0) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (!st.res().trailers.empty()) {
      *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
      const auto nv = to_nv(st.res().trailers);
      nghttp2_submit_trailer(h.session_, st.id, nv.data(), nv.size());
    }
  }
  if (n > 0 && st.up) st.up->consumed(n);  // room for more from the upstream
  return static_cast<ssize_t>(n);
}

}  // namespace smockron::proxy
