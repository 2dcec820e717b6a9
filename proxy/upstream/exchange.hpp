// The upstream exchange's one interface, whatever either side speaks: the
// client side (`downstream`: an HTTP/2 client connection's streams, or an
// HTTP/1.1 client's bridge) hears the response as fields, body pieces,
// trailers, an end or a failure, and gives the request body when asked; the
// upstream side (`upstream_exchange`: HTTP/2, h2_upstream.hpp, or HTTP/1.1,
// h1_upstream.hpp) is told when body bytes come, when response bytes are
// taken, when the client leaves, and when to look at its deadline. An
// HTTP/1.1 client to an HTTP/1.1 upstream goes through the same HTTP/1.1
// exchange (h1_exchange.hpp) with its bytes relayed socket to socket
// instead (http1/forward.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "proxy/codec/h2_fields.hpp"
#include "proxy/codec/http1.hpp"
#include "proxy/request/routes.hpp"
#include "proxy/request/runtime.hpp"
#include "shared/base/clock.hpp"

namespace smockron::proxy {

struct h2_stream;  // the client's request and what answers it (request/h2_stream.hpp)

/// The upstream side of one exchange, as the client side calls it: an
/// HTTP/2 stream on a multiplexed connection (h2_upstream.hpp), or an
/// HTTP/1.1 connection of the worker's pool (h1_upstream.hpp). Valid from attach()
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
/// client's bridge to an HTTP/2 upstream (http1/bridge.hpp).
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

}  // namespace smockron::proxy
