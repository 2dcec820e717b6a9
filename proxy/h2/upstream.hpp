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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "proxy/codec/h2_fields.hpp"
#include "proxy/codec/http1.hpp"
#include "proxy/io/asio_types.hpp"
#include "proxy/request/proxy_metrics.hpp"
#include "proxy/request/routes.hpp"
#include "proxy/request/runtime.hpp"
#include "shared/base/clock.hpp"

namespace smockron::proxy {

struct h2_stream;  // a client's stream (stream.hpp)
struct h2_upstream_stream;

/// What an upstream stream reports to the client stream it serves, and takes from it.
class h2_downstream {
public:
  virtual ~h2_downstream() = default;
  /// The response head (`end_stream`: a head-only response, trailers-only for gRPC).
  virtual void on_response(h2_stream& st, const std::vector<h2::field>& fields, bool end_stream) = 0;
  virtual void on_data(h2_stream& st, std::string_view data) = 0;
  virtual void on_trailers(h2_stream& st, const std::vector<h2::field>& fields) = 0;
  /// The response is complete (after its trailers, if any).
  virtual void on_end(h2_stream& st) = 0;
  /// The exchange failed: answer `status` if no response has started, else reset.
  virtual void on_failed(h2_stream& st, unsigned status, std::string_view why, bool response_started) = 0;
  /// Request body bytes for the upstream: at most `n` into `buf`; `eof` once
  /// the body has ended. 0 without eof: none at hand yet.
  virtual std::size_t take_body(h2_stream& st, std::uint8_t* buf, std::size_t n, bool& eof) = 0;
  /// The upstream stream now serving `st` (the client's calls below go to it).
  virtual void attach(h2_stream& st, h2_upstream_stream* up) = 0;
  /// The request went to server `server` (an index into the upstream's servers): the outcome's server.
  virtual void on_submitted(h2_stream& st, std::size_t server) = 0;
};

/// One request to start on an HTTP/2 upstream.
struct h2_upstream_request {
  h2_stream& st;
  h2_downstream& down;
  const http1::request_head& req;
  http1::forward_info hop;
  std::shared_ptr<const runtime> rt;
  const route& r;
};

/// The client side's calls into its upstream stream.
/// More request body bytes are at hand (or the body ended).
void h2_upstream_body_ready(h2_upstream_stream& s);
/// The client took `n` response bytes: the upstream's window opens by as much.
void h2_upstream_consumed(h2_upstream_stream& s, std::size_t n);
/// The client is gone (reset, or its connection closed): the upstream stream is reset.
void h2_upstream_cancel(h2_upstream_stream& s);

class h2_upstream_pool {
public:
  h2_upstream_pool(executor_t ex, const clock& clk, proxy_metrics& m);
  ~h2_upstream_pool();
  h2_upstream_pool(const h2_upstream_pool&) = delete;
  h2_upstream_pool& operator=(const h2_upstream_pool&) = delete;

  /// Starts `req` on a connection with room (opened if need be). The
  /// outcome reaches `req.down`; the client stream's `up2` is set here.
  void start(const h2_upstream_request& req);

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

}  // namespace smockron::proxy
