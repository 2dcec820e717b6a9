// smockron-proxy: the gatekeeper reverse proxy. Signals are handled on a
// small thread of their own; the server's workers do everything else.
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>

#include <csignal>
#include <iostream>
#include <thread>

#include "proxy/identify/identify.hpp"
#include "proxy/io/tls.hpp"
#include "proxy/server/server.hpp"
#include "shared/base/log.hpp"
#include "shared/daemon/daemon.hpp"
#include "shared/daemon/signals.hpp"

namespace asio = boost::asio;
using namespace smockron;

int main(int argc, char** argv) {
  int exit_code = 0;
  auto start = daemon::prepare(
      argc, argv, "smockron-proxy", {"--healthcheck"},
      "  --healthcheck      probe the admin endpoint's /livez; exit 0 if healthy\n", "proxy",
      [](const config::config& c) {
        // The JWT keys and the TLS certificates are read as the proxy would
        // read them at start and on SIGHUP.
        std::string error;
        if (!proxy::jwt_verifier::create(c.proxy->jwt, error)) return "proxy.jwt: " + error;
        try {
          if (c.proxy->tls()) proxy::tls_server check(*c.proxy);
          for (const auto& u : c.proxy->upstreams) {
            if (u.tls) proxy::make_upstream_tls(u);
          }
        } catch (const std::exception& e) {
          return std::string("proxy TLS: ") + e.what();
        }
        return std::string();
      },
      exit_code);
  if (!start) return exit_code;
  if (!start->options.extra.empty()) return daemon::healthcheck(start->cfg.proxy->admin);
  // Every client and upstream connection is a descriptor: use the hard limit, as nginx's worker_rlimit_nofile would.
  if (rlimit lim{}; ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  auto log = smockron::log::get("proxy");

  std::unique_ptr<proxy::server> srv;
  try {
    srv = std::make_unique<proxy::server>(*start->cfg.proxy, system_clock::instance());
  } catch (const std::exception& e) {
    log->critical("cannot start: {}", e.what());
    return 1;
  }

  asio::io_context signals_ioc(1);
  signal_handler signals(
      signals_ioc,
      [&] {
        log->info("SIGHUP: reloading configuration");
        auto next = daemon::reload(start->options, "proxy");
        if (next && next->proxy) srv->reload(*next->proxy);
        else if (next) log->error("reload rejected: no [proxy] table");
      },
      [&](int sig) {
        log->info("signal {}: draining (grace period {}s)", sig,
                  std::chrono::duration_cast<std::chrono::seconds>(start->cfg.proxy->grace_period).count());
        srv->stop();
      },
      [&] {
        log->info("SIGUSR1: reopening the access log");
        srv->reopen_logs();
      });
  std::thread signal_thread([&] { signals_ioc.run(); });
  srv->run();
  signals_ioc.stop();
  signal_thread.join();
  return 0;
}
