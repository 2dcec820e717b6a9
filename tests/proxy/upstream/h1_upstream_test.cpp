// The HTTP/1.1 upstream of a client's HTTP/2 stream (h1_upstream.hpp)
// against a server on loopback TCP, all in one io_context: the response
// reaches the client side as fields, body pieces and trailers (1xx not passed
// on), the request body goes out as the client side gives it, response bytes
// are read only as the client side takes them, the deadline holds when the
// client side sweeps, and a cancelled exchange tells nothing more and keeps
// no connection.
#include <gtest/gtest.h>

#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "proxy/request/h2_stream.hpp"
#include "proxy/upstream/h1_upstream.hpp"
#include "shared/base/clock.hpp"
#include "shared/config/config.hpp"

namespace smockron::proxy::test {
namespace {

using namespace std::chrono_literals;
using field_list = std::vector<std::pair<std::string, std::string>>;

/// h1_upstream.cpp's k_response_buffer: response bytes the client side may hold untaken.
constexpr std::size_t k_response_buffer = 65536;

constexpr std::string_view k_get = "GET /svc HTTP/1.1\r\nHost: up.example\r\n\r\n";

// What the client stream is told, and the request body it gives.
struct recording_downstream final : downstream {
  void on_response(h2_stream&, const std::vector<h2::field>& f, bool end_stream) override {
    ++events;
    ++responses;
    for (const auto& x : f) head.emplace_back(x.name, x.value);
    head_only = end_stream;
  }
  void on_data(h2_stream&, std::string_view d) override {
    ++events;
    body.append(d);
  }
  void on_trailers(h2_stream&, const std::vector<h2::field>& f) override {
    ++events;
    for (const auto& x : f) trailers.emplace_back(x.name, x.value);
  }
  void on_end(h2_stream&) override {
    ++events;
    ended = true;
    up = nullptr;  // the exchange is over: not to be called again
  }
  void on_failed(h2_stream&, unsigned status, std::string_view why, bool started) override {
    ++events;
    failed = status;
    failed_why = why;
    failed_started = started;
    up = nullptr;
  }
  std::size_t take_body(h2_stream&, std::uint8_t* buf, std::size_t n, bool& eof) override {
    const std::size_t taken = std::min(n, body_out.size() - body_at);
    std::memcpy(buf, body_out.data() + body_at, taken);
    body_at += taken;
    eof = body_end && body_at == body_out.size();
    if (taken == 0 && !eof && on_starved) on_starved();
    return taken;
  }
  void attach(h2_stream&, upstream_exchange* x) override { up = x; }
  void on_submitted(h2_stream&, std::size_t s) override { server = s; }

  /// More request body for the upstream (`end`: the body ends with it), as the client side says so.
  void give(std::string_view bytes, bool end) {
    body_out.append(bytes);
    body_end = end;
    if (up) up->body_ready();
  }
  bool done() const { return ended || failed != 0; }

  field_list head, trailers;
  std::string body;
  bool head_only = false, ended = false, failed_started = false;
  unsigned failed = 0;
  std::string failed_why;
  int events = 0;  ///< calls that tell the client side something of the response
  int responses = 0;
  upstream_exchange* up = nullptr;
  std::optional<std::size_t> server;
  std::string body_out;  ///< the request body the client side has
  std::size_t body_at = 0;
  bool body_end = false;
  std::function<void()> on_starved;  ///< called when the upstream asks for body and none is at hand
};

// One connection the server accepted.
struct server_conn {
  explicit server_conn(tcp_socket s) : sock(std::move(s)) {}

