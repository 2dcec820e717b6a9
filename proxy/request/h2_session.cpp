// An HTTP/2 client connection (see h2_session.hpp).
#include "proxy/request/h2_session.hpp"

#include <nghttp2/nghttp2.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "proxy/codec/h2_fields.hpp"
#include "proxy/request/h2_upstream.hpp"
#include "proxy/request/request_steps.hpp"

namespace smockron::proxy {

using namespace asio::experimental::awaitable_operators;

namespace {

constexpr std::size_t k_read_size = 16384;
constexpr std::size_t k_write_batch = 65536;  // frame bytes gathered into one write at most
/// Response bytes a stream buffers before its upstream is read again.
constexpr std::size_t k_stream_buffer = 65536;
/// The connection's receive window: request bodies of many streams at once
/// (each stream's own stays at the default 64 KiB, so a held stream buffers at most that).
constexpr std::int32_t k_connection_window = 1 << 20;

// A token bucket: `burst` at most, refilled at `rate` per second.
struct bucket {
  double tokens, burst, rate;
  steady::time_point last;
  bucket(std::int64_t b, std::int64_t r, steady::time_point now)
      : tokens(static_cast<double>(b)), burst(static_cast<double>(b)), rate(static_cast<double>(r)), last(now) {}
  bool take(steady::time_point now) {
    tokens = std::min(burst, tokens + rate * std::chrono::duration<double>(now - last).count());
    last = now;
    if (tokens < 1) return false;
    tokens -= 1;
    return true;
  }
};

std::vector<nghttp2_nv> to_nv(const std::vector<h2::field>& fields) {
  std::vector<nghttp2_nv> nv;
  nv.reserve(fields.size());
  for (const auto& f : fields) {
    nv.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(f.name.data())),
                  reinterpret_cast<uint8_t*>(const_cast<char*>(f.value.data())), f.name.size(), f.value.size(),
                  NGHTTP2_NV_FLAG_NONE});
  }
  return nv;
}

}  // namespace

/// One stream: a request and what answers it.
struct h2_stream {
  h2_stream(std::int32_t i, std::size_t max_header) : id(i), fields(max_header) {}

  std::int32_t id;
  h2::request_fields fields;
  http1::request_head req;
  std::string target;  ///< a rewritten target (req.target points here then)
  std::shared_ptr<const runtime> rt;
  const route* r = nullptr;
  admission adm;
  std::unique_ptr<access_entry> entry;
  steady::time_point started{}, held_from{};
  /// The hold's timer, then the forwarder's wake-up (cancelled when something it waits for happens).
  std::unique_ptr<steady_timer> timer;
  bool dispatched = false;  ///< its head was complete and it was decided
  bool grpc = false;
  bool held = false;
  bool closed = false;    ///< nghttp2 closed it: done, or reset by the client
  bool body_end = false;  ///< the client's END_STREAM arrived
  bool too_large = false;
  bool refused = false;     ///< its body is not wanted (answered by the proxy, or done): read and dropped
  bool forwarding = false;  ///< handed to its upstream
  std::string body_in;      ///< request body bytes not yet sent upstream
  std::size_t body_at = 0;  ///< of which taken already (an HTTP/2 upstream takes them piecewise)
  std::uint64_t body_bytes = 0;
  std::uint64_t bytes_out = 0;
  steady::time_point last_progress{};  ///< response bytes last taken by nghttp2 (or first buffered)
  unsigned status = 0;
  std::string response_fields;        ///< the proxy's own lines (limit fields) for whatever answers
  h2_upstream_stream* up2 = nullptr;  ///< the HTTP/2 upstream stream, while forwarding
  request_outcome cost_seen;          ///< the response's cost field (a route whose cost is read from the response)
  /// What answering uses, made when the stream is answered or forwarded: a
  /// held stream does not carry it (most of its memory otherwise).
  struct response {
    std::string out;  ///< response body bytes nghttp2 has not taken yet
    std::size_t out_at = 0;
    bool out_end = false;            ///< no more response body bytes will come
    bool deferred = false;           ///< nghttp2 waits for body bytes (resume when some come)
    std::string fields_arena;        ///< bytes of the submitted response's fields
    std::shared_ptr<connection> up;  ///< the HTTP/1.1 upstream side, while forwarding
    std::string trailers_arena;
    std::vector<h2::field> trailers;  ///< response trailers (from an HTTP/2 upstream)
  };
  std::unique_ptr<response> res_;
  response& res() {
    if (!res_) res_ = std::make_unique<response>();
    return *res_;
  }

