// SIGHUP/SIGINT/SIGTERM dispatch for both daemons.
#include "shared/daemon/signals.hpp"

#include <csignal>

namespace smockron {

signal_handler::signal_handler(boost::asio::io_context& ioc, std::function<void()> on_reload,
                               std::function<void(int)> on_stop, std::function<void()> on_reopen)
    : signals_(ioc, SIGINT, SIGTERM, SIGHUP),
      on_reload_(std::move(on_reload)),
      on_stop_(std::move(on_stop)),
      on_reopen_(std::move(on_reopen)) {
  if (on_reopen_) signals_.add(SIGUSR1);
  wait();
}

void signal_handler::wait() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP || sig == SIGUSR1) {
      (sig == SIGHUP ? on_reload_ : on_reopen_)();
      wait();
      return;
    }
    on_stop_(sig);
  });
}

}  // namespace smockron