  tcp_socket sock;
  std::string got;      ///< what the proxy sent on it
  bool closed = false;  ///< the proxy closed (or reset) it
  std::array<char, 4096> buf{};
  std::deque<std::string> out{};  ///< writes in order; the front one is under way
};

// An upstream server: it accepts every connection, keeps what each sent, and
// writes what the test says.
class fake_server {
public:
  explicit fake_server(executor_t ex) : acceptor_(ex, {asio::ip::make_address("127.0.0.1"), 0}) { accept(); }

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  void send(std::size_t conn, std::string bytes) {
    const auto& c = conns.at(conn);
    c->out.push_back(std::move(bytes));
    if (c->out.size() == 1) write_next(c);
  }
  /// Complete request heads connection `conn` has received (none before it is accepted).
  std::size_t heads(std::size_t conn) const {
    if (conn >= conns.size()) return 0;
    std::size_t n = 0;
    for (auto at = conns[conn]->got.find("\r\n\r\n"); at != std::string::npos;
         at = conns[conn]->got.find("\r\n\r\n", at + 4)) {
      ++n;
    }
    return n;
  }

  std::vector<std::shared_ptr<server_conn>> conns;

private:
  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp_socket s) {
      if (ec) return;
      auto c = std::make_shared<server_conn>(std::move(s));
      conns.push_back(c);
      read(c);
      accept();
    });
  }
  static void read(std::shared_ptr<server_conn> c) {
    auto& conn = *c;
    conn.sock.async_read_some(asio::buffer(conn.buf), [c = std::move(c)](boost::system::error_code ec, std::size_t n) {
      c->got.append(c->buf.data(), n);
      if (ec) c->closed = true;
      else read(c);
    });
  }
  static void write_next(std::shared_ptr<server_conn> c) {
    auto& conn = *c;
    asio::async_write(conn.sock, asio::buffer(conn.out.front()),
                      [c = std::move(c)](boost::system::error_code ec, std::size_t) {
                        c->out.pop_front();
                        if (!ec && !c->out.empty()) write_next(c);
                      });
  }

  tcp_acceptor acceptor_;
};

// A worker's part: the configuration (its upstream is the fake server, or a
// port nothing listens on), the pool, and two client streams.
struct h1_fixture {
  explicit h1_fixture(std::string_view proxy_settings = {}, bool server_listens = true) {
    // A port bound and never listened on: a connect to it is refused, and no one else can take it meanwhile.
    tcp_acceptor::endpoint_type any{asio::ip::make_address("127.0.0.1"), 0};
    unused.open(any.protocol());
    unused.bind(any);
    const std::uint16_t port = server_listens ? server.port() : unused.local_endpoint().port();
    std::string text = "[proxy]\nlisten = \"127.0.0.1:0\"\n";
    text.append(proxy_settings);
    text += "\n[proxy.upstreams.app]\nservers = [\"127.0.0.1:" + std::to_string(port) + "\"]\n";
    text += "[[proxy.routes]]\npath = \"/\"\nupstream = \"app\"\n";
    auto loaded = config::load_string(text, "h1_upstream_test.toml");
    if (!loaded.cfg || !loaded.cfg->proxy) throw std::runtime_error("the test's configuration does not load");
    rt = std::make_shared<const runtime>(*loaded.cfg->proxy, domains, metrics, 0);
  }

  /// Starts `request` (a head as an HTTP/1.1 client would send it) for client stream `s`.
  void start(recording_downstream& d, h2_stream& s, std::string_view request) {
    http1::request_head req;
    ASSERT_EQ(http1::parse_request(request, 4096, req).status, http1::parse_status::complete);
    start_h1_upstream(h1_exchange_env{pool, metrics, clk}, ioc.get_executor(),
                      upstream_request{s, d, req, http1::forward_info{}, rt, rt->routes.routes().front()});
    ASSERT_NE(d.up, nullptr);  // attached before start returns
  }
  // Runs the io_context until `done` (10 s of real time at most: a guard against a hang, not a timeout).
  template <class F>
  bool run_until(F done) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (!done() && std::chrono::steady_clock::now() < end) {
      if (ioc.stopped()) ioc.restart();
      ioc.run_one_for(10ms);
    }
    return done();
  }
  // Runs the io_context until nothing is left to do (bounded). What a test
  // checks after it is what must NOT have happened: stopping early could
  // only let such a check pass, never fail one that should pass.
  void settle() {
    for (int round = 0; round < 1000; ++round) {
      if (ioc.stopped()) ioc.restart();
      if (ioc.poll() == 0 && ioc.run_one_for(5ms) == 0) return;
    }
  }
  const std::string& got(std::size_t conn) const { return server.conns.at(conn)->got; }
  const proxy_metrics::upstream_series& counted() const { return rt->upstream_metrics[0]; }

  // What the exchanges refer to outlives the io_context (which may still hold one's coroutine).
  manual_clock clk;
  smockron::metrics::registry registry;
  proxy_metrics metrics{registry};
  domain_registry domains;
  std::atomic<bool> resolve_soon{false};
  recording_downstream down, down2;
  h2_stream st{1, 4096}, st2{3, 4096};
  asio::io_context ioc;
  fake_server server{ioc.get_executor()};
  tcp_acceptor unused{ioc.get_executor()};
  std::shared_ptr<const runtime> rt;
  upstream_pool pool{ioc.get_executor(), clk, metrics, resolve_soon};
};