  /// Request body bytes for an HTTP/2 upstream: at most `n` into `buf`; `eof` once all are taken and the body ended.
  std::size_t take_body(std::uint8_t* buf, std::size_t n, bool& eof) {
    const std::size_t taken = std::min(n, body_in.size() - body_at);
    std::memcpy(buf, body_in.data() + body_at, taken);
    body_at += taken;
    if (body_at == body_in.size()) {
      body_in.clear();
      body_at = 0;
    }
    eof = body_end && body_in.empty();
    return taken;
  }
  std::size_t pending_out() const { return res_ ? res_->out.size() - res_->out_at : 0; }
  /// Wakes the forwarder (a held stream's timer is its hold: left alone).
  void wake() {
    if (timer && !held) timer->cancel();
  }
};

class h2_connection : public std::enable_shared_from_this<h2_connection>, public h2_downstream {
public:
  h2_connection(shared_state& s, worker& w, std::shared_ptr<connection> conn, std::shared_ptr<const runtime> rt,
                const ip_address& peer, std::string peer_text)
      : s_(s),
        w_(w),
        conn_(std::move(conn)),
        c_(*conn_),
        rt_(std::move(rt)),
        peer_(peer),
        peer_text_(std::move(peer_text)),
        exec_(c_.client.get_executor()),
        write_wake_(exec_),
        sweep_timer_(exec_),
        resets_(rt_->cfg.http2_reset_burst, rt_->cfg.http2_reset_rate, s.clk.steady_now()),
        control_(rt_->cfg.http2_control_burst, rt_->cfg.http2_control_rate, s.clk.steady_now()) {}

  ~h2_connection() override {
    if (session_) nghttp2_session_del(session_);
  }

  awaitable<void> run() {
    if (!start()) co_return;
    auto self = shared_from_this();
    co_await (read_loop() && write_loop() && sweep_loop());
    teardown();
  }

  // h2_downstream: an HTTP/2 upstream stream reports to its client stream.
  void on_response(h2_stream& st, const std::vector<h2::field>& fields, bool end_stream) override;
  void on_data(h2_stream& st, std::string_view data) override;
  void on_trailers(h2_stream& st, const std::vector<h2::field>& fields) override;
  void on_end(h2_stream& st) override;
  void on_failed(h2_stream& st, unsigned status, std::string_view why, bool response_started) override;
  std::size_t take_body(h2_stream& st, std::uint8_t* buf, std::size_t n, bool& eof) override;
  void attach(h2_stream& st, h2_upstream_stream* up) override { st.up2 = up; }

private:
  bool start();
  awaitable<void> read_loop();
  awaitable<void> write_loop();
  awaitable<void> sweep_loop();
  void flush() { write_wake_.cancel(); }
  void teardown();
  void update_deadline();
  void abuse(metrics::counter& kind, nghttp2_error_code code);

