// smockron-proxy's server: worker threads (one io_context each, owning their
// sessions, upstream pool and accounting socket), listeners with SO_REUSEPORT,
// the control subscriber, the admin endpoint, graceful shutdown and reload.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "shared/base/clock.hpp"
#include "shared/config/config.hpp"

namespace smockron::proxy {

class server {
public:
  /// Binds listen and admin sockets (throws std::system_error at start-up).
  server(const config::proxy_config& cfg, const clock& clk);
  ~server();

  /// Serves until stop(); then drains within the grace period.
  void run();
  /// Stop accepting, finish in-flight and held requests (grace period), return from run().
  void stop();
  /// Applies routes, upstreams and limits from a new config (listeners and endpoints need a restart).
  void reload(const config::proxy_config& next);
  /// Reopens the access log file (SIGUSR1, after log rotation moved it).
  void reopen_logs();

  std::uint16_t port() const;
  std::uint16_t admin_port() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace smockron::proxy