bool has_field(const field_list& fields, std::string_view name) {
  for (const auto& [n, v] : fields) {
    if (n == name) return true;
  }
  return false;
}

// A final response after 100 Continue: the client side hears the 200 alone,
// its body and its end; the exchange is counted once, by its final status;
// the connection goes back to the pool and carries the next request.
TEST(H1Upstream, InterimResponsesAreNotPassedOnAndTheConnectionIsReused) {
  h1_fixture f;
  f.start(f.down, f.st, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(0) == 1; }));
  EXPECT_TRUE(f.got(0).starts_with("GET /svc HTTP/1.1\r\n")) << f.got(0);
  EXPECT_NE(f.got(0).find("\r\nHost: up.example\r\n"), std::string::npos) << f.got(0);
  f.server.send(0, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
  ASSERT_TRUE(f.run_until([&] { return f.down.done(); }));
  EXPECT_EQ(f.down.failed, 0u) << f.down.failed_why;
  EXPECT_EQ(f.down.responses, 1);
  ASSERT_FALSE(f.down.head.empty());
  EXPECT_EQ(f.down.head.front(), (std::pair<std::string, std::string>{":status", "200"}));
  EXPECT_EQ(std::count_if(f.down.head.begin(), f.down.head.end(), [](const auto& x) { return x.first == ":status"; }),
            1);
  EXPECT_TRUE(has_field(f.down.head, "content-length"));  // relayed as framed
  EXPECT_FALSE(f.down.head_only);
  EXPECT_EQ(f.down.body, "hello");
  EXPECT_TRUE(f.down.ended);
  EXPECT_EQ(f.down.server, std::optional<std::size_t>(0));
  EXPECT_EQ(f.counted().by_class[0]->value(), 0u);  // the 100 is no response of its own
  EXPECT_EQ(f.counted().by_class[1]->value(), 1u);
  EXPECT_EQ(f.counted().seconds->count(), 1u);

  f.start(f.down2, f.st2, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.server.conns.size() > 1 || f.server.heads(0) == 2; }));
  ASSERT_EQ(f.server.conns.size(), 1u);  // no second connection
  f.server.send(0, "HTTP/1.1 204 No Content\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return f.down2.done(); }));
  EXPECT_TRUE(f.down2.ended);
  EXPECT_TRUE(f.down2.head_only);  // a response without body ends with its head
  EXPECT_EQ(f.down2.body, "");
  EXPECT_EQ(f.counted().by_class[1]->value(), 2u);
  EXPECT_EQ(f.metrics.upstream_reset.value(), 0u);
}

