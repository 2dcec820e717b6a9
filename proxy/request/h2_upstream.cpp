// HTTP/2 to upstream servers (see h2_upstream.hpp).
#include "proxy/request/h2_upstream.hpp"

#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <list>
#include <unordered_map>

#include "proxy/io/link.hpp"
#include "proxy/io/tls.hpp"

namespace smockron::proxy {

using namespace asio::experimental::awaitable_operators;

namespace {
constexpr std::size_t k_read_size = 16384;
constexpr std::size_t k_write_batch = 65536;
constexpr int k_attempts = 2;  // a stream whose connection could not be made tries one more server
}  // namespace

struct h2_upstream_conn;

struct h2_upstream_stream {
  h2_upstream_conn* conn = nullptr;
  std::int32_t id = -1;  ///< -1: waiting for its connection
  h2_stream* st = nullptr;
  h2_downstream* down = nullptr;  ///< null once the client side is done with it
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

  std::vector<h2::field> response() const {
    std::vector<h2::field> out;
    for (const auto& s : resp) out.push_back({{resp_arena.data() + s.n, s.nl}, {resp_arena.data() + s.v, s.vl}});
    return out;
  }
  // Delivers the end (or failure) once and lets the client side go.
  h2_downstream* detach() {
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
  std::array<std::uint8_t, k_read_size> in{};
  steady::time_point idle_since{};
  steady::time_point write_since{};  ///< a write under way since (none: epoch)
  bool ready = false, dead = false, goaway = false, connecting = true;
};

// ---------------------------------------------------------------------------- the pool

h2_upstream_pool::h2_upstream_pool(executor_t ex, const clock& clk, proxy_metrics& m)
    : impl_(std::make_unique<impl>(ex, clk, m)) {}

h2_upstream_pool::~h2_upstream_pool() { *impl_->alive = false; }

void h2_upstream_pool::impl::adopt(const runtime& rt) {
  conns.assign(rt.servers.size(), {});
  down_until.assign(rt.servers.size(), {});
  for (std::size_t u = 0; u < rt.servers.size(); ++u) {
    conns[u].resize(rt.servers[u].size());
    down_until[u].assign(rt.servers[u].size(), steady::time_point{});
  }
  round_robin.assign(rt.servers.size(), 0);
  generation = rt.generation;
}

void h2_upstream_pool::start(const h2_upstream_request& req) {
  auto s = std::make_unique<h2_upstream_stream>();
  s->st = &req.st;
  s->down = &req.down;
  s->r = &req.r;
  s->rt = req.rt;
  const auto& ucfg = req.rt->cfg.upstreams[req.r.upstream_index];
  h2::upstream_request_fields(req.req, req.hop, ucfg.tls ? "https" : "http", s->arena, s->fields);
  s->has_body = req.req.body != http1::framing::none;
  s->last_activity = impl_->clk.steady_now();
  req.down.attach(req.st, s.get());
  impl_->place(std::move(s));
}

void h2_upstream_pool::impl::place(std::unique_ptr<h2_upstream_stream> s) {
  const runtime& rt = *s->rt;
  if (generation != rt.generation) adopt(rt);
  const std::size_t u = s->r->upstream_index;
  auto& servers = conns[u];
  const auto now = clk.steady_now();
  for (std::size_t attempt = 0; attempt < servers.size(); ++attempt) {
    const std::size_t srv = round_robin[u]++ % servers.size();
    if (down_until[u][srv] > now && attempt + 1 < servers.size()) continue;
    auto& list = servers[srv];
    std::erase_if(list, [](const auto& c) { return !c->usable(); });
    for (auto& c : list) {
      if (c->active() < c->limit()) {
        c->add(std::move(s));
        return;
      }
    }
    auto c = std::make_shared<h2_upstream_conn>(*this, s->rt, u, srv);
    list.push_back(c);
    c->add(std::move(s));
    asio::co_spawn(ex, c->run(), asio::detached);
    return;
  }
  fail(std::move(s), 502, "upstream unavailable\n");
}

void h2_upstream_pool::impl::fail(std::unique_ptr<h2_upstream_stream> s, unsigned status, std::string_view why) {
  s->conn = nullptr;
  // Never from within the client's own call: the answer goes out on the next turn.
  asio::post(ex, [s = std::shared_ptr<h2_upstream_stream>(std::move(s)), status, why] {
    if (auto* d = s->detach()) d->on_failed(*s->st, status, why, false);
  });
}

void h2_upstream_pool::impl::server_down(std::size_t u, std::size_t srv, const runtime& rt) {
  if (generation != rt.generation) return;
  down_until[u][srv] = clk.steady_now() + rt.cfg.upstreams[u].fail_timeout;
}

// ---------------------------------------------------------------------------- client calls

void h2_upstream_body_ready(h2_upstream_stream& s) {
  if (!s.deferred || s.id < 0 || !s.conn || !s.conn->session) return;
  s.deferred = false;
  nghttp2_session_resume_data(s.conn->session, s.id);
  s.conn->flush();
}

void h2_upstream_consumed(h2_upstream_stream& s, std::size_t n) {
  if (s.id < 0 || !s.conn || !s.conn->session || s.conn->dead) return;
  nghttp2_session_consume_stream(s.conn->session, s.id, n);
  s.conn->flush();
}

void h2_upstream_cancel(h2_upstream_stream& s) {
  s.down = nullptr;
  s.st = nullptr;
  h2_upstream_conn* c = s.conn;
  if (c == nullptr) return;  // its failure is on its way
  if (s.id < 0) {
    c->pending.remove_if([&](const auto& p) { return p.get() == &s; });
    return;
  }
  if (c->session && !c->dead) {
    nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_CANCEL);
    c->flush();
  }
}

// ---------------------------------------------------------------------------- a connection

void h2_upstream_conn::submit(std::unique_ptr<h2_upstream_stream> s) {
  std::vector<nghttp2_nv> nv;
  for (const auto& f : s->fields) {
    nv.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(f.name.data())),
                  reinterpret_cast<uint8_t*>(const_cast<char*>(f.value.data())), f.name.size(), f.value.size(),
                  NGHTTP2_NV_FLAG_NONE});
  }
  nghttp2_data_provider prd{};
  prd.source.ptr = s.get();
  prd.read_callback = read_body;
  const int32_t id =
      nghttp2_submit_request(session, nullptr, nv.data(), nv.size(), s->has_body ? &prd : nullptr, s.get());
  if (id < 0) {
    pool.fail(std::move(s), 502, "upstream refused a stream\n");
    return;
  }
  s->id = id;
  s->last_activity = pool.clk.steady_now();
  streams.emplace(id, std::move(s));
  flush();
}

