// HTTP/2 upstream connections (see h2_upstream.hpp): the objects the pool,
// its connections' life (h2_upstream.cpp) and nghttp2's callbacks
// (h2_upstream_callbacks.cpp) share.
#pragma once

#include <nghttp2/nghttp2.h>

#include <array>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "proxy/io/h2_pump.hpp"
#include "proxy/io/link.hpp"
#include "proxy/upstream/h2_upstream.hpp"

namespace smockron::proxy {

namespace h2_upstream_detail {
constexpr std::size_t k_read_size = 16384;
constexpr int k_attempts = 2;  // a stream whose connection could not be made tries one more server
}  // namespace h2_upstream_detail

struct h2_upstream_conn;

struct h2_upstream_stream final : upstream_exchange {
  void body_ready() override;
  void consumed(std::size_t n) override;
  void cancel() override;
  void sweep(steady::time_point) override {}  // its connection's tick loop bounds it

  h2_upstream_conn* conn = nullptr;
  std::int32_t id = -1;  ///< -1: waiting for its connection
  h2_stream* st = nullptr;
  downstream* down = nullptr;  ///< null once the client side is done with it
  std::shared_ptr<const runtime> rt;
  const route* r = nullptr;
  int attempts = 0;
  std::string arena;
  std::vector<h2::field> fields;
  bool has_body = false;
  bool body_sent = false;  ///< request body bytes went to the server (the stream cannot be sent again)
  bool deferred = false;
  bool got_head = false;
  bool in_trailers = false;
  std::string resp_arena;
  struct span {
    std::uint32_t n, nl, v, vl;
  };
  std::vector<span> resp;
  steady::time_point last_activity{};
  steady::time_point sent{};  ///< submitted to its server (the response time runs from here)

  std::vector<h2::field> response() const {
    std::vector<h2::field> out;
    for (const auto& s : resp) out.push_back({{resp_arena.data() + s.n, s.nl}, {resp_arena.data() + s.v, s.vl}});
    return out;
  }
  // Delivers the end (or failure) once and lets the client side go.
  downstream* detach() {
    auto* d = down;
    down = nullptr;
    return d;
  }
};

struct h2_upstream_pool::impl {
  impl(executor_t e, const clock& c, proxy_metrics& m) : ex(e), clk(c), metrics(m) {}
  void adopt(const runtime& rt);
  void place(std::unique_ptr<h2_upstream_stream> s);
  void fail(std::unique_ptr<h2_upstream_stream> s, unsigned status, std::string_view why);
  void server_down(std::size_t upstream, std::size_t server, const runtime& rt);

  executor_t ex;
  const clock& clk;
  proxy_metrics& metrics;
  std::uint64_t generation = ~0ULL;
  std::vector<std::vector<std::vector<std::shared_ptr<h2_upstream_conn>>>> conns;  ///< upstream, server
  std::vector<std::vector<steady::time_point>> down_until;
  std::vector<std::size_t> round_robin;
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
};

struct h2_upstream_conn : std::enable_shared_from_this<h2_upstream_conn> {
  h2_upstream_conn(h2_upstream_pool::impl& p, std::shared_ptr<const runtime> rt, std::size_t u, std::size_t s)
      : pool(p),
        alive(p.alive),
        rt(std::move(rt)),
        upstream(u),
        server(s),
        sock(tcp_socket(p.ex)),
        wake(p.ex),
        ticker(p.ex) {}
  ~h2_upstream_conn() {
    if (session) nghttp2_session_del(session);
  }

  std::size_t active() const { return pending.size() + streams.size(); }
  std::size_t limit() const {
    auto m = static_cast<std::size_t>(rt->cfg.upstreams[upstream].max_streams);
    if (session)
      m = std::min<std::size_t>(m,
                                nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS));
    return m;
  }
  bool usable() const { return !dead && !goaway; }

  void add(std::unique_ptr<h2_upstream_stream> s) {
    s->conn = this;
    if (ready) submit(std::move(s));
    else pending.push_back(std::move(s));
  }
  void submit(std::unique_ptr<h2_upstream_stream> s);
  void flush() { wake.cancel(); }
  awaitable<void> run();
  // The connection without its socket (run's loops use these; tests drive them, frames in memory).
  /// Makes nghttp2's client session, sends SETTINGS, submits the streams that waited.
  void open_session();
  /// The server's bytes, as a read brings them. False: not HTTP/2 (counted; the connection ends).
  bool receive(const std::uint8_t* data, std::size_t n);
  /// Every byte the session has to send now.
  std::string take_output();
  void gather_output();
  awaitable<bool> connect();
  awaitable<void> read_loop();
  awaitable<void> write_loop();
  awaitable<void> tick_loop();
  void die(unsigned status, std::string_view why);
  void remove_from_pool();

  static int on_header(nghttp2_session*, const nghttp2_frame* f, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t, void* ud);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* ud);
  static int on_data_chunk(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len, void* ud);
  static int on_stream_close(nghttp2_session*, int32_t id, uint32_t error_code, void* ud);
  static ssize_t read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                           nghttp2_data_source* source, void*);

  h2_upstream_stream* stream(std::int32_t id) {
    const auto it = streams.find(id);
    return it == streams.end() ? nullptr : it->second.get();
  }

  h2_upstream_pool::impl& pool;
  std::shared_ptr<bool> alive;  ///< the pool still exists
  std::shared_ptr<const runtime> rt;
  std::size_t upstream, server;
  link sock;
  nghttp2_session* session = nullptr;
  std::list<std::unique_ptr<h2_upstream_stream>> pending;
  std::unordered_map<std::int32_t, std::unique_ptr<h2_upstream_stream>> streams;
  steady_timer wake, ticker;
  std::string out;
  std::array<std::uint8_t, h2_upstream_detail::k_read_size> in{};
  steady::time_point idle_since{};
  steady::time_point write_since{};  ///< a write under way since (none: epoch)
  bool ready = false, dead = false, goaway = false, connecting = true;
};

}  // namespace smockron::proxy
