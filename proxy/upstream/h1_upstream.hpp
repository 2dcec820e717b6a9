// An HTTP/1.1 upstream behind the interface an HTTP/2 upstream has
// (exchange.hpp): the request of a client's stream goes out on a
// connection of the worker's pool (h1_exchange.hpp: the retry rule, 1xx,
// the upstream's metrics), and the client side hears the same events either
// protocol gives: the response head as fields, body pieces, trailers (a
// chunked response's), the end or a failure. The request body is taken from
// the client side as it comes; response bytes are read from the server only
// while the client side holds less than 64 KiB of them untaken.
//
// Its reads and writes run under a deadline the client side enforces by
// calling sweep() (an HTTP/2 connection's sweep does, at least every
// `tick`): no timer or watchdog of its own.
#pragma once

#include "proxy/upstream/exchange.hpp"
#include "proxy/upstream/h1_exchange.hpp"

namespace smockron::proxy {

/// Starts `req` on its route's HTTP/1.1 upstream, on executor `ex`: the
/// client side's attach() comes before this returns, then the outcome.
void start_h1_upstream(const h1_exchange_env& env, executor_t ex, const upstream_request& req);

}  // namespace smockron::proxy
