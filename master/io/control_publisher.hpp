// The master's control stream: a libzmq XPUB socket carrying DELAY_UNTIL to
// every gatekeeper, and each domain's POLICY (its rules, and one per
// identifier with rules of its own, for the gatekeepers' own
// first-round-trip bound and rate-limit fields) every policy interval and to
// each gatekeeper as soon as it subscribes.
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "master/engine/ingest.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/net.hpp"
#include "shared/config/config.hpp"
#include "shared/protocol/wire.hpp"

namespace smockron::master {

class control_publisher {
public:
  /// Subscription-triggered POLICY messages for one domain are at least this far apart.
  static constexpr std::chrono::milliseconds k_policy_gap{100};

  /// Binds `cfg.control`; throws zmq::error_t when it cannot.
  control_publisher(zmq::context_t& ctx, const config::master_config& cfg, metrics::registry& reg);

  /// Publishes one DELAY_UNTIL (dropped and counted when the queue is full).
  void delay_until(const wire::delay_until& m);

  /// POLICY for new subscriptions (at most one per domain per k_policy_gap:
  /// every publication reaches every subscriber, so G gatekeepers
  /// reconnecting together would otherwise cost G x G messages per domain)
  /// and for every domain once the policy interval has passed.
  void tick(const std::vector<ingest::domain>& domains, const ingest& lookup,
            std::chrono::steady_clock::time_point now);

  /// Answers the ZAP requests of control connections (when control_allow is
  /// set): libzmq asks before it completes each handshake.
  void serve_zap();

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

  std::optional<zmq::socket_t> zap_;  ///< ZAP handler (RFC 27), bound before socket_ when control_allow is set
  std::vector<cidr> allow_;
  zmq::socket_t socket_;
  wire::scratch scratch_;
  std::vector<policy_slot> slots_;  ///< per domain index
  std::vector<std::size_t> due_;    ///< domains whose subscription-triggered POLICY waits for k_policy_gap
  std::chrono::steady_clock::time_point next_policy_{};
  metrics::counter& sent_;
  metrics::counter& dropped_;
  metrics::counter& policy_sent_;
  metrics::counter& refused_;
};

}  // namespace smockron::master
