// smockron-master's loop, on the thread that calls run(): reads accounting
// messages (zmtp_server.hpp, subscribed to the owned domains only), has
// them decided (ingest.hpp), publishes DELAY_UNTIL and POLICY
// (control_publisher.hpp), sweeps expired states, pumps the Redis store
// (redis_store.hpp) and applies reloads between polls.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "master/engine/ingest.hpp"
#include "master/envoy/decider.hpp"
#include "master/envoy/grpc_server.hpp"
#include "master/io/zmtp_server.hpp"
#include "master/server/reservation_writes.hpp"
#include "shared/base/clock.hpp"
#include "shared/base/log.hpp"
#include "shared/base/metrics.hpp"
#include "shared/config/config.hpp"
#include "shared/daemon/tracing.hpp"

namespace smockron::master {

class control_publisher;
class redis_store;
/// redis_store::write (an override's record, queued for the store).
struct redis_store_write {
  std::string key, value;
  bool erase = false;
};
class udp_responder;

class service {
public:
  /// Store write-behind: at most this many states per pipelined batch, a batch
  /// at most every k_flush_interval (a busy identifier is written once per batch).
  static constexpr std::size_t k_flush_batch = 4096;
  static constexpr std::chrono::milliseconds k_flush_interval{5};

  /// Binds both endpoints; throws std::runtime_error if one cannot be bound (start-up only).
  service(const config::master_config& cfg, const clock& clk, metrics::registry& reg);
  ~service();

  /// Runs until `stop` becomes true (checked at least every 50 ms). With a
  /// Redis store, first waits until the store has read its states back or
  /// found Redis unreachable, so a restarted master does not start from
  /// nothing; accounting messages arriving meanwhile are held (at most
  /// startup_backlog) and processed in order afterwards.
  void run(const std::atomic<bool>& stop);
  /// One turn of the loop: waits up to `timeout` for messages, processes
  /// them, then the timers (sweep, store, POLICY) and a pending reload.
  /// Returns the number of messages processed.
  std::size_t poll_once(std::chrono::milliseconds timeout);
  /// Processes one accounting message given as frames, as poll_once() does
  /// for each message received.
  /// `peer`: the accounting connection it came on (0: none; tests);
  /// `gatekeeper`: the gatekeeper it named (0: none, the connection is taken as one).
  void handle(std::span<const std::string_view> frames, bool truncated = false, std::uint64_t peer = 0,
              std::uint64_t gatekeeper = 0);

  /// Hands every unwritten state to the store and stops it, waiting at most `deadline`.
  void finish(std::chrono::milliseconds deadline);

  /// Asks the loop to reload; `loader` runs on the loop thread and returns
  /// the new config, or nothing to keep the current one (thread-safe).
  void request_reload(std::function<std::optional<config::master_config>()> loader);

  /// Body of /readyz (thread-safe). The master is always ready: without Redis it decides from memory.
  std::string readiness() const;
  /// JSON for /status (thread-safe).
  std::string status_json() const;
  /// JSON for /status/<domain>/<identifier> (thread-safe): asked of the loop,
  /// which owns the states, and answered within its next turn (at most 50 ms
  /// away). Empty when the domain is unknown; nothing when the loop did not answer in `timeout`.
  std::optional<std::string> identifier_status(std::string_view domain, std::string_view identifier,
                                               std::chrono::milliseconds timeout);
  /// JSON for /top (thread-safe): the `n` identifiers limited most in the
  /// last minute, per domain (or of `domain` only), asked of the loop as
  /// identifier_status is. Empty when `domain` is unknown; nothing when the
  /// loop did not answer in `timeout`.
  std::optional<std::string> top(std::string_view domain, std::size_t n, std::chrono::milliseconds timeout);
  /// The override API (overrides_api.cpp), thread-safe: done by the loop
  /// within its next turn. Each answers an HTTP status and a JSON body; 503
  /// when the loop did not answer in `timeout`.
  struct api_answer {
    unsigned status = 503;
    std::string body;
  };
  /// Sets (adds or replaces) one identifier's rules of its own, taking effect
  /// at once (the gatekeepers hear it with the next POLICY, published now).
  api_answer put_override(std::string domain, config::override_config o, std::chrono::milliseconds timeout);
  api_answer delete_override(std::string domain, std::string identifier, std::chrono::milliseconds timeout);
  /// The overrides set through the API (of `domain`, or all when empty).
  api_answer api_overrides(std::string domain, std::chrono::milliseconds timeout);
  /// The override API's bearer token now (empty: the API is off; thread-safe).
  std::string admin_token() const;

