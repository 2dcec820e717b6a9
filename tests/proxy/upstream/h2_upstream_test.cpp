// The HTTP/2 upstream client driven by frames in memory: one of the proxy's
// upstream connections (h2_upstream_conn, no socket) against libnghttp2's
// server session. A response's head, body and trailers reach the client
// stream, its window opens only as that stream takes the bytes, resets and
// GOAWAY are answered, and the exchange is counted.
#include <nghttp2/nghttp2.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proxy/request/h2_stream.hpp"
#include "proxy/upstream/h2_upstream_conn.hpp"
#include "shared/base/clock.hpp"
#include "shared/config/config.hpp"
#include "tests/proxy/h2/nghttp2_peer.hpp"

namespace smockron::proxy::test {
namespace {

constexpr std::string_view k_config = R"(
[proxy]
listen = "127.0.0.1:0"
[proxy.upstreams.grpc]
servers = ["127.0.0.1:9"]
protocol = "h2c"
[[proxy.routes]]
path = "/"
upstream = "grpc"
)";

// What the client stream is told.
struct recording_downstream final : downstream {
  void on_response(h2_stream&, const std::vector<h2::field>& f, bool end_stream) override {
    for (const auto& x : f) head.emplace_back(x.name, x.value);
    ended = end_stream;
  }
  void on_data(h2_stream&, std::string_view d) override { body.append(d); }
  void on_trailers(h2_stream&, const std::vector<h2::field>& f) override {
    for (const auto& x : f) trailers.emplace_back(x.name, x.value);
  }
  void on_end(h2_stream&) override { ended = true; }
  void on_failed(h2_stream&, unsigned status, std::string_view why, bool started) override {
    failed = status;
    failed_why = why;
    failed_started = started;
  }
  std::size_t take_body(h2_stream&, std::uint8_t*, std::size_t, bool& eof) override {
    eof = true;
    return 0;
  }
  void attach(h2_stream&, upstream_exchange* s) override { up = s; }
  void on_submitted(h2_stream&, std::size_t s) override { server = s; }

  std::vector<std::pair<std::string, std::string>> head, trailers;
  std::string body;
  bool ended = false, failed_started = false;
  unsigned failed = 0;
  std::string failed_why;
  upstream_exchange* up = nullptr;
  std::optional<std::size_t> server;
};

// A server: libnghttp2's server session; the test says what it answers.
class h2_server : public nghttp2_peer {
public:
  h2_server() {
    nghttp2_session_callbacks* cb = nullptr;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, [](nghttp2_session*, const nghttp2_frame* f, void* ud) {
      if (f->hd.type == NGHTTP2_HEADERS) static_cast<h2_server*>(ud)->requests.push_back(f->hd.stream_id);
      return 0;
    });
    nghttp2_session_server_new(&session, cb, this);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, nullptr, 0);
  }

  /// Answers `id` with `status`, `body`, and trailers when given.
  void respond(std::int32_t id, std::string_view status, std::string body_text, bool trailers) {
    body = std::move(body_text);
    at = 0;
    with_trailers = trailers;
    const nghttp2_nv nv[] = {field(":status", status)};
    nghttp2_data_provider prd{};
    prd.source.ptr = this;
    prd.read_callback = [](nghttp2_session* s, int32_t sid, uint8_t* buf, size_t len, uint32_t* flags,
                           nghttp2_data_source* src, void*) -> ssize_t {
      auto& me = *static_cast<h2_server*>(src->ptr);
      const std::size_t n = std::min(len, me.body.size() - me.at);
      std::memcpy(buf, me.body.data() + me.at, n);
      me.at += n;
      if (me.at == me.body.size()) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        if (me.with_trailers) {
          *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
          const nghttp2_nv t[] = {field("grpc-status", "0")};
          nghttp2_submit_trailer(s, sid, t, 1);
        }
      }
      return static_cast<ssize_t>(n);
    };
    nghttp2_submit_response(session, id, nv, 1, &prd);
  }
  std::vector<std::int32_t> requests;

private:
  std::string body;
  std::size_t at = 0;
  bool with_trailers = false;
};

// One upstream connection with one request on it (GET /svc/Method).
struct upstream_fixture {
  upstream_fixture() {
    auto loaded = config::load_string(k_config, "upstream_test.toml");
    if (!loaded.cfg || !loaded.cfg->proxy) throw std::runtime_error("the test's configuration does not load");
    cfg = *loaded.cfg->proxy;
    rt = std::make_shared<const runtime>(cfg, domains, metrics, 0);
    pool = std::make_unique<h2_upstream_pool::impl>(ioc.get_executor(), clk, metrics);
    conn = std::make_shared<h2_upstream_conn>(*pool, rt, 0, 0);
    static constexpr std::string_view text = "GET /svc/Method HTTP/1.1\r\nHost: up.example\r\n\r\n";
    EXPECT_EQ(http1::parse_request(text, 4096, req).status, http1::parse_status::complete);
    auto s = std::make_unique<h2_upstream_stream>();
    s->st = &st;
    s->down = &down;
    s->r = &rt->routes.routes().front();
    s->rt = rt;
    h2::upstream_request_fields(req, http1::forward_info{}, "http", s->arena, s->fields);
    down.attach(st, s.get());
    conn->add(std::move(s));
    conn->open_session();
  }
  ~upstream_fixture() { conn->dead = true; }

