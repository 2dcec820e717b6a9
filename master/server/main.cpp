// smockron-master: start-up and signals. The service (service.hpp) receives
// accounting messages from gatekeepers, applies the rules and publishes
// DELAY_UNTIL on the main thread; the admin endpoint (admin.hpp) and signals
// run on a second thread.
#include <boost/asio/io_context.hpp>

#include <csignal>
#include <iostream>
#include <thread>

#include "master/server/admin.hpp"
#include "master/server/service.hpp"
#include "shared/daemon/admin_server.hpp"
#include "shared/daemon/daemon.hpp"
#include "shared/daemon/signals.hpp"
#include "smockron/version.hpp"

namespace asio = boost::asio;
using namespace smockron;

int main(int argc, char** argv) {
  int exit_code = 0;
  auto start = daemon::prepare(argc, argv, "smockron-master", {"--healthcheck"},
                               "  --healthcheck      probe the admin endpoint's /livez; exit 0 if healthy\n", "master",
                               nullptr, exit_code);
  if (!start) return exit_code;
  if (!start->options.extra.empty()) return daemon::healthcheck(start->cfg.master->admin);
  const config::master_config& cfg = *start->cfg.master;
  auto log = log::get("master");

  metrics::registry registry;
  std::unique_ptr<master::service> svc;
  try {
    svc = std::make_unique<master::service>(cfg, system_clock::instance(), registry);
  } catch (const std::exception& e) {  // std::runtime_error (an endpoint) or std::system_error (epoll)
    log->critical("cannot bind accounting {} / control {}: {}", cfg.accounting, cfg.control, e.what());
    return 1;
  }

  std::atomic<bool> stop{false};
  asio::io_context ioc(1);
  std::unique_ptr<admin_server> admin;
  try {
    admin = std::make_unique<admin_server>(
        ioc, cfg.admin,
        [&](std::string_view path, std::string_view query) {
          return master::admin_response(*svc, registry, path, query);
        },
        admin_server::access{cfg.admin_allow, &registry.add_counter("smockron_master_refused_connections_total",
                                                                    "Connections refused by an endpoint's allow list",
                                                                    metrics::labels({{"endpoint", "admin"}}))});
    admin->set_filter([&](const admin_server::request_view& req) {
      if (auto refused = master::admin_guard(*svc, req)) return refused;
      return master::overrides_api(*svc, req);
    });
  } catch (const std::exception& e) {
    log->critical("admin endpoint: {}", e.what());
    return 1;
  }

  signal_handler signals(
      ioc,
      [&] {
        log->info("SIGHUP: reloading configuration");
        svc->request_reload([&]() -> std::optional<config::master_config> {
          auto next = daemon::reload(start->options, "master");
          if (next && next->master) return std::move(*next->master);
          if (next) log->error("reload rejected: no [master] table");
          return std::nullopt;
        });
      },
      [&](int sig) {
        log->info("signal {}: shutting down", sig);
        stop = true;
      },
      // SIGUSR1 is what log rotation sends every daemon; the master writes only to stderr.
      [&] { log->info("SIGUSR1: no log file to reopen (the master logs to stderr)"); });
  // Logged before the admin endpoint answers: whoever saw /readyz answer can read the bound ports here.
  log->info("smockron-master {} accounting={} control={} admin={} domains={}{}{}", version_string, cfg.accounting,
            cfg.control, cfg.admin.to_string(), cfg.domains.size(),
            cfg.query ? " query=udp:" + host_port{cfg.query->host, svc->query_port()}.to_string() : std::string(),
            cfg.rls ? " rls=" + host_port{cfg.rls->host, svc->rls_port()}.to_string() : std::string());
  std::thread admin_thread([&] { ioc.run(); });

  svc->run(stop);
  svc->finish(std::chrono::seconds(2));

  admin->stop();
  ioc.stop();
  admin_thread.join();
  log->info("stopped");
  return 0;
}