  /// True while the loop has run recently (for /livez; thread-safe).
  bool alive(std::chrono::steady_clock::duration max_stall) const;
  /// Tracked (domain, identifier) states (loop thread).
  std::size_t tracked() const { return ingest_.states().tracked(); }
  /// The accounting endpoint as bound (the port filled in when it was "*").
  const std::string& accounting_endpoint() const { return accounting_.endpoint(); }
  /// The control endpoint as bound.
  const std::string& control_endpoint() const;
  /// The UDP query endpoint's port as bound (0: no query endpoint).
  std::uint16_t query_port() const;
  /// The port of Envoy's rate limit services as bound (0: off).
  std::uint16_t rls_port() const;

private:
  /// An accounting message (or a BATCH of them) from connection `peer`, named `gatekeeper`.
  void deliver(std::span<const std::string_view> frames, bool truncated, std::uint64_t peer, std::uint64_t gatekeeper);
  void reconfigure(config::master_config next);
  /// The file's configuration with the API's overrides (runtime_overrides_) in.
  config::master_config effective(const config::master_config& file) const;
  /// Applies effective(file_cfg_) to the engine and publishes the rules again.
  void apply_limits();
  /// Starts one identifier's state afresh (its rules changed through the API).
  void forget(std::string_view domain, std::string_view identifier);
  void pump_store(std::chrono::steady_clock::time_point now, bool force);
  void restore_from_store(const std::atomic<bool>& stop);

  config::master_config cfg_;       ///< in force (the API's overrides in); guarded by status_mutex_ for other threads
  config::master_config file_cfg_;  ///< as the file says (loop thread)
  /// The API's overrides by domain + "\0" + identifier (loop thread).
  std::map<std::string, std::pair<std::string, config::override_config>, std::less<>> runtime_overrides_;
  /// With the Redis store: the API's overrides set or deleted and not yet handed to it.
  std::vector<redis_store_write> override_writes_;
  /// Applies the overrides the store read back (before its states).
  void restore_overrides();
  const clock& clock_;
  metrics::registry& metrics_;
  event_loop loop_;  ///< accounting, control and the UDP query endpoint; turned by poll_once()
  zmtp_server accounting_;
  ingest ingest_;
  std::unique_ptr<control_publisher> control_;
  std::unique_ptr<tracing::exporter> tracer_;  ///< trace_endpoint: a span per decision that throttled
  std::unique_ptr<redis_store> store_;
  std::unique_ptr<reservation_writes> reservation_writes_;  ///< with store_: the open reservations' copy
  // The UDP query endpoint (cfg.query), a source of the same loop as accounting.
  void serve_queries();
  /// Publishes a DELAY_UNTIL the rules decided (from `source`: accounting,
  /// query or rls), and records its span when traces are on.
  void throttled(const wire::delay_until& d, std::string_view source);
  struct queries_ready final : event_loop::source {
    service& self;
    explicit queries_ready(service& s) : self(s) {}
    void on_ready(std::uint32_t) override { self.serve_queries(); }
  };
  queries_ready queries_ready_{*this};
  /// The engine's lock: held by the loop for each turn's work (never while it
  /// waits) and by Envoy's calls while they decide (master/envoy/grpc_server.hpp).
  std::mutex engine_mutex_;
  // Envoy's rate limit services (cfg.rls), decided on gRPC's threads under engine_mutex_;
  // a decision that publishes wakes the loop (envoy_ready_), which sends it with its turn.
  std::unique_ptr<envoy_decider> envoy_;
  std::unique_ptr<envoy_server> envoy_server_;
  struct envoy_ready final : event_loop::source {
    service& self;
    explicit envoy_ready(service& s) : self(s) {}
    void on_ready(std::uint32_t) override { self.envoy_server_->woken(); }
  };
  envoy_ready envoy_ready_{*this};
  std::unique_ptr<udp_responder> query_;
  struct query_counters {
    metrics::counter *malformed, *unknown_command, *too_large, *refused, *send_failed;
  };
  std::optional<query_counters> query_ignored_;
  std::uint64_t query_seen_[3] = {};  ///< the responder's counts already added (too_large, refused, send_failed)
  std::chrono::steady_clock::time_point next_sweep_{};
  std::size_t sweep_left_ = 0;  ///< entries the current sweep tick still examines (in slices)
  std::chrono::steady_clock::time_point next_flush_{};
  std::atomic<std::size_t> unwritten_{0};  ///< the limiter's dirty count as last seen by the loop (for other threads)

  metrics::counter& reloads_;
  metrics::counter& reload_failures_;
  metrics::counter& held_dropped_;
  metrics::counter& restore_skipped_;

  std::shared_ptr<spdlog::logger> log_;
  std::atomic<bool> reload_requested_{false};
  std::function<std::optional<config::master_config>()> reload_loader_;
  mutable std::mutex status_mutex_;  // guards cfg_ reads from the admin thread and reload_loader_
  // Identifier status queries from the admin thread, answered by the loop.
  struct status_query {
    std::string domain, identifier;
    bool top = false;  ///< GET /top: `domain` (empty: every domain), `n` identifiers each
    std::size_t n = 0;
    /// Any other work for the loop (the override API): run there, its result the answer.
    std::function<std::optional<std::string>()> job;
    std::promise<std::optional<std::string>> answer;
  };
  std::optional<std::string> ask(std::shared_ptr<status_query> q, std::chrono::milliseconds timeout);
  void answer_queries();
  std::mutex queries_mutex_;
  std::vector<std::shared_ptr<status_query>> queries_;
  std::atomic<bool> queries_pending_{false};
  std::atomic<std::int64_t> heartbeat_ns_{0};
};

}  // namespace smockron::master
