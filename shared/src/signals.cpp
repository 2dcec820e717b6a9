// SIGHUP/SIGINT/SIGTERM dispatch for both daemons.
#include "smockron/signals.hpp"

#include <csignal>

namespace smockron {

signal_handler::signal_handler(boost::asio::io_context& ioc, std::function<void()> on_reload,
                               std::function<void(int)> on_stop)
    : signals_(ioc, SIGINT, SIGTERM, SIGHUP), on_reload_(std::move(on_reload)), on_stop_(std::move(on_stop)) {
  wait();
}

void signal_handler::wait() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      on_reload_();
      wait();
      return;
    }
    on_stop_(sig);
  });
}

}  // namespace smockron