  // nghttp2 callbacks.
  static int on_begin_headers(nghttp2_session*, const nghttp2_frame* f, void* ud);
  static int on_header(nghttp2_session*, const nghttp2_frame* f, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t flags, void* ud);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* ud);
  static int on_data_chunk(nghttp2_session*, uint8_t flags, int32_t id, const uint8_t* data, size_t len, void* ud);
  static int on_stream_close(nghttp2_session*, int32_t id, uint32_t error_code, void* ud);
  static int on_frame_send(nghttp2_session*, const nghttp2_frame* f, void* ud);
  static int on_invalid_frame(nghttp2_session*, const nghttp2_frame* f, int lib_error, void* ud);
  static ssize_t read_body(nghttp2_session*, int32_t id, uint8_t* buf, size_t length, uint32_t* flags,
                           nghttp2_data_source* source, void* ud);

  std::shared_ptr<h2_stream> find(std::int32_t id) {
    const auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second;
  }
  void dispatch(const std::shared_ptr<h2_stream>& st, bool end_stream);
  void release(const std::shared_ptr<h2_stream>& st);
  void start_forward(const std::shared_ptr<h2_stream>& st);
  awaitable<void> forward_h1(std::shared_ptr<h2_stream> st);
  awaitable<bool> send_body_h1(h2_stream& st, connection& uc, bool chunked);
  void keep_trailers(h2_stream& st, std::string& section);
  void close_stream(h2_stream& st, std::uint32_t error_code);

  /// Submits a response: `fields`, then the body in st.res().out (`with_body`).
  void submit(h2_stream& st, const std::vector<h2::field>& fields, bool with_body);
  /// A response of the proxy's own (gRPC calls get a trailers-only one, with `grpc_status` when set).
  void answer(h2_stream& st, unsigned status, std::string_view text, std::int64_t retry_after_s = 0,
              unsigned grpc_status = 0, std::int64_t pushback_ms = -1);
  void push_out(h2_stream& st, std::string_view data);
  /// The request body will not be read: what is buffered and what comes gives its window back at once.
  void drop_body(h2_stream& st) {
    st.refused = true;
    if (const std::size_t unread = st.body_in.size() - st.body_at; unread > 0) {
      nghttp2_session_consume(session_, st.id, unread);  // the connection's part even once the stream closed
      flush();
    }
    st.body_in.clear();
    st.body_at = 0;
  }
  /// Stops the stream's upstream exchange (HTTP/1.1 socket or HTTP/2 stream).
  void cancel_upstream(h2_stream& st) {
    if (st.res_ && st.res_->up && st.res_->up->forwarding_ && st.res_->up->forwarding_->up.sock) {
      boost::system::error_code ignored;
      st.res_->up->forwarding_->up.sock->socket().cancel(ignored);
    }
    if (st.up2) {
      h2_upstream_cancel(*st.up2);
      st.up2 = nullptr;
    }
  }
  void reset(h2_stream& st, nghttp2_error_code code) {
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, st.id, code);
    flush();
  }
  void finished(h2_stream& st, unsigned status) {
    st.status = status;
    if (st.entry) st.entry->status = status;
  }
  http1::forward_info hop(const runtime& rt) const;

  shared_state& s_;
  worker& w_;
  std::shared_ptr<connection> conn_;
  connection& c_;
  std::shared_ptr<const runtime> rt_;
  ip_address peer_;
  std::string peer_text_;
  executor_t exec_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<std::int32_t, std::shared_ptr<h2_stream>> streams_;
  steady_timer write_wake_;
  steady_timer sweep_timer_;
  std::string out_;
  std::array<std::uint8_t, k_read_size> in_{};
  bucket resets_, control_;
  std::uint64_t window_credit_ = 0;  ///< WINDOW_UPDATEs the proxy's DATA frames earned
  bool reading_done_ = false;
  bool writing_ = false;
  bool goaway_sent_ = false;
  bool fatal_ = false;
};

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
    const auto rv = nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(pre.data()), pre.size());
    c_.in.consume(c_.in.size());
    if (rv < 0) {
      abuse(s_.metrics.h2_protocol_error, NGHTTP2_PROTOCOL_ERROR);
    }
    flush();
  }
  while (!fatal_ && nghttp2_session_want_read(session_)) {
    auto [ec, n] = co_await c_.client.async_read_some(asio::buffer(in_), nothrow);
    if (ec) break;
    const auto rv = nghttp2_session_mem_recv(session_, in_.data(), n);
    if (rv < 0) {
      switch (rv) {
        case NGHTTP2_ERR_TOO_MANY_CONTINUATIONS:
          abuse(s_.metrics.h2_continuation_flood, NGHTTP2_ENHANCE_YOUR_CALM);
          break;
        case NGHTTP2_ERR_FLOODED: abuse(s_.metrics.h2_ack_flood, NGHTTP2_ENHANCE_YOUR_CALM); break;
        default: abuse(s_.metrics.h2_protocol_error, NGHTTP2_PROTOCOL_ERROR); break;
      }
    }
    update_deadline();
    flush();
  }
  reading_done_ = true;
  sweep_timer_.cancel();
  flush();
}