awaitable<bool> h2_upstream_conn::connect() {
  const auto& cfg = rt->cfg;
  const auto& endpoint = rt->servers[upstream][server];
  steady_timer deadline(pool.ex);
  deadline.expires_after(cfg.connect_timeout);
  bool late = false;
  deadline.async_wait([&](const boost::system::error_code& ec) {
    if (ec) return;
    late = true;
    boost::system::error_code ignored;
    sock.socket().cancel(ignored);
  });
  struct stop {
    steady_timer& t;
    ~stop() { t.cancel(); }
  } guard{deadline};
  auto [ec] = co_await sock.socket().async_connect(endpoint, nothrow);
  if (!*alive) co_return false;
  if (ec) {
    (late ? pool.metrics.upstream_timeout : pool.metrics.upstream_connect).inc();
    co_return false;
  }
  sock.socket().set_option(tcp::no_delay(true), ec);
  if (const auto& ctx = rt->upstream_tls[upstream]) {
    sock.start_tls(*ctx, ctx);
    prepare_client_session(*sock.tls(), cfg.upstreams[upstream], rt->server_hosts[upstream][server]);
    auto [hec] = co_await sock.tls()->async_handshake(asio::ssl::stream_base::client, nothrow);
    if (!*alive) co_return false;
    const unsigned char* alpn = nullptr;
    unsigned alpn_len = 0;
    if (!hec) SSL_get0_alpn_selected(sock.tls()->native_handle(), &alpn, &alpn_len);
    if (hec || std::string_view(reinterpret_cast<const char*>(alpn), alpn_len) != "h2") {
      pool.metrics.upstream_tls.inc();
      co_return false;
    }
  }
  co_return true;
}

