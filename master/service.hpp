// smockron-master's accounting loop: receives accounting messages on the
// accounting endpoint (zmtp_subscriber.hpp; subscribed to the configured domains only), applies the rules via
// the limiter, publishes DELAY_UNTIL on the PUB socket, and keeps metrics.
// All ZeroMQ sockets and the limiter live on the thread that calls run().
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "master/limiter.hpp"
#include "master/redis_store.hpp"
#include "master/zmtp_subscriber.hpp"
#include "smockron/clock.hpp"
#include "smockron/config.hpp"
#include "smockron/log.hpp"
#include "smockron/metrics.hpp"
#include "smockron/string_hash.hpp"
#include "smockron/wire.hpp"
#include "smockron/zmq_util.hpp"

namespace smockron::master {

class service {
public:
  /// Entries examined per sweep tick (see config sweep_interval).
  static constexpr std::size_t k_sweep_batch = 1000;
  /// Store write-behind: at most this many states per pipelined batch, a batch
  /// at most every k_flush_interval (a busy identifier is written once per batch).
  static constexpr std::size_t k_flush_batch = 4096;
  static constexpr std::chrono::milliseconds k_flush_interval{5};

  /// Binds both endpoints; throws (zmq::error_t for control, std::runtime_error
  /// for accounting) if one cannot be bound (start-up only).
  service(const config::master_config& cfg, zmq::context_t& ctx, const clock& clk, metrics::registry& reg);
  ~service();

  /// Runs until `stop` becomes true (checked at least every sweep interval).
  /// With a Redis store, first waits until the store has read its states back
  /// or found Redis unreachable, so a restarted master does not start from
  /// nothing; accounting messages arriving meanwhile are held (at most
  /// accounting_hwm) and processed in order afterwards.
  void run(const std::atomic<bool>& stop);

  /// Hands every unwritten state to the store and stops it, waiting at most `deadline`.
  void finish(std::chrono::milliseconds deadline);

  /// Body of /readyz (thread-safe). The master is always ready: without Redis it decides from memory.
  std::string readiness() const;

  /// Waits up to `timeout` for messages and processes what is ready; returns the count processed.
  std::size_t poll_once(std::chrono::milliseconds timeout);

  /// Processes one accounting message given as frames.
  void handle(std::span<const std::string_view> frames, bool truncated = false);

  /// Asks the loop to reload; `loader` runs on the loop thread and returns
  /// the new config, or nothing to keep the current one.
  void request_reload(std::function<std::optional<config::master_config>()> loader);

  /// Applies a new configuration (domains, rules, limits); endpoints need a restart.
  void reconfigure(const config::master_config& next);

  /// JSON for /status (thread-safe).
  std::string status_json() const;
  /// True while the loop has run recently (for /livez; thread-safe).
  bool alive(std::chrono::steady_clock::duration max_stall) const;

  const limiter& state() const { return limiter_; }
  /// The accounting endpoint as bound (the port filled in when it was "*").
  const std::string& accounting_endpoint() const { return accounting_.endpoint(); }

  /// Subscription-triggered POLICY messages for one domain are at least this far apart.
  static constexpr std::chrono::milliseconds k_policy_gap{100};

private:
  struct domain_slot {
    std::string name;
    rules::limits limits;
    metrics::counter* messages[3] = {};  // by wire::status
    metrics::gauge* tracked = nullptr;
    std::chrono::steady_clock::time_point policy_sent{};  ///< last POLICY for this domain
    bool policy_due = false;  ///< a subscription asked for it within k_policy_gap of the last
  };
  void install_domains(const config::master_config& cfg);
  void publish(const domain_slot& d, std::string_view identifier, const rules::decision& dec);
  /// POLICY for a domain with rules (the gatekeepers' first-round-trip bound).
  void publish_policy(domain_slot& d, std::chrono::steady_clock::time_point now);
  /// Answers new control subscriptions with their domains' policies: at once,
  /// but at most one POLICY per domain per k_policy_gap (every publication
  /// reaches every subscriber, so G gatekeepers reconnecting together would
  /// otherwise cost G x G messages per domain).
  void serve_subscriptions(std::chrono::steady_clock::time_point now);
  void sweep(std::int64_t now_us);
  void log_bad(std::string_view what, std::string_view detail);
  void pump_store(std::chrono::steady_clock::time_point now, bool force);

  config::master_config cfg_;
  const clock& clock_;
  metrics::registry& metrics_;
  zmtp_subscriber accounting_;
  zmq::socket_t control_;
  limiter limiter_;
  std::vector<domain_slot> domains_;
  string_map<std::size_t> domain_index_;
  wire::scratch scratch_;
  std::chrono::steady_clock::time_point next_sweep_{};
  std::chrono::steady_clock::time_point next_policy_{};
  std::vector<std::size_t> policy_due_;  ///< domains whose subscription-triggered POLICY waits for k_policy_gap
  std::unique_ptr<redis_store> store_;
  std::chrono::steady_clock::time_point next_flush_{};
  std::atomic<std::size_t> unwritten_{0};  ///< limiter_.dirty() as last seen by the loop (for other threads)

  metrics::counter* decode_errors_[wire::decode_error_count] = {};
  metrics::counter& unknown_domain_;
  metrics::counter& control_sent_;
  metrics::counter& control_dropped_;
  metrics::counter& policy_sent_;
  metrics::counter& evictions_;
  metrics::counter& expirations_;
  metrics::counter& reloads_;
  metrics::counter& reload_failures_;
  metrics::counter& held_dropped_;
  metrics::counter& restore_skipped_;
  metrics::histogram& latency_;
  std::uint64_t reported_evictions_ = 0;
  std::uint64_t handled_ = 0;

  std::shared_ptr<spdlog::logger> log_;
  log::rate_limiter bad_input_log_;

  std::atomic<bool> reload_requested_{false};
  std::function<std::optional<config::master_config>()> reload_loader_;
  mutable std::mutex status_mutex_;  // guards cfg_ reads from the admin thread and reload_loader_
  std::atomic<std::int64_t> heartbeat_ns_{0};
};

}  // namespace smockron::master