awaitable<void> h2_connection::write_loop() {
  auto self = shared_from_this();
  for (;;) {
    while (out_.size() < k_write_batch) {
      const uint8_t* data = nullptr;
      const auto n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) {
        fatal_ = true;
        break;
      }
      if (n == 0) break;
      out_.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    }
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
// each stream is bounded, not only the connection's writes.
awaitable<void> h2_connection::sweep_loop() {
  auto self = shared_from_this();
  const auto timeout = rt_->cfg.body_timeout;
  const auto period = std::clamp<steady::duration>(timeout / 4, std::chrono::milliseconds(10), std::chrono::seconds(1));
  std::vector<std::shared_ptr<h2_stream>> stalled;
  while (!reading_done_ && !fatal_) {
    sweep_timer_.expires_after(period);
    co_await sweep_timer_.async_wait(nothrow);
    if (reading_done_ || fatal_) break;
    const auto now = s_.clk.steady_now();
    for (const auto& [id, st] : streams_) {
      if (st->pending_out() > 0 && now - st->last_progress >= timeout) stalled.push_back(st);
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
  if (session_) nghttp2_session_terminate_session(session_, code);
  flush();
}

void h2_connection::teardown() {
  // The connection is gone: every stream still open ends as if the client reset it.
  auto streams = std::move(streams_);
  for (auto& [id, st] : streams) close_stream(*st, NGHTTP2_CANCEL);
}

// ---------------------------------------------------------------------------- callbacks

int h2_connection::on_begin_headers(nghttp2_session*, const nghttp2_frame* f, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  if (static_cast<std::int64_t>(h.streams_.size()) >= h.rt_->cfg.http2_max_concurrent_streams) {
    // Before the client has our SETTINGS it may open more: each is refused.
    h.s_.metrics.h2_too_many_streams.inc();
    nghttp2_submit_rst_stream(h.session_, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_REFUSED_STREAM);
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
        st->wake();
        if (st->up2) h2_upstream_body_ready(*st->up2);
      }
      break;
    }
    case NGHTTP2_DATA: {
      if (f->hd.length == 0 && !end_stream && !h.control_.take(now)) {
        h.abuse(h.s_.metrics.h2_control_flood, NGHTTP2_ENHANCE_YOUR_CALM);
        break;
      }
      if (!end_stream) break;
      if (const auto st = h.find(f->hd.stream_id); st && !st->too_large) {
        st->body_end = true;
        st->wake();
        if (st->up2) h2_upstream_body_ready(*st->up2);
      }
      break;
    }
    case NGHTTP2_RST_STREAM:
      if (!h.resets_.take(now)) h.abuse(h.s_.metrics.h2_rapid_reset, NGHTTP2_ENHANCE_YOUR_CALM);
      break;
    case NGHTTP2_WINDOW_UPDATE:
      if (h.window_credit_ > 0) {
        --h.window_credit_;
        break;
      }
      [[fallthrough]];
    case NGHTTP2_SETTINGS:
    case NGHTTP2_PING:
    case NGHTTP2_PRIORITY:
      if ((f->hd.flags & NGHTTP2_FLAG_ACK) != 0 && f->hd.type != NGHTTP2_WINDOW_UPDATE &&
          f->hd.type != NGHTTP2_PRIORITY)
        break;  // an acknowledgement of ours
      if (!h.control_.take(now)) h.abuse(h.s_.metrics.h2_control_flood, NGHTTP2_ENHANCE_YOUR_CALM);
      break;
    default: break;
  }
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
  st->body_bytes += len;
  const auto max = h.rt_->cfg.max_body_bytes;
  if (max > 0 && st->body_bytes > max) {
    // Never forwarded as if complete: answered 413 if nothing else has, else reset with its upstream side.
    st->too_large = true;
    nghttp2_session_consume(session, id, len);
    h.drop_body(*st);
    h.s_.metrics.bad_request.inc();
    if (st->status == 0 && !st->held && !st->forwarding) {
      h.answer(*st, 413, "request body too large\n");
    } else {
      h.cancel_upstream(*st);
      h.reset(*st, NGHTTP2_CANCEL);
    }
    return 0;
  }
  st->body_in.append(reinterpret_cast<const char*>(data), len);
  st->wake();
  if (st->up2) h2_upstream_body_ready(*st->up2);
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
  // Each DATA frame sent earns the client a WINDOW_UPDATE for the stream and one for the connection.
  if (f->hd.type == NGHTTP2_DATA) h.window_credit_ += 2;
  // A complete response to a request the client is still sending: it may stop
  // (RFC 9113 8.1), and the stream does not stay open on its word.
  if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) && (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    if (const auto st = h.find(f->hd.stream_id); st && !st->body_end) {
      h.drop_body(*st);
      nghttp2_submit_rst_stream(h.session_, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
      h.flush();
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
  return 0;
}

ssize_t h2_connection::read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                                 nghttp2_data_source* source, void* ud) {
  auto& h = *static_cast<h2_connection*>(ud);
  auto& st = *static_cast<h2_stream*>(source->ptr);
  const std::size_t n = std::min(length, st.pending_out());
  std::memcpy(buf, st.res().out.data() + st.res().out_at, n);
  st.res().out_at += n;
  st.bytes_out += n;
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
  if (n > 0) {
    st.wake();  // room for more from the upstream
    if (st.up2) h2_upstream_consumed(*st.up2, n);
  }
  return static_cast<ssize_t>(n);
}

// ---------------------------------------------------------------------------- streams

void h2_connection::dispatch(const std::shared_ptr<h2_stream>& st, bool end_stream) {
  st->dispatched = true;
  if (end_stream) st->body_end = true;
  if (s_.newer_than(*w_.rt)) w_.rt = s_.current();
  st->rt = w_.rt;
  const runtime& rt = *st->rt;
  s_.metrics.h2_requests.inc();
  const bool too_large = st->fields.too_large();
  const std::string_view why = too_large ? std::string_view{} : st->fields.finish(end_stream, st->req);
  st->grpc = h2::grpc::is_grpc(st->fields.content_type());
  if (rt.cfg.access_log) {
    st->entry = begin_entry(rt, st->req, peer_, peer_text_, s_.clk.wall_us());
    st->entry->protocol = "HTTP/2";
    st->started = s_.clk.steady_now();
  }
  if (too_large) {
    s_.metrics.header_too_large.inc();
    s_.metrics.h2_header_list.inc();
    answer(*st, 431, "request headers too large\n");
    return;
  }
  if (!why.empty()) {
    s_.metrics.bad_request.inc();
    answer(*st, 400, "bad request: " + std::string(why) + "\n");
    return;
  }
  http1::request_head& req = st->req;
  if (req.body == http1::framing::length && rt.cfg.max_body_bytes > 0 && req.content_length > rt.cfg.max_body_bytes) {
    s_.metrics.bad_request.inc();
    answer(*st, 413, "request body too large\n");
    return;
  }
  std::string_view bad_path;
  st->r = route_request(rt, req, st->target, bad_path);
  if (!bad_path.empty()) {
    s_.metrics.bad_request.inc();
    answer(*st, 400, "bad request: " + std::string(bad_path) + "\n");
    return;
  }
  if (!st->r) {
    s_.metrics.no_route.inc();
    answer(*st, 404, "no route\n");
    return;
  }
  const route& r = *st->r;
  const std::int64_t now_us = s_.clk.wall_us();
  admission_env env{s_.gate, s_.metrics, w_.accounting};
  // A gRPC call is not held past its deadline: refused at once instead (as a hold beyond max_delay is).
  const auto deadline = st->grpc ? h2::grpc::parse_timeout(st->fields.grpc_timeout()) : std::nullopt;
  st->adm = admit(env, rt, r, req, peer_, now_us, deadline ? deadline->count() : -1);
  const admission& a = st->adm;
  append_limit_fields(st->response_fields, s_.gate, rt, r, a, now_us);
  if (st->entry) note_admission(*st->entry, r, a);
  if (a.outcome == decision::rejected) {
    const refusal no = refusal_for(r, a);
    const bool limit = a.gate.v == verdict::reject && !a.ambiguous && !a.no_master && !a.unidentified;
    answer(*st, no.status, no.text, no.retry_after_s, limit ? r.grpc_status : 0,
           no.retry_after_s > 0 ? no.retry_after_s * 1000 : -1);
    return;
  }
  if (a.outcome == decision::delayed) {
    const std::int64_t wait_us = a.gate.release_us - now_us;
    st->held = true;
    st->held_from = s_.clk.steady_now();
    st->timer = std::make_unique<steady_timer>(exec_);
    st->timer->expires_after(std::chrono::microseconds(wait_us));
    st->timer->async_wait([self = shared_from_this(), st](const boost::system::error_code& ec) {
      if (!ec && !st->closed && st->held) self->release(st);
    });
    return;
  }
  start_forward(st);
}

void h2_connection::release(const std::shared_ptr<h2_stream>& st) {
  st->held = false;
  end_hold(s_.gate, s_.metrics, *st->rt, *st->r, st->adm, hold_end::released, s_.clk.wall_us());
  if (st->entry)
    st->entry->held_ms = std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st->held_from).count();
  start_forward(st);
}

void h2_connection::close_stream(h2_stream& st, std::uint32_t) {
  st.closed = true;
  if (st.adm.charge_when_done && st.forwarding) {
    // A cost known only now (a response field, the body's size) is charged now, once.
    admission_env env{s_.gate, s_.metrics, w_.accounting};
    st.cost_seen.bytes_in = st.body_bytes;
    charge_done(env, *st.rt, *st.r, st.adm, cost_when_done(*st.r, st.cost_seen), s_.clk.wall_us());
    st.adm.charge_when_done = false;
  }
  if (st.held) {
    st.held = false;
    end_hold(s_.gate, s_.metrics, *st.rt, *st.r, st.adm, hold_end::client_left, s_.clk.wall_us());
    if (st.entry)
      st.entry->held_ms = std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st.held_from).count();
  }
  if (st.timer) st.timer->cancel();
  cancel_upstream(st);
  drop_body(st);
  if (st.entry) {
    st.entry->bytes_in = st.body_bytes;
    st.entry->bytes_out = st.bytes_out;
    st.entry->duration_ms = std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st.started).count();
    if (auto* log = s_.access.get()) log->write(*st.entry);
    st.entry.reset();
  }
}

