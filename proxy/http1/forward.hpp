// Forwarding an admitted request: the upstream exchange (connection from
// the pool, request head and body out, response head in, 1xx passed on),
// the retry rule, the response body back to the client, and the tunnel after
// a 101 (WebSocket and other upgrades).
#pragma once

#include <atomic>
#include <string_view>

#include "proxy/io/conn_io.hpp"
#include "proxy/request/proxy_metrics.hpp"
#include "proxy/request/routes.hpp"
#include "proxy/request/runtime.hpp"
#include "proxy/upstream/pool.hpp"
#include "shared/base/clock.hpp"

namespace smockron::proxy {

/// What forwarding needs beyond the request: the worker's pool, the
/// counters, and whether the proxy is draining (no keep-alive then).
struct forward_env {
  upstream_pool& pool;
  proxy_metrics& metrics;
  const std::atomic<bool>& draining;
  const clock& clk;  ///< upstream response times
};

/// Forwards `c.request` (whose head is at the front of `c.in`) to the
/// route's upstream and relays the response. `hop`: the peer's address and
/// whether it is a trusted proxy (X-Forwarded-* rules, http1.hpp). Returns
/// whether the client connection goes on.
awaitable<connection_next> forward(forward_env& env, const runtime& rt, const route& r, connection& c,
                                   const http1::forward_info& hop);

}  // namespace smockron::proxy
