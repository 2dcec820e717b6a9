// Write-behind persistence of the limiter state in Redis (store = "redis").
// Redis is one node (redis://), the current primary that Sentinel names
// (redis-sentinel://): asked again at each reconnect, checked with ROLE, and
// left as soon as a write answers READONLY (a failover demoted it), or a
// Redis Cluster (redis-cluster://, redis_cluster.hpp): each key on the
// primary of its slot, the read-back done node by node.
//
// The accounting loop never talks to Redis: it hands batches of serialized
// states to this store, whose own thread pipelines them to Redis, and takes
// back what the thread read at start-up. Redis being down, slow or restarted
// only delays persistence: the thread reconnects with backoff, retries the
// batch it had, and asks the loop to rewrite everything it holds (Redis may
// have come back empty).
//
// Layout (one string key per (domain, identifier), binary-safe):
//   key   = "smockron:" + domain + "\0" + identifier
//           (domain names cannot contain \0, so the first \0 ends the domain)
//   value = "sliding-log:" or "gcra:" + comma-separated times in µs since the epoch
//           (sliding log: the recorded uses, ascending; GCRA: one arrival time per rule),
//           then, when the domain has counted rules or quotas, ";" + rules::state::aux
//           (per counted rule: window start, previous and current units; per quota:
//           window start, units used)
//   TTL   = until the state can no longer affect a decision (SET ... PX)
// and the reservations held open, one key each (reservation_record.hpp).
// In a cluster, the keys of one (domain, identifier) carry the hash tag
// "{domain\0identifier}" (cluster_key()): one slot, one node.
#pragma once

#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "master/core/rules.hpp"
#include "master/store/redis_cluster.hpp"
#include "master/store/reservation_record.hpp"
#include "master/store/state_record.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/net.hpp"

namespace smockron::master {

class redis_store {
public:
  struct write {
    std::string key;
    std::string value;
    std::int64_t ttl_ms = 1;
    bool erase = false;  ///< DEL the key (value and ttl unused)
    bool keep = false;   ///< no expiry (ttl unused): an override set through the API
  };
  /// An override set through the API, as kept in Redis (read back at start-up).
  struct loaded_override {
    std::string domain, identifier, rules;  ///< rules: the TOML the API took
  };
  struct loaded {
    std::string domain;
    std::string identifier;
    rules::algorithm algo = rules::algorithm::sliding_log;
    rules::state st;
    std::string tier;  ///< the tier its uses were judged by (empty: none)
  };
  struct options {
    redis_url url;
    std::chrono::milliseconds timeout{1000};      ///< connect and per-command timeout
    std::size_t load_limit = 1'000'000;           ///< at most this many states read at start-up
    std::chrono::milliseconds max_backoff{2000};  ///< reconnect backoff ceiling (starts at 50 ms)
    std::string reservation_owner;                ///< whose reservation records are read back (reservation_owner())
  };

  redis_store(options o, metrics::registry& reg);
  redis_store(const redis_store&) = delete;
  redis_store& operator=(const redis_store&) = delete;
  /// Writes what was submitted (bounded by the timeout per attempt) and stops the thread.
  ~redis_store();

  /// True when no batch is waiting for the thread: the loop may submit one.
  bool idle() const { return !pending_flag_.load(std::memory_order_acquire); }
  void submit(std::vector<write> batch);
  /// States read from Redis since the last call (at start-up, in chunks).
  std::vector<loaded> take_loaded();
  /// Reservations read from Redis at start-up (all at once, after the states).
  std::vector<reservation_record> take_loaded_reservations();
  /// Overrides set through the API, read from Redis at start-up before any state.
  std::vector<loaded_override> take_loaded_overrides();
  /// True once the start-up read is over: done, or Redis could not be reached in time.
  bool settled() const { return settled_.load(std::memory_order_acquire); }
  /// True once after each connection: the loop must rewrite all it holds.
  bool take_resync() { return resync_.exchange(false, std::memory_order_acq_rel); }
  bool up() const { return up_.load(std::memory_order_acquire); }
  /// States submitted and not yet acknowledged by Redis.
  std::size_t queued() const { return queued_.load(std::memory_order_relaxed); }
  /// One line for /readyz and logs.
  std::string describe() const;
  /// Stops after writing what was submitted, waiting at most `deadline`.
  void stop(std::chrono::milliseconds deadline);

private:
  struct context_deleter {
    void operator()(redisContext* c) const { redisFree(c); }
  };
  using context = std::unique_ptr<redisContext, context_deleter>;

  void run();
  /// The current primary, from the Sentinels (nothing when none answers with one).
  std::optional<host_port> discover();
  bool is_primary();
  bool connect();
  host_port current() const;
  bool load();
  /// SCAN MATCH `prefix`* (`prefix` taken literally) with MGET, each key and value to `f` until it
  /// returns false (a cap); false when Redis failed (disconnected).
  bool scan(std::string_view prefix, const std::function<bool(std::string_view, std::string_view)>& f);
  bool write_batch(const std::vector<write>& batch);
  bool write_cluster(const std::vector<write>& batch);
  bool ping();
  void disconnect(const char* what);
  void wait_stop(std::chrono::milliseconds d);

  options opt_;
  std::vector<host_port> sentinels_;  ///< store thread only: the one that answered last comes first
  host_port current_;                 ///< the node connected or tried last (guarded by mutex_)
  context ctx_;
  std::unique_ptr<redis_cluster> cluster_;  ///< redis-cluster://: used instead of ctx_
  bool cluster_up_ = false;                 ///< the cluster's slot map is known and every primary answered
  bool loaded_ = false;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<write> pending_;
  std::vector<loaded> loaded_chunk_;
  std::vector<reservation_record> loaded_reservations_;
  std::vector<loaded_override> loaded_overrides_;
  bool stop_ = false;
  std::chrono::steady_clock::time_point stop_deadline_{};
  std::atomic<bool> pending_flag_{false};
  std::atomic<bool> loaded_flag_{false};
  std::atomic<bool> settled_{false};
  std::atomic<bool> resync_{false};
  std::atomic<bool> up_{false};
  std::atomic<std::size_t> queued_{0};
  std::atomic<std::int64_t> down_since_ns_{0};
  std::atomic<std::size_t> cluster_primaries_{0};  ///< for describe()
  std::atomic<std::uint64_t> redirects_{0};        ///< the cluster client's, for the metric

  metrics::gauge& up_gauge_;
  metrics::counter& writes_;
  metrics::counter& write_errors_;
  metrics::counter& connection_errors_;
  metrics::counter& connects_;
  metrics::counter& loaded_total_;
  metrics::histogram& flush_seconds_;
  std::thread thread_;
};

}  // namespace smockron::master
