// HTTP/2 to upstream servers (protocol = "h2c" or "h2"): per worker, per
// server, a few multiplexed connections, each carrying at most the
// upstream's max_streams (or the server's SETTINGS_MAX_CONCURRENT_STREAMS,
// if lower) streams at once; a stream that finds no room opens another
// connection. libnghttp2's client session is the codec, our Asio I/O drives
// it. A client's HTTP/2 stream maps onto one upstream stream: fields,
// body, response, trailers and resets pass through, each side's flow-control
// window opening only as the other side takes the bytes (a slow client
// stalls only its own stream, never the connection). Servers are taken
// round-robin; a server whose connect fails is skipped for the upstream's
// fail_timeout, and a stream waiting for that connection goes to the next
// server, as with HTTP/1.1.
#pragma once

#include <memory>

#include "proxy/io/asio_types.hpp"
#include "proxy/request/proxy_metrics.hpp"
#include "proxy/upstream/exchange.hpp"
#include "shared/base/clock.hpp"

namespace smockron::proxy {

/// A worker's HTTP/2 upstream connections.
class h2_upstream_pool {
public:
  h2_upstream_pool(executor_t ex, const clock& clk, proxy_metrics& m);
  ~h2_upstream_pool();
  h2_upstream_pool(const h2_upstream_pool&) = delete;
  h2_upstream_pool& operator=(const h2_upstream_pool&) = delete;

  /// Starts `req` on a connection with room (opened if need be). The
  /// outcome reaches `req.down`; the client side's attach() comes from here.
  void start(const upstream_request& req);

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

}  // namespace smockron::proxy