  // Both sides exchange until neither has more to say.
  void converse() {
    for (int turn = 0; turn < 16; ++turn) {
      const std::string up = conn->take_output(), back = server.take();
      if (up.empty() && back.empty()) return;
      server.give(up);
      if (!back.empty()) conn->receive(reinterpret_cast<const std::uint8_t*>(back.data()), back.size());
    }
  }
  const proxy_metrics::upstream_series& counted() const { return rt->upstream_metrics[0]; }

  manual_clock clk;
  smockron::metrics::registry registry;
  proxy_metrics metrics{registry};
  domain_registry domains;
  config::proxy_config cfg;
  std::shared_ptr<const runtime> rt;
  asio::io_context ioc;
  std::unique_ptr<h2_upstream_pool::impl> pool;
  std::shared_ptr<h2_upstream_conn> conn;
  http1::request_head req;
  h2_stream st{1, 4096};
  recording_downstream down;
  h2_server server;
};

TEST(H2Upstream, HeadBodyAndTrailersReachTheClientStream) {
  upstream_fixture f;
  f.converse();
  ASSERT_EQ(f.server.requests.size(), 1u);
  EXPECT_EQ(f.down.server, std::optional<std::size_t>(0));
  f.server.respond(f.server.requests[0], "200", "hello", true);
  f.converse();
  ASSERT_FALSE(f.down.head.empty());
  EXPECT_EQ(f.down.head.front(), (std::pair<std::string, std::string>{":status", "200"}));
  EXPECT_EQ(f.down.body, "hello");
  EXPECT_EQ(f.down.trailers, (std::vector<std::pair<std::string, std::string>>{{"grpc-status", "0"}}));
  EXPECT_TRUE(f.down.ended);
  EXPECT_EQ(f.down.failed, 0u);
  EXPECT_EQ(f.counted().by_class[1]->value(), 1u);  // 2xx
  EXPECT_EQ(f.counted().seconds->count(), 1u);
}

// The upstream's window opens as the client stream takes the bytes, not as they arrive.
TEST(H2Upstream, TheWindowOpensAsTheClientTakes) {
  upstream_fixture f;
  f.converse();
  ASSERT_EQ(f.server.requests.size(), 1u);
  f.server.respond(f.server.requests[0], "200", std::string(200'000, 'x'), false);
  f.converse();
  EXPECT_EQ(f.down.body.size(), 65'535u);  // one default stream window, no more
  EXPECT_FALSE(f.down.ended);
  f.converse();
  EXPECT_EQ(f.down.body.size(), 65'535u);  // nothing taken: nothing more comes
  // Each time the client takes what it has, at most one window more arrives.
  std::size_t taken = 0;
  for (int round = 0; round < 20 && !f.down.ended; ++round) {
    f.down.up->consumed(f.down.body.size() - taken);
    taken = f.down.body.size();
    f.converse();
    EXPECT_LE(f.down.body.size(), taken + 65'535u);
  }
  EXPECT_EQ(f.down.body.size(), 200'000u);
  EXPECT_TRUE(f.down.ended);
}

TEST(H2Upstream, AStreamTheServerResetsFailsWith502) {
  upstream_fixture f;
  f.converse();
  ASSERT_EQ(f.server.requests.size(), 1u);
  nghttp2_submit_rst_stream(f.server.session, NGHTTP2_FLAG_NONE, f.server.requests[0], NGHTTP2_INTERNAL_ERROR);
  f.converse();
  EXPECT_EQ(f.down.failed, 502u);
  EXPECT_EQ(f.down.failed_why, "upstream reset the stream\n");
  EXPECT_FALSE(f.down.failed_started);
  EXPECT_EQ(f.metrics.upstream_reset.value(), 1u);
}

TEST(H2Upstream, GoawayTakesTheConnectionOutOfUse) {
  upstream_fixture f;
  f.converse();
  EXPECT_TRUE(f.conn->usable());
  nghttp2_submit_goaway(f.server.session, NGHTTP2_FLAG_NONE, 1, NGHTTP2_NO_ERROR, nullptr, 0);
  f.converse();
  EXPECT_FALSE(f.conn->usable());
  f.server.respond(f.server.requests[0], "204", "", false);  // the stream under way still finishes
  f.converse();
  EXPECT_TRUE(f.down.ended);
}

TEST(H2Upstream, AServerThatIsNotHttp2EndsTheConnection) {
  upstream_fixture f;
  f.converse();
  const std::string junk = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
  f.conn->receive(reinterpret_cast<const std::uint8_t*>(junk.data()), junk.size());
  const std::string out = f.conn->take_output();
  EXPECT_NE(out.find(static_cast<char>(NGHTTP2_GOAWAY)), std::string::npos);
  EXPECT_EQ(nghttp2_session_want_read(f.conn->session), 0);  // the read loop ends; its streams fail (die)
}

}  // namespace
}  // namespace smockron::proxy::test
