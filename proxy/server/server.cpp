// smockron-proxy's server: the workers and their listeners, the control
// subscriber, the admin endpoint, graceful shutdown and reload. What one
// connection does is session.cpp.
#include <nlohmann/json.hpp>

#include "proxy/server/server.hpp"

#include <sys/socket.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include <condition_variable>
#include <random>
#include <set>
#include <thread>

#include "proxy/cluster/control_subscriber.hpp"
#include "proxy/cluster/master_discovery.hpp"
#include "proxy/http1/session.hpp"
#include "proxy/request/worker.hpp"
#include "proxy/server/admin.hpp"
#include "shared/base/log.hpp"
#include "shared/daemon/admin_server.hpp"

namespace smockron::proxy {

namespace {

double random_spread() { return std::random_device{}() / (std::random_device::max() + 1.0); }

// A worker's concurrency leases: idle slots given back, waiting ones asked for again.
awaitable<void> slot_ticks(shared_state& s, worker& w) {
  steady_timer t(w.ioc);
  for (;;) {
    t.expires_after(std::chrono::milliseconds(250));
    const auto [ec] = co_await t.async_wait(nothrow);
    if (ec) co_return;
    w.slots.tick(s.clk.wall_us());
    w.asks.tick(s.clk.wall_us());
  }
}

// One acceptor per worker on the same port (SO_REUSEPORT): the kernel spreads connections.
// Errors name the address and say why, without Asio's source locations.
void listen(worker& w, const tcp::endpoint& ep) {
  boost::system::error_code ec;
  w.acceptor.emplace(w.ioc.get_executor());
  w.acceptor->open(ep.protocol(), ec);
  if (!ec) w.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  int one = 1;
  if (!ec) ::setsockopt(w.acceptor->native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (!ec) w.acceptor->bind(ep, ec);
  if (!ec) w.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw std::runtime_error("cannot listen on " + to_string(ep) + ": " + ec.message());
  }
}

// Settings that need a restart keep their running values in `next`; returns
// the keys that differed (for the log).
std::string keep_restart_only(const config::proxy_config& running, config::proxy_config& next) {
  using c = config::proxy_config;
  next.curve = running.curve;  // the links' keys, read at start (the files may have changed since)
  return config::restart_only<c>(running, next)
      .keep(&c::listen, "listen")
      .keep(&c::admin, "admin")
      .keep(&c::admin_allow, "admin_allow")
      .keep(&c::threads, "threads")
      .keep(&c::accounting, "accounting")
      .keep(&c::control, "control")
      .keep(&c::dns_servers, "dns_servers")
      .keep(&c::dns_min_ttl, "dns_min_ttl")
      .keep(&c::dns_max_ttl, "dns_max_ttl")
      .keep(&c::dns_max_masters, "dns_max_masters")
      .keep(&c::trace, "trace_*")
      .keep(&c::shards, "shards")
      .keep(&c::curve_secret_key, "curve_secret_key")
      .keep(&c::curve_master_key, "curve_master_key")
      .keep(&c::accounting_hwm, "accounting_hwm")
      .keep(&c::max_control_entries, "max_control_entries")
      .keep(&c::log_level, "log_level")
      .changed();
}

awaitable<void> accept_loop(shared_state& s, worker& w) {
  for (;;) {
    auto [ec, socket] = co_await w.acceptor->async_accept(nothrow);
    if (ec == asio::error::operation_aborted || !w.acceptor->is_open()) co_return;
    if (ec) {
      // EMFILE and friends: back off briefly instead of spinning.
      steady_timer t(w.ioc.get_executor(), std::chrono::milliseconds(50));
      co_await t.async_wait(nothrow);
      continue;
    }
    asio::co_spawn(w.ioc.get_executor(), serve_connection(s, w, std::move(socket)), asio::detached);
  }
}

}  // namespace

struct server::impl {
  impl(const config::proxy_config& cfg, const clock& clk)
      : shared_(cfg, clk, random_spread()), log_(log::get("proxy")) {
    auto first = std::make_shared<const runtime>(cfg, shared_.domains, shared_.metrics, 0);
    shared_.install(first);
    add_gauges();
    const std::size_t threads =
        cfg.threads > 0 ? static_cast<std::size_t>(cfg.threads) : std::max(1u, std::thread::hardware_concurrency());
    const auto address = asio::ip::make_address(cfg.listen.host);
    port_ = cfg.listen.port;
    // Each worker's name in its concurrency leases: this proxy's random
    // prefix and the worker's index in the low byte.
    holder_prefix_ = (std::uint64_t{std::random_device{}()} << 32 ^ std::random_device{}()) << 8;
    for (std::size_t i = 0; i < std::min<std::size_t>(threads, 256); ++i) {
      auto w = std::make_unique<worker>(shared_, first, holder_prefix_ | i);
      listen(*w, tcp::endpoint(address, port_));  // the first binds the port (maybe 0: chosen), the rest share it
      port_ = w->acceptor->local_endpoint().port();
      worker& wr = *w;
      wr.accounting.on_link_change([&wr, &clk = shared_.clk] {
        wr.slots.links_changed([&wr](std::string_view d) { return wr.accounting.delivers(d); }, clk.wall_us());
      });
      workers_.push_back(std::move(w));
    }
    control_ = std::make_unique<control_subscriber>(
        control_ctx_, cfg.control, shared_.gate, shared_.domains, shared_.clk, shared_.registry,
        control_subscriber::concurrency_sinks{&shared_.concurrency,
                                              [this](const wire::grant& g) { return hand_grant(g); }, &shared_.exact,
                                              [this](const wire::answer& a) { return hand_answer(a); }},
        cfg.curve);
    control_->set_domains(first->routes.domains());
    if (cfg.discovers_masters()) start_discovery(cfg);
    admin_ = std::make_unique<admin_server>(
        admin_ioc_, cfg.admin,
        [this](std::string_view path, std::string_view) { return admin_response(shared_, *control_, path); },
        admin_server::access{cfg.admin_allow,
                             &shared_.registry.add_counter("smockron_proxy_refused_connections_total",
                                                           "Connections refused by an endpoint's allow list",
                                                           metrics::labels({{"endpoint", "admin"}}))});
  }