void h2_connection::submit(h2_stream& st, const std::vector<h2::field>& fields, bool with_body) {
  st.last_progress = s_.clk.coarse_steady_now();  // body_timeout for its body from now (sweep_loop)
  const auto nv = to_nv(fields);
  nghttp2_data_provider prd{};
  prd.source.ptr = &st;
  prd.read_callback = read_body;
  nghttp2_submit_response(session_, st.id, nv.data(), nv.size(), with_body ? &prd : nullptr);
  flush();
}

void h2_connection::answer(h2_stream& st, unsigned status, std::string_view text, std::int64_t retry_after_s,
                           unsigned grpc_status, std::int64_t pushback_ms) {
  finished(st, status);
  drop_body(st);
  std::vector<h2::field> fields;
  if (st.grpc) {
    // gRPC clients read a status from trailers, not an HTTP error: a trailers-only response.
    std::string_view message = text;
    while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
    h2::grpc::refusal_fields(grpc_status != 0 ? grpc_status : h2::grpc::status_for_http(status), message, pushback_ms,
                             st.response_fields, st.res().fields_arena, fields);
    submit(st, fields, false);
    return;
  }
  h2::simple_response_fields(status, retry_after_s, st.response_fields, st.res().fields_arena, fields);
  st.res().out.assign(text);
  st.res().out_end = true;
  submit(st, fields, !st.req.head);
}

