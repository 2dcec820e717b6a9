// An HTTP/2 client connection of the proxy with no socket: its session fed
// bytes in memory (h2_connection::receive, take_output), under one
// configuration whose routes are all answered by the proxy itself (no route:
// 404; the limited route under fail_closed with no master: 503, or 403 without
// its identifier), so nothing
// goes upstream and nothing touches the network. The unit tests
// (session_test.cpp) drive it with libnghttp2's client session; the fuzz
// target (tests/fuzz/fuzz_h2_session.cpp) with arbitrary bytes.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "proxy/h2/connection.hpp"
#include "shared/base/clock.hpp"
#include "shared/config/config.hpp"

namespace smockron::proxy::test {

inline constexpr std::string_view k_session_config = R"(
[proxy]
listen = "127.0.0.1:0"
accounting = []  # no master: nothing to connect to
control = []
fail_closed = true
http2_reset_burst = 5
http2_reset_rate = 1
http2_control_burst = 20
http2_control_rate = 1
http2_max_concurrent_streams = 8
max_header_bytes = 4096
max_body_bytes = 100000

[proxy.upstreams.app]
servers = ["127.0.0.1:9"]

[[proxy.routes]]
host = "limited.example"
path = "/"
domain = "api"
upstream = "app"
identify = ["header:x-key"]
unidentified = "reject"
)";

struct h2_session_fixture {
  explicit h2_session_fixture(std::string_view toml = k_session_config) {
    auto loaded = config::load_string(toml, "session_fixture.toml");
    if (!loaded.cfg || !loaded.cfg->proxy) throw std::runtime_error("the fixture's configuration does not load");
    cfg = *loaded.cfg->proxy;
    shared = std::make_unique<shared_state>(cfg, clk, 0.0);
    rt = std::make_shared<const runtime>(cfg, shared->domains, shared->metrics, 0);
    shared->install(rt);
    w = std::make_unique<worker>(*shared, rt, 1);
    auto conn = std::make_shared<connection>(tcp_socket(w->ioc), clk, rt->tick);
    session = std::make_shared<h2_connection>(*shared, *w, std::move(conn), rt, *parse_ip("192.0.2.1"), "192.0.2.1");
    if (!session->start()) throw std::runtime_error("nghttp2 would not make a server session");
  }

  /// The client's bytes in; what the server answers out (timers and posted work run first).
  std::string exchange(std::string_view client_bytes) {
    session->receive(reinterpret_cast<const std::uint8_t*>(client_bytes.data()), client_bytes.size());
    w->ioc.poll();
    w->ioc.restart();
    return session->take_output();
  }

  manual_clock clk;
  config::proxy_config cfg;
  std::unique_ptr<shared_state> shared;
  std::shared_ptr<const runtime> rt;
  std::unique_ptr<worker> w;
  std::shared_ptr<h2_connection> session;
};

}  // namespace smockron::proxy::test
