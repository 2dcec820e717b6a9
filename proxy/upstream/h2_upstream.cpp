// HTTP/2 to upstream servers (see h2_upstream.hpp).
#include "proxy/upstream/h2_upstream_conn.hpp"

#include <openssl/ssl.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <cstring>

#include "proxy/io/tls.hpp"

namespace smockron::proxy {

using namespace asio::experimental::awaitable_operators;
using namespace h2_upstream_detail;

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

void h2_upstream_pool::start(const upstream_request& req) {
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
  metrics.upstream_no_server.inc();
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

void h2_upstream_stream::body_ready() {
  if (!deferred || id < 0 || !conn || !conn->session) return;
  deferred = false;
  nghttp2_session_resume_data(conn->session, id);
  conn->flush();
}

void h2_upstream_stream::consumed(std::size_t n) {
  if (id < 0 || !conn || !conn->session || conn->dead) return;
  nghttp2_session_consume_stream(conn->session, id, n);
  conn->flush();
}

void h2_upstream_stream::cancel() {
  down = nullptr;
  st = nullptr;
  h2_upstream_conn* c = conn;
  if (c == nullptr) return;  // its failure is on its way
  if (id < 0) {
    c->pending.remove_if([&](const auto& p) { return p.get() == this; });  // destroys this
    return;
  }
  if (c->session && !c->dead) {
    nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
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
  s->last_activity = s->sent = pool.clk.steady_now();
  if (s->down) s->down->on_submitted(*s->st, server);
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
      if (++s->attempts < k_attempts) {
        pool.place(std::move(s));
      } else {
        pool.metrics.upstream_no_server.inc();
        pool.fail(std::move(s), 502, "upstream unavailable\n");
      }
    }
    co_return;
  }
  open_session();
  co_await (read_loop() && write_loop() && tick_loop());
  die(502, "upstream connection lost\n");
}

void h2_upstream_conn::open_session() {
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
}

bool h2_upstream_conn::receive(const std::uint8_t* data, std::size_t n) {
  if (nghttp2_session_mem_recv(session, data, n) < 0) {
    pool.metrics.upstream_reset.inc();
    return false;
  }
  flush();
  return true;
}

void h2_upstream_conn::gather_output() {
  if (!dead && !h2::gather(session, out)) dead = true;
}

std::string h2_upstream_conn::take_output() {
  std::string taken = h2::take_all(session);
  if (!out.empty()) taken.insert(0, std::exchange(out, {}));
  return taken;
}

awaitable<void> h2_upstream_conn::read_loop() {
  while (!dead && nghttp2_session_want_read(session)) {
    auto [ec, n] = co_await sock.async_read_some(asio::buffer(in), nothrow);
    if (ec || !*alive || !receive(in.data(), n)) break;
  }
  dead = true;
  flush();
  ticker.cancel();
}

awaitable<void> h2_upstream_conn::write_loop() {
  for (;;) {
    gather_output();
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

}  // namespace smockron::proxy