void h2_connection::push_out(h2_stream& st, std::string_view data) {
  if (st.pending_out() == 0 && !data.empty()) st.last_progress = s_.clk.coarse_steady_now();
  st.res().out.append(data);
  if (st.res().deferred) {
    st.res().deferred = false;
    nghttp2_session_resume_data(session_, st.id);
  }
  flush();
}

http1::forward_info h2_connection::hop(const runtime& rt) const {
  http1::forward_info info;
  info.peer_ip = peer_text_;
  info.proto = c_.client.tls() ? "https" : "http";
  info.forwarded_element = rt.cfg.real_ip_header == config::proxy_config::real_ip_header_kind::forwarded;
  info.trusted_peer = std::any_of(rt.cfg.trusted_proxies.begin(), rt.cfg.trusted_proxies.end(),
                                  [&](const cidr& c) { return c.contains(peer_); });
  return info;
}

void h2_connection::start_forward(const std::shared_ptr<h2_stream>& st) {
  if (st->too_large) return;  // reset while held
  st->forwarding = true;
  const runtime& rt = *st->rt;
  if (rt.cfg.upstreams[st->r->upstream_index].http2()) {
    w_.h2_pool.start(h2_upstream_request{*st, *this, st->req, hop(rt), st->rt, *st->r});
    return;
  }
  st->timer = std::make_unique<steady_timer>(exec_);
  asio::co_spawn(exec_, forward_h1(st), asio::detached);
}

// ---------------------------------------------------------------------------- HTTP/2 upstream events

void h2_connection::on_response(h2_stream& st, const std::vector<h2::field>& fields, bool end_stream) {
  if (st.closed) return;
  unsigned status = 0;
  for (const auto& f : fields) {
    if (f.name == ":status") status = static_cast<unsigned>(std::atoi(std::string(f.value).c_str()));
  }
  finished(st, status);
  if (st.r && st.r->cost.after_response()) note_cost_fields(*st.r, fields, st.cost_seen);
  // The proxy's own lines go after the upstream's fields.
  std::vector<h2::field> all = fields;
  h2::line_fields(st.response_fields, st.res().fields_arena, all);
  st.res().out_end = end_stream;
  submit(st, all, !end_stream);
}

void h2_connection::on_data(h2_stream& st, std::string_view data) {
  if (!st.closed) push_out(st, data);
}

void h2_connection::on_trailers(h2_stream& st, const std::vector<h2::field>& fields) {
  if (st.closed) return;
  if (st.r && st.r->cost.after_response() && !st.cost_seen.cost_field) note_cost_fields(*st.r, fields, st.cost_seen);
  h2::copy_fields(fields, st.res().trailers_arena, st.res().trailers);
}

void h2_connection::on_end(h2_stream& st) {
  st.up2 = nullptr;
  if (st.closed) return;
  drop_body(st);
  st.res().out_end = true;
  push_out(st, {});
}

void h2_connection::on_failed(h2_stream& st, unsigned status, std::string_view why, bool response_started) {
  st.up2 = nullptr;
  if (st.closed) return;
  drop_body(st);
  if (response_started) {
    reset(st, NGHTTP2_INTERNAL_ERROR);
    return;
  }
  answer(st, status, why);
}

std::size_t h2_connection::take_body(h2_stream& st, std::uint8_t* buf, std::size_t n, bool& eof) {
  const std::size_t taken = st.take_body(buf, n, eof);
  if (taken > 0) {
    // The client may send as much again.
    nghttp2_session_consume(session_, st.id, taken);
    flush();
  }
  return taken;
}