// A body without a length goes out chunked, piece by piece as the client side
// gives it (nothing ends it before the client side does, and the upstream's
// deadline does not run while it waits for the client); a chunked response's
// trailers reach the client side with lower-case names.
TEST(H1Upstream, AChunkedBodyGoesOutAsGivenAndTrailersComeBack) {
  h1_fixture f;
  f.start(f.down, f.st, "POST /upload HTTP/1.1\r\nHost: up.example\r\nTransfer-Encoding: chunked\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(0) == 1; }));
  f.settle();  // the exchange waits for the body
  const std::size_t head_end = f.got(0).find("\r\n\r\n") + 4;
  EXPECT_NE(f.got(0).substr(0, head_end).find("\r\nTransfer-Encoding: chunked\r\n"), std::string::npos) << f.got(0);
  EXPECT_EQ(f.got(0).substr(head_end), "");

  f.down.give("abc", false);
  ASSERT_TRUE(f.run_until([&] { return f.got(0).size() >= head_end + 8; }));
  f.settle();  // the exchange waits for more
  ASSERT_NE(f.down.up, nullptr);
  f.clk.advance(2 * f.rt->cfg.upstream_timeout);
  f.down.up->sweep(f.clk.steady_now());
  f.settle();
  EXPECT_EQ(f.got(0).substr(head_end), "3\r\nabc\r\n");
  EXPECT_FALSE(f.down.done()) << f.down.failed_why;

  f.down.give("def", true);
  ASSERT_TRUE(f.run_until([&] { return f.got(0).ends_with("0\r\n\r\n"); }));
  EXPECT_EQ(f.got(0).substr(head_end), "3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n");

  f.server.send(0,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Tokens-Used\r\n\r\n"
                "5\r\nhello\r\n6\r\n world\r\n0\r\nX-Tokens-Used: 7\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return f.down.done(); }));
  EXPECT_EQ(f.down.failed, 0u) << f.down.failed_why;
  ASSERT_FALSE(f.down.head.empty());
  EXPECT_EQ(f.down.head.front(), (std::pair<std::string, std::string>{":status", "200"}));
  EXPECT_FALSE(has_field(f.down.head, "transfer-encoding"));
  EXPECT_FALSE(f.down.head_only);
  EXPECT_EQ(f.down.body, "hello world");
  EXPECT_EQ(f.down.trailers, (field_list{{"x-tokens-used", "7"}}));
  EXPECT_TRUE(f.down.ended);
}

// Response bytes are read only while the client side holds less than 64 KiB
// of them untaken (one read more at most), however long the server has more
// to give; nor does the upstream's deadline run while the client side holds
// them. As the client side takes them the rest comes, to the end.
TEST(H1Upstream, TheResponseIsReadOnlyAsTheClientTakesIt) {
  h1_fixture f;
  f.start(f.down, f.st, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(0) == 1; }));
  constexpr std::size_t total = 200'000;
  f.server.send(0, "HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + std::string(total, 'x'));
  ASSERT_TRUE(f.run_until([&] { return f.down.body.size() >= k_response_buffer; }));
  f.settle();
  EXPECT_LT(f.down.body.size(), k_response_buffer + k_relay_chunk);
  f.clk.advance(2 * f.rt->cfg.upstream_timeout);
  ASSERT_NE(f.down.up, nullptr);
  f.down.up->sweep(f.clk.steady_now());
  f.settle();
  EXPECT_LT(f.down.body.size(), k_response_buffer + k_relay_chunk);
  EXPECT_FALSE(f.down.done()) << f.down.failed_why;

  std::size_t taken = 0;
  for (int round = 0; round < 100 && f.down.up; ++round) {
    const std::size_t had = f.down.body.size();
    f.down.up->consumed(had - taken);
    taken = had;
    ASSERT_TRUE(f.run_until([&] { return f.down.body.size() > had || f.down.done(); }));
    f.settle();
    EXPECT_LT(f.down.body.size() - taken, k_response_buffer + k_relay_chunk);
  }
  EXPECT_EQ(f.down.failed, 0u) << f.down.failed_why;
  EXPECT_TRUE(f.down.ended);
  EXPECT_EQ(f.down.body, std::string(total, 'x'));
}

// 101 to a request that asked for no upgrade: a 502, nothing of it relayed,
// and its connection not kept.
TEST(H1Upstream, SwitchingProtocolsUnaskedFailsWith502) {
  h1_fixture f;
  f.start(f.down, f.st, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(0) == 1; }));
  f.server.send(0, "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return f.down.done(); }));
  EXPECT_EQ(f.down.failed, 502u);
  EXPECT_EQ(f.down.failed_why, "upstream switched protocols unasked\n");
  EXPECT_FALSE(f.down.failed_started);
  EXPECT_EQ(f.down.responses, 0);
  EXPECT_EQ(f.metrics.upstream_reset.value(), 1u);
  EXPECT_TRUE(f.run_until([&] { return f.server.conns[0]->closed; }));
}

