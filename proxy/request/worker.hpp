// What the proxy's workers share and what each owns. Shared (owned by the
// server, thread-safe): the clock, counters, the gate, domain ids, the
// current configuration generation and the draining flag. Per worker (one
// thread, one io_context, nothing locked): its acceptor, sessions, upstream
// pool and accounting sender.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "proxy/cluster/accounting_sender.hpp"
#include "proxy/cluster/domain_registry.hpp"
#include "proxy/gate/asks.hpp"
#include "proxy/gate/gate.hpp"
#include "proxy/gate/slots.hpp"
#include "proxy/io/asio_types.hpp"
#include "proxy/io/conn_io.hpp"
#include "proxy/request/access_log.hpp"
#include "proxy/request/admission.hpp"
#include "proxy/request/proxy_metrics.hpp"
#include "proxy/request/runtime.hpp"
#include "proxy/upstream/h2_upstream.hpp"
#include "proxy/upstream/pool.hpp"
#include "shared/base/clock.hpp"
#include "shared/base/log.hpp"
#include "shared/base/metrics.hpp"
#include "shared/daemon/tracing.hpp"

namespace smockron::proxy {

inline access_log::format log_format(const config::proxy_config& cfg) {
  return cfg.access_log_format == config::proxy_config::access_log_format_kind::json ? access_log::format::json
                                                                                     : access_log::format::text;
}

struct shared_state {
  /// `spread` in [0, 1): this proxy's place in the gate's horizon spread (see gate.hpp).
  shared_state(const config::proxy_config& cfg, const clock& c, double spread)
      : clk(c),
        metrics(registry),
        accounting_counters(registry),
        gate(static_cast<std::size_t>(cfg.max_control_entries), spread),
        access(std::make_unique<access_log>(cfg.access_log_path, log_format(cfg))),
        tracer(tracing::exporter::from_config(cfg.trace, "smockron-proxy", registry, "smockron_proxy")) {}

  /// The configuration generation in force.
  std::shared_ptr<const runtime> current() const {
    std::lock_guard lock(runtime_mutex_);
    return runtime_;
  }
  void install(std::shared_ptr<const runtime> rt) {
    const auto gen = rt->generation;
    {
      std::lock_guard lock(runtime_mutex_);
      runtime_ = std::move(rt);
    }
    generation_.store(gen, std::memory_order_release);
  }
  /// Cheap check before current(): has a newer generation been installed?
  bool newer_than(const runtime& rt) const { return rt.generation != generation_.load(std::memory_order_acquire); }

  const clock& clk;
  smockron::metrics::registry registry;
  proxy_metrics metrics;
  accounting_sender::counters accounting_counters;
  proxy::gate gate;
  concurrency_policies concurrency;  ///< CONCURRENCY from the masters (written by the control thread)
  exact_domains exact;               ///< EXACT from the masters (written by the control thread)
  domain_registry domains;
  std::unique_ptr<access_log> access;  ///< lines are written only while the configuration says access_log
  std::atomic<bool> draining{false};
  std::atomic<bool> resolve_soon{false};  ///< an upstream connect failed: resolve the names again now
  std::atomic<int> connections{0};
  std::unique_ptr<tracing::exporter> tracer;  ///< trace_endpoint: spans of held and refused requests; null: off

private:
  mutable std::mutex runtime_mutex_;
  std::shared_ptr<const runtime> runtime_;
  std::atomic<std::uint64_t> generation_{0};
};

struct worker {
  /// `holder`: this worker's name in its concurrency leases (unique among every gatekeeper's workers).
  worker(shared_state& s, std::shared_ptr<const runtime> first, std::uint64_t holder)
      : slots(
            holder, [this](const wire::lease& m) { accounting.lease(m); }, s.clk),
        asks(
            holder, [this](const wire::ask& m) { accounting.ask(m); },
            [this, &clk = s.clk](std::string_view domain, std::string_view identifier, std::int64_t seq) {
              // A GO for a request that did not go: settled with a use of no units.
              wire::accounting m;
              m.ask = seq;
              m.domain = domain;
              m.state = wire::status::accepted;
              m.identifier = identifier;
              m.received_ms = clk.wall_ms();
              m.cost = 0;
              accounting.account(m, {});
            }),
        accounting(ioc, first->cfg.accounting, static_cast<std::size_t>(first->cfg.accounting_hwm),
                   s.accounting_counters, first->cfg.shards, first->cfg.curve,
                   holder & ~std::uint64_t{0xff}),  // the proxy's part of the holder: every worker's the same
        rt(std::move(first)),
        pool(ioc.get_executor(), s.clk, s.metrics, s.resolve_soon),
        h2_pool(ioc.get_executor(), s.clk, s.metrics) {}
  // Sessions suspended at shutdown give their slots back while the io_context
  // is destroyed, after the accounting sender: nothing is sent by then.
  ~worker() {
    slots.silence();
    asks.silence();
  }
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  // Declared before ioc, so destroyed after it: sessions still suspended at
  // shutdown are destroyed with the io_context and unregister themselves
  // (and give their concurrency slots back).
  std::set<connection*> sessions;
  slot_table slots;
  ask_table asks;  ///< exact admission's questions (proxy/gate/asks.hpp)
  // Sockets are only touched from this worker's thread: the reactor needs no locking.
  asio::io_context ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  std::optional<tcp_acceptor> acceptor;
  accounting_sender accounting;
  std::shared_ptr<const runtime> rt;  ///< the generation this worker's requests use
  upstream_pool pool;
  h2_upstream_pool h2_pool;  ///< HTTP/2 upstreams (h2c, h2)
  std::thread thread;
};

/// What a request's steps use of the proxy's shared state and of its worker.
inline admission_env admission_env_of(shared_state& s, worker& w) {
  return {s.gate, s.metrics, w.accounting, &s.concurrency, s.tracer.get(), &s.exact};
}

}  // namespace smockron::proxy