// ---------------------------------------------------------------------------- HTTP/1.1 upstream

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
      nghttp2_session_consume(session_, st.id, n);  // once closed, the connection's part still
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
awaitable<void> h2_connection::forward_h1(std::shared_ptr<h2_stream> st) {
  auto self = shared_from_this();
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
  std::string head;
  head.reserve(512 + st->req.target.size());
  http1::write_request_head(head, st->req, hop(rt));
  const bool retryable = st->req.body == http1::framing::none && http1::idempotent(st->req.method);
  const auto fail = [&](metrics::counter& m, unsigned status, std::string_view why) {
    m.inc();
    if (!st->closed) answer(*st, status, why);
  };
  http1::response_head& res = uc->fwd().response;
  auto& upstream_in = uc->fwd().upstream_in;
  auto sent = s_.clk.steady_now();
  for (int attempt = 0;; ++attempt) {
    if (!(attempt == 0 && w_.pool.take_pooled(rt, *uc, r.upstream_index, !retryable)) &&
        !co_await w_.pool.acquire(rt, *uc, r.upstream_index, attempt == 0, !retryable)) {
      fail(s_.metrics.upstream_no_server, 502, "upstream unavailable\n");
      co_return;
    }
    if (st->closed) co_return;
    if (st->entry) st->entry->upstream = to_string(rt.servers[r.upstream_index][uc->fwd().up.server]);
    link& up = *uc->fwd().up.sock;
    sent = s_.clk.steady_now();
    auto [wec, wn] = co_await write(*uc, up, asio::buffer(head), rt.cfg.upstream_timeout);
    if (wec) {
      if (uc->fwd().up.reused && retryable && attempt == 0) continue;
      fail(s_.metrics.upstream_reset, 502, "upstream write failed\n");
      co_return;
    }
    if (st->req.body != http1::framing::none &&
        !co_await send_body_h1(*st, *uc, st->req.body == http1::framing::chunked)) {
      if (!st->closed) fail(s_.metrics.upstream_reset, 502, "upstream write failed\n");
      co_return;
    }
    // The response head; 1xx informational responses are not passed on.
    upstream_in.clear();
    boost::system::error_code ec;
    bool bad = false;
    for (std::size_t scanned = 0;;) {
      const auto parsed = http1::parse_response(view(upstream_in), k_max_response_head, st->req.head, res, scanned);
      if (parsed.status == http1::parse_status::complete) {
        if (res.status >= 200 || res.status == 101) break;
        upstream_in.consume(res.size);
        scanned = 0;
        continue;
      }
      if (parsed.status != http1::parse_status::incomplete) {
        bad = true;
        break;
      }
      auto [rec, n] = co_await read_more(*uc, up, upstream_in.prepare(k_head_read), rt.cfg.upstream_timeout);
      if (rec) {
        ec = uc->classify(rec);
        break;
      }
      upstream_in.commit(n);
    }
    if (st->closed) co_return;
    if (!ec && !bad) break;
    if (upstream_in.size() == 0 && uc->fwd().up.reused && retryable && attempt == 0 &&
        (ec == asio::error::eof || ec == asio::error::connection_reset)) {
      continue;
    }
    if (ec == asio::error::timed_out) fail(s_.metrics.upstream_timeout, 504, "upstream timed out\n");
    else fail(s_.metrics.upstream_reset, 502, bad ? "upstream sent a malformed response\n" : "upstream failed\n");
    co_return;
  }
  const auto& counted = rt.upstream_metrics[r.upstream_index];
  counted.by_class[std::clamp<unsigned>(res.status / 100, 1, 5) - 1]->inc();
  counted.seconds->observe(std::chrono::duration<double>(s_.clk.steady_now() - sent).count());
  upstream_in.consume(res.size);
  if (res.status == 101) {
    fail(s_.metrics.upstream_reset, 502, "upstream switched protocols unasked\n");
    co_return;
  }
  finished(*st, res.status);
  if (r.cost.after_response()) note_cost_fields(r, res.headers, st->cost_seen);
  std::vector<h2::field> fields;
  const bool has_body =
      res.body != http1::framing::none && !(res.body == http1::framing::length && res.content_length == 0);
  h2::response_fields(res, st->response_fields, res.body == http1::framing::length, st->res().fields_arena, fields);
  st->res().out_end = !has_body;
  submit(*st, fields, has_body);
  if (!has_body) {
    if (res.keep_alive && upstream_in.size() == 0) w_.pool.give_back(rt, *uc, r.upstream_index);
    co_return;
  }
  const auto max_line = static_cast<std::size_t>(rt.cfg.max_header_bytes);
  body_relay body(res.body, http1::framing::until_close, res.content_length, max_line);
  std::string trailer_section;  // a chunked response's trailers become the stream's
  body.dec.keep_trailers = &trailer_section;
  buffer_list& bufs = uc->fwd().bufs;
  link& up = *uc->fwd().up.sock;
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
    auto [rec, n] = co_await read_more(*uc, up, upstream_in.prepare(k_relay_chunk), rt.cfg.upstream_timeout);
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
  if (!trailer_section.empty()) {
    if (r.cost.after_response() && !st->cost_seen.cost_field) note_cost_trailer(r, trailer_section, st->cost_seen);
    keep_trailers(*st, trailer_section);
  }
  st->res().out_end = true;
  push_out(*st, {});
  if (res.keep_alive && upstream_in.size() == 0) w_.pool.give_back(rt, *uc, r.upstream_index);
}

