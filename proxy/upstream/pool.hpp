// One worker's upstream connections: per upstream, per server, the idle
// keep-alive connections and passive health (a server that failed to
// connect is skipped for its upstream's fail_timeout). Servers are taken
// round-robin. A pooled connection goes back only after a complete
// keep-alive response; a new configuration generation empties the pool.
#pragma once

#include <atomic>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "proxy/io/asio_types.hpp"
#include "proxy/io/conn_io.hpp"
#include "proxy/request/proxy_metrics.hpp"
#include "proxy/request/runtime.hpp"
#include "shared/base/clock.hpp"
#include "shared/base/log.hpp"

namespace smockron::proxy {

class upstream_pool {
public:
  /// `resolve_soon` is set when a connect fails: the names may point elsewhere now.
  /// `ex`: the worker's (new connections are made on it).
  upstream_pool(executor_t ex, const clock& clk, proxy_metrics& m, std::atomic<bool>& resolve_soon)
      : ex_(std::move(ex)), clock_(clk), metrics_(m), resolve_soon_(resolve_soon) {}

  /// The fast path: the next server in the rotation is up and has an idle
  /// connection; it goes into `up`. `check_idle`: make sure it is still
  /// open first. False when acquire() is needed.
  bool take_pooled(const runtime& rt, upstream_conn& up, std::size_t upstream, bool check_idle);
  /// Puts a connection into `up`: reused from the pool (when `allow_reuse`)
  /// or newly connected within connect_timeout, under `d` (the exchange's
  /// deadline). `check_idle`: make sure a pooled connection is still open
  /// before using it (worth a system call only when the request could not
  /// be resent). False when no server answered, or the exchange was
  /// cancelled meanwhile (its connect aborted before `d` passed).
  awaitable<bool> acquire(const runtime& rt, io_deadline& d, upstream_conn& up, std::size_t upstream, bool allow_reuse,
                          bool check_idle);
  /// Returns `up` to the pool (up to the upstream's keepalive) or closes it.
  void give_back(const runtime& rt, upstream_conn& up, std::size_t upstream);

private:
  /// The TLS handshake on a new connection to server `s` of `upstream` (a TLS upstream). False: failed.
  awaitable<bool> start_tls(const runtime& rt, io_deadline& d, link& l, std::size_t upstream, std::size_t s);
  struct idle_link {
    link l;
    steady::time_point since;  ///< back in the pool at
  };
  struct server_slot {
    std::vector<idle_link> idle;  ///< oldest first; taken from the back (the most recently used)
    steady::time_point down_until{};
  };
  void adopt(const runtime& rt);

  executor_t ex_;
  const clock& clock_;
  proxy_metrics& metrics_;
  std::atomic<bool>& resolve_soon_;
  std::vector<std::vector<server_slot>> slots_;  ///< per upstream, per server
  std::vector<std::size_t> round_robin_;         ///< per upstream
  std::uint64_t generation_ = ~0ULL;
  log::rate_limiter tls_log_;
};

}  // namespace smockron::proxy