// A HEAD response keeps its Content-Length (the length a GET would have)
// and ends with its head; the connection serves the next request.
TEST(H1Upstream, AHeadResponseKeepsItsLength) {
  h1_fixture f;
  f.start(f.down, f.st, "HEAD /svc HTTP/1.1\r\nHost: up.example\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(0) == 1; }));
  f.server.send(0, "HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return f.down.done(); }));
  EXPECT_TRUE(f.down.ended);
  EXPECT_TRUE(f.down.head_only);
  EXPECT_TRUE(f.down.body.empty());
  EXPECT_NE(
      std::find(f.down.head.begin(), f.down.head.end(), std::pair<std::string, std::string>{"content-length", "42"}),
      f.down.head.end());
}

TEST(H1Upstream, AMalformedResponseHeadFailsWith502) {
  h1_fixture f;
  f.start(f.down, f.st, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(0) == 1; }));
  f.server.send(0, "HTTP/1.1 abc\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return f.down.done(); }));
  EXPECT_EQ(f.down.failed, 502u);
  EXPECT_EQ(f.down.failed_why, "upstream sent a malformed response\n");
  EXPECT_FALSE(f.down.failed_started);
  EXPECT_EQ(f.down.responses, 0);
  EXPECT_EQ(f.metrics.upstream_reset.value(), 1u);
}

// A server that never answers: the exchange's deadline (upstream_timeout on
// the injected clock) holds when the client side sweeps past it, not before.
TEST(H1Upstream, ASweepPastTheDeadlineFailsWith504) {
  h1_fixture f;
  f.start(f.down, f.st, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(0) == 1; }));
  f.settle();  // the exchange waits for the response
  const auto timeout = f.rt->cfg.upstream_timeout;
  ASSERT_NE(f.down.up, nullptr);
  f.clk.advance(timeout - 1ms);
  f.down.up->sweep(f.clk.steady_now());
  f.settle();
  ASSERT_FALSE(f.down.done()) << f.down.failed_why;
  EXPECT_EQ(f.metrics.upstream_timeout.value(), 0u);

  f.clk.advance(2ms);
  f.down.up->sweep(f.clk.steady_now());
  ASSERT_TRUE(f.run_until([&] { return f.down.done(); }));
  EXPECT_EQ(f.down.failed, 504u);
  EXPECT_EQ(f.down.failed_why, "upstream timed out\n");
  EXPECT_FALSE(f.down.failed_started);
  EXPECT_EQ(f.metrics.upstream_timeout.value(), 1u);
  EXPECT_EQ(f.metrics.upstream_reset.value(), 0u);
  EXPECT_TRUE(f.run_until([&] { return f.server.conns[0]->closed; }));
}

// A client side that cancels mid-response hears nothing more, whatever the
// server still sends, and the connection is closed, not pooled: the next
// request makes a new one.
TEST(H1Upstream, ACancelledExchangeTellsNothingMoreAndKeepsNoConnection) {
  h1_fixture f;
  f.start(f.down, f.st, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(0) == 1; }));
  f.server.send(0, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + std::string(10, 'x'));
  ASSERT_TRUE(f.run_until([&] { return f.down.body.size() == 10; }));
  f.settle();
  const int heard = f.down.events;
  ASSERT_NE(f.down.up, nullptr);
  f.down.up->cancel();
  f.down.up = nullptr;  // as the client side forgets it
  f.server.send(0, std::string(90, 'y'));
  ASSERT_TRUE(f.run_until([&] { return f.server.conns[0]->closed; }));
  f.settle();
  EXPECT_EQ(f.down.events, heard);
  EXPECT_EQ(f.down.body, std::string(10, 'x'));
  EXPECT_FALSE(f.down.done());

  f.start(f.down2, f.st2, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.server.heads(1) == 1; }));
  EXPECT_EQ(f.server.conns.size(), 2u);
  EXPECT_EQ(f.server.heads(0), 1u);
  f.server.send(1, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  ASSERT_TRUE(f.run_until([&] { return f.down2.done(); }));
  EXPECT_EQ(f.down2.body, "ok");
  EXPECT_TRUE(f.down2.ended);
  EXPECT_EQ(f.down.events, heard);
}