  // Masters named by DNS: each new list goes to every worker's accounting
  // sender (on its thread) and to the control subscriber.
  void start_discovery(const config::proxy_config& cfg) {
    std::vector<std::string> names = cfg.accounting;
    names.insert(names.end(), cfg.control.begin(), cfg.control.end());
    const std::set<std::string> accounting(cfg.accounting.begin(), cfg.accounting.end());
    const std::set<std::string> control(cfg.control.begin(), cfg.control.end());
    master_discovery::options o{.servers = cfg.dns_servers,
                                .bounds = {.min_ttl = cfg.dns_min_ttl,
                                           .max_ttl = cfg.dns_max_ttl,
                                           .max_masters = static_cast<std::size_t>(cfg.dns_max_masters)}};
    discovery_ = std::make_unique<master_discovery>(
        names, std::move(o),
        [this, accounting, control](const std::string& configured, const std::vector<std::string>& masters) {
          if (accounting.contains(configured)) {
            for (auto& w : workers_) {
              asio::post(w->ioc, [&w = *w, configured, masters] { w.accounting.set_masters(configured, masters); });
            }
          }
          if (control.contains(configured)) control_->set_masters(configured, masters);
        },
        shared_.registry);
  }

  // A GRANT naming one of this proxy's workers goes to that worker's thread.
  bool hand_grant(const wire::grant& g) {
    if ((g.holder & ~std::uint64_t{0xff}) != holder_prefix_) return false;
    const std::size_t i = g.holder & 0xff;
    if (i >= workers_.size()) return false;
    worker& w = *workers_[i];
    asio::post(w.ioc, [&w, &clk = shared_.clk, domain = std::string(g.domain), id = std::string(g.identifier),
                       held = g.held, cap = g.cap, seen = g.seen, holder = g.holder] {
      w.slots.on_grant(wire::grant{domain, id, holder, held, cap, seen}, clk.wall_us());
    });
    return true;
  }

  // An ANSWER naming one of this proxy's workers goes to that worker's thread.
  bool hand_answer(const wire::answer& a) {
    if ((a.holder & ~std::uint64_t{0xff}) != holder_prefix_) return false;
    const std::size_t i = a.holder & 0xff;
    if (i >= workers_.size()) return false;
    worker& w = *workers_[i];
    asio::post(w.ioc, [&w, domain = std::string(a.domain), id = std::string(a.identifier), holder = a.holder,
                       seq = a.seq, verdict = a.verdict, at_ms = a.at_ms] {
      w.asks.on_answer(wire::answer{domain, id, holder, seq, verdict, at_ms});
    });
    return true;
  }