// ---------------------------------------------------------------------------- HTTP/1.1 client, HTTP/2 upstream

namespace {

// An HTTP/1.1 client's request on an HTTP/2 upstream: the upstream stream's
// events arrive here and wake the coroutine that writes the response.
class h1_bridge : public h2_downstream {
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
    st.up2 = nullptr;
    ended = true;
    resp_wake.cancel();
    body_wake.cancel();
  }
  void on_failed(h2_stream&, unsigned status, std::string_view why, bool started) override {
    st.up2 = nullptr;
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
  void attach(h2_stream&, h2_upstream_stream* up) override { st.up2 = up; }

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
awaitable<void> pump_body(h1_bridge& b, connection& c, const runtime& rt) {
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
    for (const auto& x : bufs.span()) b.st.body_in.append(static_cast<const char*>(x.data()), x.size());
    b.st.body_bytes = relay.data_bytes;
    c.in.consume(*used);
    if (rt.cfg.max_body_bytes > 0 && relay.data_bytes > rt.cfg.max_body_bytes) {
      b.body_failed = true;
      break;
    }
    if (relay.done) b.st.body_end = true;
    if (b.st.up2) h2_upstream_body_ready(*b.st.up2);
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
  if (b.st.up2) {
    h2_upstream_cancel(*b.st.up2);
    b.st.up2 = nullptr;
  }
  b.resp_wake.cancel();
}

// Writes the response to the client as the upstream's events come.
awaitable<connection_next> pump_response(h1_bridge& b, connection& c, const runtime& rt, bool& chunked) {
  const unsigned version = c.request.version >= 11 ? 11 : 10;
  const auto wait = [&]() -> awaitable<void> {
    b.resp_wake.expires_at(steady::time_point::max());
    co_await b.resp_wake.async_wait(nothrow);
  };
  while (!b.got_head && b.failed == 0 && !b.body_failed) co_await wait();
  if (!b.got_head) {
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
      if (n > 0 && b.st.up2) h2_upstream_consumed(*b.st.up2, n);
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
  c.outcome = {};
  http1::request_head& req = c.request;
  if (req.expect_continue && req.body != http1::framing::none && req.version >= 11) {
    static constexpr std::string_view k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
    auto [ec, n] = co_await write(c, c.client, asio::buffer(k_continue), rt->cfg.body_timeout);
    if (ec) co_return connection_next::ends;
  }
  h1_bridge b(c.client.get_executor(), static_cast<std::size_t>(rt->cfg.max_header_bytes));
  b.st.req = req;
  // The fields go into the upstream stream now: the head's bytes may go after this.
  w.h2_pool.start(h2_upstream_request{b.st, b, req, hop, rt, r});
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
    next = co_await pump_response(b, c, *rt, chunked);
  } else {
    const auto both = [&]() -> awaitable<void> {
      co_await (pump_body(b, c, *rt) && [&]() -> awaitable<void> {
        next = co_await pump_response(b, c, *rt, chunked);
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
  c.outcome.bytes_in = b.st.body_bytes;
  if (r.cost.after_response()) {  // charged by the session once this returns
    note_cost_fields(r, b.head, c.outcome);
    if (!c.outcome.cost_field) note_cost_fields(r, b.trailers, c.outcome);
  }
  if (b.st.up2) {
    h2_upstream_cancel(*b.st.up2);  // the client went away first
    b.st.up2 = nullptr;
  }
  if (!b.body_done || s.draining || !req.keep_alive) next = connection_next::ends;
  co_return next;
}

awaitable<void> serve_h2(shared_state& s, worker& w, std::shared_ptr<connection> conn,
                         std::shared_ptr<const runtime> rt, const ip_address& peer, std::string peer_text) {
  auto h = std::make_shared<h2_connection>(s, w, std::move(conn), std::move(rt), peer, std::move(peer_text));
  co_await h->run();
}

}  // namespace smockron::proxy