// No server accepts the connection: 502, counted as no server.
TEST(H1Upstream, NoServerFailsWith502) {
  h1_fixture f({}, false);
  f.start(f.down, f.st, k_get);
  ASSERT_TRUE(f.run_until([&] { return f.down.done(); }));
  EXPECT_EQ(f.down.failed, 502u);
  EXPECT_EQ(f.down.failed_why, "upstream unavailable\n");
  EXPECT_FALSE(f.down.failed_started);
  EXPECT_FALSE(f.down.server.has_value());  // no request went anywhere
  EXPECT_EQ(f.metrics.upstream_no_server.value(), 1u);
  EXPECT_EQ(f.metrics.upstream_connect.value(), 1u);
}

// A client body that stops coming for body_timeout is answered 408, and the
// half-sent request's connection is closed. (The timer is real time: 50 ms
// bounds only how early the answer may come.)
TEST(H1Upstream, AStalledRequestBodyIsAnswered408) {
  h1_fixture f("body_timeout = \"50ms\"\n");
  f.start(f.down, f.st, "POST /upload HTTP/1.1\r\nHost: up.example\r\nContent-Length: 10\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return f.down.done(); }));
  EXPECT_EQ(f.down.failed, 408u);
  EXPECT_EQ(f.down.failed_why, "request body timed out\n");
  EXPECT_FALSE(f.down.failed_started);
  EXPECT_EQ(f.metrics.upstream_reset.value(), 0u);
  EXPECT_EQ(f.metrics.upstream_timeout.value(), 0u);
  ASSERT_TRUE(f.run_until([&] { return f.server.conns.size() == 1 && f.server.conns[0]->closed; }));
  EXPECT_EQ(f.server.heads(0), 1u);
}

// Body bytes given in the very turn body_timeout runs out, before the
// exchange sees its timer (which a cancel can no longer stop then), still
// go upstream: the timeout is the absence of a body, checked again.
TEST(H1Upstream, ABodyThatCameAsTheTimeoutRanOutIsSent) {
  h1_fixture f("body_timeout = \"50ms\"\n");
  steady_timer same_turn(f.ioc.get_executor());
  bool waiting = false;
  f.down.on_starved = [&] {
    if (waiting) return;
    waiting = true;
    // Due before the exchange's timer whenever that is due: both complete in one turn, this one first.
    same_turn.expires_at(steady::time_point{});
    same_turn.async_wait([&](boost::system::error_code) { f.down.give("abc", true); });
  };
  f.start(f.down, f.st, "POST /upload HTTP/1.1\r\nHost: up.example\r\nContent-Length: 3\r\n\r\n");
  ASSERT_TRUE(f.run_until([&] { return waiting; }));
  // The exchange's timer is set (in the turn that asked for the body); let it run out.
  std::this_thread::sleep_for(2 * f.rt->cfg.body_timeout);
  ASSERT_TRUE(f.run_until([&] { return f.down.done() || (!f.server.conns.empty() && f.got(0).ends_with("abc")); }));
  EXPECT_EQ(f.down.failed, 0u) << f.down.failed_why;
  ASSERT_FALSE(f.server.conns.empty());
  EXPECT_TRUE(f.got(0).ends_with("\r\n\r\nabc")) << f.got(0);
}

}  // namespace
}  // namespace smockron::proxy::test