  void add_gauges() {
    auto& r = shared_.registry;
    gate& g = shared_.gate;
    r.add_callback("smockron_proxy_held_requests", "Requests currently held", "",
                   [&g] { return static_cast<double>(g.held()); });
    r.add_callback("smockron_proxy_control_entries", "Entries in the control memory", "",
                   [&g] { return static_cast<double>(g.entries()); });
    // The bounds beside what they bound, so that alerts need no configuration of their own.
    r.add_callback("smockron_proxy_max_held", "max_held: the most requests held at once", "",
                   [this] { return static_cast<double>(shared_.current()->cfg.max_held); });
    r.add_callback("smockron_proxy_max_control_entries", "max_control_entries: the control memory's bound", "",
                   [this] { return static_cast<double>(shared_.current()->cfg.max_control_entries); });
    // Fail-open in effect: domains of the routes whose POLICY no master has refreshed lately.
    r.add_callback("smockron_proxy_domains_uncovered",
                   "Routes' domains no master covers now (their requests pass unlimited, or are refused under "
                   "fail_closed)",
                   "", [this, &g] {
                     const auto rt = shared_.current();
                     const std::int64_t now = shared_.clk.wall_us();
                     double n = 0;
                     for (std::size_t i = 0; i < rt->routes.domains().size(); ++i) {
                       n += g.covered(rt->gate_domain[i], now) ? 0 : 1;
                     }
                     return n;
                   });
    r.add_counter_callback("smockron_proxy_control_dropped_updates_total",
                           "DELAY_UNTIL updates dropped because the control memory was full (those keys fail open)",
                           [&g] { return static_cast<double>(g.dropped_updates()); });
    // Concurrency slots, over every worker.
    const auto slots = [this](std::int64_t (slot_table::*f)() const) {
      return [this, f] {
        double n = 0;
        for (const auto& w : workers_) n += static_cast<double>((w->slots.*f)());
        return n;
      };
    };
    r.add_callback("smockron_proxy_concurrency_in_flight",
                   "Requests under a concurrency rule forwarded now (each holds a slot)", "",
                   slots(&slot_table::in_use));
    r.add_callback("smockron_proxy_concurrency_waiting", "Requests waiting for a concurrency slot", "",
                   slots(&slot_table::waiting));
    r.add_callback("smockron_proxy_concurrency_slots_held", "Concurrency slots the masters lease to this proxy", "",
                   slots(&slot_table::held));
    metrics::add_build_info(r, "proxy");
    r.add_callback("smockron_proxy_open_connections", "Open client connections", "",
                   [this] { return static_cast<double>(shared_.connections.load()); });
  }

