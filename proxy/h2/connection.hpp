// An HTTP/2 client connection (see session.hpp): the class its parts share.
// server_session.cpp: its life (nghttp2's session, the read, write and sweep
// loops, teardown); callbacks.cpp: what nghttp2 reports; streams.cpp: each
// stream through the request steps, answered, held or forwarded, and the
// events of its upstream exchange (either protocol:
// proxy/upstream/exchange.hpp).
#pragma once

#include <nghttp2/nghttp2.h>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "proxy/codec/h2_fields.hpp"
#include "proxy/h2/flood_guard.hpp"
#include "proxy/io/h2_pump.hpp"
#include "proxy/request/h2_stream.hpp"
#include "proxy/request/request_steps.hpp"
#include "proxy/request/worker.hpp"
#include "proxy/upstream/h2_upstream.hpp"

namespace smockron::proxy {

using namespace asio::experimental::awaitable_operators;

namespace h2_detail {
constexpr std::size_t k_read_size = 16384;
/// The connection's receive window. Request body bytes give the connection's
/// part back as they arrive and the stream's part as they go upstream: each
/// stream buffers at most its own window (the default 64 KiB), so a held
/// stream's upload never takes the room its neighbours' need (a connection
/// buffers at most http2_max_concurrent_streams such windows).
constexpr std::int32_t k_connection_window = 1 << 20;

inline std::vector<nghttp2_nv> to_nv(const std::vector<h2::field>& fields) {
  std::vector<nghttp2_nv> nv;
  nv.reserve(fields.size());
  for (const auto& f : fields) {
    nv.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(f.name.data())),
                  reinterpret_cast<uint8_t*>(const_cast<char*>(f.value.data())), f.name.size(), f.value.size(),
                  NGHTTP2_NV_FLAG_NONE});
  }
  return nv;
}
}  // namespace h2_detail

class h2_connection : public std::enable_shared_from_this<h2_connection>, public downstream {
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
        flood_({rt_->cfg.http2_reset_burst, rt_->cfg.http2_reset_rate, rt_->cfg.http2_control_burst,
                rt_->cfg.http2_control_rate},
               s.clk.steady_now()) {}

  ~h2_connection() override {
    if (session_) nghttp2_session_del(session_);
  }

  awaitable<void> run() {
    if (!start()) co_return;
    auto self = shared_from_this();
    co_await (read_loop() && write_loop() && sweep_loop());
    teardown();
  }

  // downstream: an HTTP/2 upstream stream reports to its client stream.
  void on_response(h2_stream& st, const std::vector<h2::field>& fields, bool end_stream) override;
  void on_data(h2_stream& st, std::string_view data) override;
  void on_trailers(h2_stream& st, const std::vector<h2::field>& fields) override;
  void on_end(h2_stream& st) override;
  void on_failed(h2_stream& st, unsigned status, std::string_view why, bool response_started) override;
  std::size_t take_body(h2_stream& st, std::uint8_t* buf, std::size_t n, bool& eof) override;
  void attach(h2_stream& st, upstream_exchange* up) override { st.up = up; }
  void on_submitted(h2_stream& st, std::size_t server) override {
    st.outcome.server = server;  // the access log's upstream (note_outcome)
  }