awaitable<void> h2_upstream_conn::run() {
  auto self = shared_from_this();
  const bool ok = co_await connect();
  connecting = false;
  if (!*alive) co_return;
  if (!ok) {
    dead = true;
    pool.server_down(upstream, server, *rt);
    // What waited for this connection tries another server (not yet sent: safe).
    auto waiting = std::move(pending);
    for (auto& s : waiting) {
      if (!s->down) continue;
      if (++s->attempts < k_attempts) pool.place(std::move(s));
      else pool.fail(std::move(s), 502, "upstream unavailable\n");
    }
    co_return;
  }
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  // The upstream's window opens as the client takes the response, not as it arrives.
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_session_client_new2(&session, cb, this, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cb);
  const std::array<nghttp2_settings_entry, 2> settings = {{
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 65536},
  }};
  nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings.data(), settings.size());
  nghttp2_session_set_local_window_size(session, NGHTTP2_FLAG_NONE, 0, 1 << 20);
  ready = true;
  auto waiting = std::move(pending);
  for (auto& s : waiting) {
    if (s->down) submit(std::move(s));
  }
  idle_since = pool.clk.steady_now();
  co_await (read_loop() && write_loop() && tick_loop());
  die(502, "upstream connection lost\n");
}

awaitable<void> h2_upstream_conn::read_loop() {
  while (!dead && nghttp2_session_want_read(session)) {
    auto [ec, n] = co_await sock.async_read_some(asio::buffer(in), nothrow);
    if (ec || !*alive) break;
    if (nghttp2_session_mem_recv(session, in.data(), n) < 0) {
      pool.metrics.upstream_reset.inc();
      break;
    }
    flush();
  }
  dead = true;
  flush();
  ticker.cancel();
}

awaitable<void> h2_upstream_conn::write_loop() {
  for (;;) {
    while (!dead && out.size() < k_write_batch) {
      const uint8_t* data = nullptr;
      const auto n = nghttp2_session_mem_send(session, &data);
      if (n <= 0) break;
      out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    }
    if (out.empty()) {
      if (dead || (!nghttp2_session_want_read(session) && !nghttp2_session_want_write(session))) break;
      wake.expires_at(steady::time_point::max());
      co_await wake.async_wait(nothrow);
      if (!*alive) co_return;
      continue;
    }
    write_since = pool.clk.steady_now();  // tick_loop ends a write stalled for upstream_timeout
    auto [ec, n] = co_await asio::async_write(sock, asio::buffer(out), nothrow);
    write_since = {};
    out.clear();
    if (ec || !*alive) break;
  }
  dead = true;
  boost::system::error_code ignored;
  sock.socket().cancel(ignored);
  sock.socket().shutdown(tcp::socket::shutdown_both, ignored);
  ticker.cancel();
}

// Timeouts: a stream with nothing from the server for upstream_timeout is
// reset (504 if nothing was answered); an idle connection closes after idle_timeout.
awaitable<void> h2_upstream_conn::tick_loop() {
  const auto& cfg = rt->cfg;
  while (!dead) {
    ticker.expires_after(std::max<steady::duration>(rt->tick, std::chrono::milliseconds(10)));
    co_await ticker.async_wait(nothrow);
    if (!*alive || dead) break;
    const auto now = pool.clk.steady_now();
    if (write_since != steady::time_point{} && now - write_since > cfg.upstream_timeout) {
      // The server stopped reading: the connection is lost (its streams fail when the loops end).
      pool.metrics.upstream_timeout.inc();
      boost::system::error_code ignored;
      sock.socket().cancel(ignored);
      break;
    }
    for (auto& [id, s] : streams) {
      if (!s->down || now - s->last_activity < cfg.upstream_timeout) continue;
      pool.metrics.upstream_timeout.inc();
      if (auto* d = s->detach()) d->on_failed(*s->st, 504, "upstream timed out\n", s->got_head);
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
      flush();
    }
    if (active() == 0 && now - idle_since > cfg.idle_timeout) {
      goaway = true;
      nghttp2_session_terminate_session(session, NGHTTP2_NO_ERROR);
      flush();
    }
  }
}

void h2_upstream_conn::die(unsigned status, std::string_view why) {
  dead = true;
  for (auto& [id, s] : streams) {
    if (auto* d = s->detach()) d->on_failed(*s->st, status, why, s->got_head);
  }
  streams.clear();
}

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
