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

/// The upstream side of one exchange, as the client side calls it: an
/// HTTP/2 stream on a multiplexed connection (here), or an HTTP/1.1
/// connection of the worker's pool (h1_upstream.hpp). Valid from attach()
/// until the exchange's end or failure reaches the client side, or the
/// client side cancels it.
class upstream_exchange {
public:
  /// More request body bytes are at hand (or the body ended).
  virtual void body_ready() = 0;
  /// The client took `n` response bytes: the upstream may send as much again.
  virtual void consumed(std::size_t n) = 0;
  /// The client is gone (reset, or its connection closed): the exchange
  /// stops, and tells the client side nothing more.
  virtual void cancel() = 0;
  /// Enforces the exchange's deadline at `now` (an HTTP/1.1 exchange's
  /// reads and writes; an HTTP/2 connection keeps its own).
  virtual void sweep(steady::time_point now) = 0;

protected:
  ~upstream_exchange() = default;
};

/// The client side of an exchange: what the upstream side (either
/// protocol) reports to the client stream it serves, and takes from it. An
/// HTTP/2 client connection is one (for all its streams), and an HTTP/1.1
/// client's bridge to an HTTP/2 upstream (bridge.hpp).
class downstream {
public:
  virtual ~downstream() = default;
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
  /// The exchange now serving `st` (the client's calls go to it).
  virtual void attach(h2_stream& st, upstream_exchange* up) = 0;
  /// The request went to server `server` (an index into the upstream's servers): the outcome's server.
  virtual void on_submitted(h2_stream& st, std::size_t server) = 0;
};

/// One request to start on an upstream (either protocol).
struct upstream_request {
  h2_stream& st;
  downstream& down;
  const http1::request_head& req;
  http1::forward_info hop;
  std::shared_ptr<const runtime> rt;
  const route& r;
};

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