  void run() {
    for (auto& w : workers_) {
      asio::co_spawn(w->ioc.get_executor(), accept_loop(shared_, *w), asio::detached);
      asio::co_spawn(w->ioc.get_executor(), slot_ticks(shared_, *w), asio::detached);
      w->thread = std::thread([&ioc = w->ioc] {
        auto guard = asio::make_work_guard(ioc);
        ioc.run();
      });
    }
    std::thread admin_thread([this] {
      auto guard = asio::make_work_guard(admin_ioc_);
      admin_ioc_.run();
    });
    const auto& cfg = shared_.current()->cfg;
    log_->info("smockron-proxy listening on {} ({} worker threads), admin {}",
               cfg.listen.host + ":" + std::to_string(port_), workers_.size(), cfg.admin.to_string());
    {
      std::unique_lock lock(stop_mutex_);
      while (!stop_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_requested_; })) {
        lock.unlock();
        maybe_resolve();
        lock.lock();
      }
    }
    drain_connections();
    discovery_.reset();  // no new masters for workers that are stopping
    drain_accounting();
    for (auto& w : workers_) w->ioc.stop();
    for (auto& w : workers_) w->thread.join();
    admin_->stop();
    admin_ioc_.stop();
    admin_thread.join();
    control_.reset();
    log_->info("stopped");
  }

  // Stop accepting, close idle keep-alive connections, let in-flight and
  // held requests finish within the grace period.
  void drain_connections() {
    shared_.draining = true;
    for (auto& w : workers_) {
      asio::post(w->ioc, [&w = *w] {
        boost::system::error_code ignored;
        w.acceptor->close(ignored);
        for (auto* c : w.sessions) {
          if (c->idle) c->client.socket().cancel(ignored);
        }
      });
    }
    const auto deadline = steady::now() + shared_.current()->cfg.grace_period;
    while (shared_.connections.load() > 0 && steady::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (shared_.connections.load() > 0)
      log_->warn("grace period over: closing {} connection(s)", shared_.connections.load());
  }

  // Nothing accepted is lost: the last batches are written before the
  // workers stop (at most 1 s; a master that does not read gets less).
  void drain_accounting() {
    const auto until = steady::now() + std::chrono::seconds(1);
    for (;;) {
      struct pass {
        std::atomic<std::size_t> answered{0}, busy{0};
      };
      auto p = std::make_shared<pass>();  // outlives a pass cut short by the deadline
      for (auto& w : workers_) {
        asio::post(w->ioc, [&w = *w, p] {
          w.accounting.flush();
          if (!w.accounting.idle()) ++p->busy;
          ++p->answered;
        });
      }
      while (p->answered.load() < workers_.size() && steady::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if ((p->answered.load() == workers_.size() && p->busy.load() == 0) || steady::now() >= until) return;
    }
  }

  void stop() {
    std::lock_guard lock(stop_mutex_);
    stop_requested_ = true;
    stop_cv_.notify_all();
  }

  // Upstream names are resolved again every resolve_interval, and at most
  // every 5 s after a connect failed (the name may point elsewhere now). New
  // addresses make a new generation; the same ones change nothing.
  void maybe_resolve() {
    const auto rt = shared_.current();
    const auto interval = rt->cfg.resolve_interval;
    if (interval.count() == 0) return;
    const auto now = steady::now();
    const bool failed =
        shared_.resolve_soon.load(std::memory_order_relaxed) && now - last_resolve_ >= std::chrono::seconds(5);
    if (now - last_resolve_ < interval && !failed) return;
    shared_.resolve_soon = false;
    last_resolve_ = now;
    const bool named = std::any_of(rt->cfg.upstreams.begin(), rt->cfg.upstreams.end(), [](const auto& u) {
      return std::any_of(u.servers.begin(), u.servers.end(), [](const auto& s) { return !parse_ip(s.host); });
    });
    if (!named) return;
    std::lock_guard lock(install_mutex_);
    const auto current = shared_.current();  // a reload may have come meanwhile
    std::shared_ptr<const runtime> fresh;
    try {
      fresh = std::make_shared<const runtime>(current->cfg, shared_.domains, shared_.metrics, current->generation + 1,
                                              current.get());
    } catch (const std::exception& e) {
      log_->warn("upstream names not resolved again ({}); the addresses in use stay", e.what());
      return;
    }
    if (fresh->servers == current->servers) return;
    shared_.install(fresh);
    log_->info("upstream addresses changed: a new generation uses them");
  }

  void reload(const config::proxy_config& next) {
    std::lock_guard install_lock(install_mutex_);
    const auto old = shared_.current();
    config::proxy_config cfg = next;
    if (const std::string waiting = keep_restart_only(old->cfg, cfg); !waiting.empty())
      log_->warn("reload: {} change(s) take effect only after a restart", waiting);
    std::shared_ptr<const runtime> fresh;
    try {
      fresh = std::make_shared<const runtime>(cfg, shared_.domains, shared_.metrics, old->generation + 1);
    } catch (const std::exception& e) {
      log_->error("reload rejected: {}", e.what());
      return;
    }
    std::string error;
    if (!shared_.access->configure(next.access_log_path, log_format(next), error)) {
      log_->error("reload rejected: {}", error);
      return;
    }
    control_->set_domains(fresh->routes.domains());
    shared_.install(fresh);
    log_->info("configuration reloaded: {} route(s), {} upstream(s)", fresh->routes.routes().size(),
               next.upstreams.size());
  }

  shared_state shared_;
  std::shared_ptr<spdlog::logger> log_;
  std::vector<std::unique_ptr<worker>> workers_;
  std::uint64_t holder_prefix_ = 0;
  zmq::context_t control_ctx_{1};
  std::unique_ptr<control_subscriber> control_;
  std::unique_ptr<master_discovery> discovery_;  ///< after control_ and workers_: stopped before them
  asio::io_context admin_ioc_{1};
  std::unique_ptr<admin_server> admin_;
  std::uint16_t port_ = 0;
  std::mutex install_mutex_;  // a reload and a new resolution do not install over each other
  steady::time_point last_resolve_ = steady::now();
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
};

server::server(const config::proxy_config& cfg, const clock& clk) : impl_(std::make_unique<impl>(cfg, clk)) {}
server::~server() = default;
void server::run() { impl_->run(); }
void server::stop() { impl_->stop(); }
void server::reload(const config::proxy_config& next) { impl_->reload(next); }
void server::reopen_logs() {
  std::string error;
  if (!impl_->shared_.access->reopen(error)) impl_->log_->error("SIGUSR1: {}", error);
}
std::uint16_t server::port() const { return impl_->port_; }
std::uint16_t server::admin_port() const { return impl_->admin_->port(); }

}  // namespace smockron::proxy