  // The session without its socket (the loops above use these; tests and the
  // fuzz target drive them directly, frames in memory).
  /// Makes nghttp2's session and queues the server's SETTINGS. False: nghttp2 failed.
  bool start();
  /// The client's bytes, as a read brings them: parsed, streams decided (and
  /// those to forward forwarded), abuse answered with GOAWAY.
  void receive(const std::uint8_t* data, std::size_t n);
  /// Every byte the session has to send now (what the write loop would write).
  std::string take_output();
  /// Whether nghttp2 still reads or writes (false once the connection has ended).
  bool alive() const {
    return !fatal_ && (nghttp2_session_want_read(session_) || nghttp2_session_want_write(session_));
  }

private:
  /// Takes what nghttp2 has to send into out_ (a write's worth at most); nghttp2's failure ends the connection.
  void gather_output();
  awaitable<void> read_loop();
  awaitable<void> write_loop();
  awaitable<void> sweep_loop();
  void flush() { write_wake_.cancel(); }
  void teardown();
  void update_deadline();
  void abuse(metrics::counter& kind, nghttp2_error_code code);
  /// A frame crossed a flood bound: the connection ends, counted by kind.
  void flooded(h2::flood f) {
    if (f != h2::flood::none)
      abuse(f == h2::flood::reset ? s_.metrics.h2_rapid_reset : s_.metrics.h2_control_flood, NGHTTP2_ENHANCE_YOUR_CALM);
  }

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
  /// Its head is complete: checked, then decided (decide), or, for a route
  /// whose cost estimate is in the JSON body, once that much of the body is
  /// in, the body ends, or body_timeout passes (prefix_wanted).
  void dispatch(const std::shared_ptr<h2_stream>& st, bool end_stream);
  void decide(const std::shared_ptr<h2_stream>& st);
  /// A stream waiting for the start of its body: decided when it is in (or ends).
  void body_progress(const std::shared_ptr<h2_stream>& st) {
    if (awaits_body(*st) && (st->body_end || st->body_in.size() >= st->prefix_wanted)) decide(st);
  }
  /// Still waiting for the start of its body, and not answered meanwhile (413).
  static bool awaits_body(const h2_stream& st) {
    return st.prefix_wanted != 0 && !st.closed && !st.too_large && st.status == 0;
  }
  void release(const std::shared_ptr<h2_stream>& st);
  /// Under a concurrency rule: takes a slot for the stream (true: it goes
  /// now), or queues it for one until max_delay from its admission.
  bool take_slot(const std::shared_ptr<h2_stream>& st);
  /// Its wait for a slot ended: forwarded with the slot, or refused.
  void slot_wait_ended(const std::shared_ptr<h2_stream>& st);
  /// Exact admission (proxy/gate/asks.hpp): true, the stream goes on now
  /// (its domain is not exact); else it asks the master and goes on, or is
  /// refused, once the answer comes (or control_fresh passes: it goes).
  bool ask_master(const std::shared_ptr<h2_stream>& st);
  /// Sends the stream's ASK and waits for its answer (false: not sent, the table is full).
  bool send_ask(const std::shared_ptr<h2_stream>& st);
  /// Its wait for an answer ended: it goes, is held to ask again, or is refused.
  void ask_ended(const std::shared_ptr<h2_stream>& st);
  /// The master let it go (GO to ASK number `ask`; -1: no answer came): accounted and forwarded.
  void exact_go(const std::shared_ptr<h2_stream>& st, std::int64_t ask);
  /// Forwards the streams the last read opened and decided to forward.
  void forward_opened();
  void forward(const std::shared_ptr<h2_stream>& st);
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
      nghttp2_session_consume_stream(session_, st.id, unread);  // the connection's part went at arrival
      flush();
    }
    st.body_in.clear();
    st.body_at = 0;
  }
  /// Stops the stream's upstream exchange (either protocol).
  void cancel_upstream(h2_stream& st) {
    if (st.up) {
      st.up->cancel();
      st.up = nullptr;
    }
  }
  /// Resets a stream; it counts against the reset bound as the client's own resets do.
  void reset(std::int32_t id, nghttp2_error_code code) {
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, code);
    flooded(flood_.server_reset(code, s_.clk.steady_now()));
    flush();
  }
  void reset(h2_stream& st, nghttp2_error_code code) { reset(st.id, code); }
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
  std::array<std::uint8_t, h2_detail::k_read_size> in_{};
  h2::flood_guard flood_;
  std::vector<std::shared_ptr<h2_stream>> opened_;  ///< to forward once the current read is parsed
  bool reading_done_ = false;
  bool writing_ = false;
  bool goaway_sent_ = false;
  bool fatal_ = false;
  bool ending_ = false;  ///< ended for abuse
};

}  // namespace smockron::proxy
