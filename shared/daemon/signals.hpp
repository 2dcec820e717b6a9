// Signal handling shared by both daemons: SIGHUP -> reload (every time),
// SIGUSR1 -> reopen log files (every time, when the daemon has any),
// SIGINT/SIGTERM -> stop (once). Handlers run on the given io_context.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <functional>

namespace smockron {

class signal_handler {
public:
  signal_handler(boost::asio::io_context& ioc, std::function<void()> on_reload, std::function<void(int)> on_stop,
                 std::function<void()> on_reopen = {});

private:
  void wait();

  boost::asio::signal_set signals_;
  std::function<void()> on_reload_;
  std::function<void(int)> on_stop_;
  std::function<void()> on_reopen_;
};

}  // namespace smockron
