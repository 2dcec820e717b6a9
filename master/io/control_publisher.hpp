// The master's control stream: our ZMTP publisher (zmtp_server, role pub, on
// the master's loop) carrying DELAY_UNTIL to every gatekeeper, and each
// domain's POLICY (its rules, and one per identifier with rules of its own,
// for the gatekeepers' own first-round-trip bound and rate-limit fields)
// every policy interval and to each gatekeeper as soon as it subscribes,
// with QUOTA, CONCURRENCY, EXACT and each tier's TIER beside it; the GRANTs of concurrency
// leases, again every policy interval; and the ANSWERs to ASKs (exact admission). What is published during a turn of
// the loop leaves at its end, together.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "master/engine/ingest.hpp"
#include "master/io/event_loop.hpp"
#include "master/io/zmtp_server.hpp"
#include "shared/base/clock.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/net.hpp"
#include "shared/config/config.hpp"
#include "shared/protocol/wire.hpp"
#include "shared/protocol/wire_lease.hpp"

namespace smockron::master {

class control_publisher {
public:
  /// Subscription-triggered POLICY messages for one domain are at least this far apart.
  static constexpr std::chrono::milliseconds k_policy_gap{100};

  /// Binds `cfg.control` (its connections served by `loop`); throws
  /// std::runtime_error with a clear message when it cannot.
  control_publisher(event_loop& loop, const config::master_config& cfg, const clock& clk, metrics::registry& reg);

  const std::string& endpoint() const { return server_.endpoint(); }

  /// Publishes one DELAY_UNTIL (dropped and counted for a gatekeeper whose queue is full).
  void delay_until(const wire::delay_until& m);

  /// Publishes one GRANT (a concurrency lease; every gatekeeper of the domain
  /// hears it, the one it names applies it).
  void grant(const wire::grant& g);
  /// Publishes one ANSWER (exact admission; the holder it names applies it).
  void answer(const wire::answer& a);

  /// POLICY for new subscriptions (at most one per domain per k_policy_gap:
  /// every publication reaches every subscriber, so G gatekeepers
  /// reconnecting together would otherwise cost G x G messages per domain)
  /// and for every domain once the policy interval has passed.
  void tick(const std::vector<ingest::domain>& domains, const ingest& lookup,
            std::chrono::steady_clock::time_point now);

  /// After each turn of the loop: what was published leaves (see zmtp_server::after_turn).
  void after_turn() { server_.after_turn(); }
  /// New CURVE keys (a reload): see zmtp_server::set_curve.
  void set_curve(std::shared_ptr<const zmtp::curve::server_keys> keys) { server_.set_curve(std::move(keys)); }

  /// The domain list changed: every domain's POLICY goes out at the next tick.
  void domains_changed(std::size_t count);

private:
  struct policy_slot {
    std::chrono::steady_clock::time_point sent{};  ///< last POLICY for this domain
    bool due = false;                              ///< a subscription asked for it within k_policy_gap of the last
  };
  /// The domain's POLICY and one per override of it.
  void publish_policy(const ingest& lookup, std::size_t domain, std::chrono::steady_clock::time_point now);
  void send_policy(std::string_view domain, std::string_view identifier, const rules::limits& l);
  void send_concurrency(std::string_view domain, std::string_view identifier, std::int64_t limit);
  /// TIER: a tier's rules and its concurrency limit (0: none).
  void send_tier(std::string_view domain, std::string_view name, const rules::limits& l, std::int64_t concurrency);

  zmtp_server server_;
  wire::scratch scratch_;
  std::vector<std::string> asked_;  ///< topics subscribed to since the last tick (at most k_max_asked)
  bool ask_all_ = false;            ///< more than that: every domain's POLICY is due
  std::vector<policy_slot> slots_;  ///< per domain index
  std::vector<std::size_t> due_;    ///< domains whose subscription-triggered POLICY waits for k_policy_gap
  std::chrono::steady_clock::time_point next_policy_{};
  metrics::counter& sent_;
  metrics::counter& dropped_;
  metrics::counter& limits_sent_;
  metrics::counter& policy_sent_;
  metrics::counter& grants_sent_;
  metrics::counter& grants_dropped_;
  metrics::counter& answers_sent_;
  metrics::counter& answers_dropped_;
};

}  // namespace smockron::master
