// The gRPC endpoint of Envoy's rate limit services (master `rls`): RLS v3
// (ShouldRateLimit, unary) and RLQS (StreamRateLimitQuotas, a stream each
// way), served by libgrpc++'s callback API on its own threads. Nothing is
// decided there: each call or usage report is handed to the master's loop
// (an eventfd it watches wakes it), which owns the states and answers it
// with the decider (decider.hpp); the answer leaves from the loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "master/envoy/decider.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/net.hpp"

namespace grpc {
class Server;
}

namespace smockron::master {

class envoy_server {
public:
  /// Work for the loop: runs there with the decider.
  using job = std::function<void(envoy_decider&)>;
  /// Calls and reports waiting for the loop at most (more are answered
  /// UNAVAILABLE at once, counted: Envoy's failure mode decides).
  static constexpr std::size_t k_max_waiting = 100'000;

  /// Listens on `at` (port 0: any); throws std::runtime_error when it cannot.
  /// `allow`: who may call (empty: anyone); others get PERMISSION_DENIED.
  envoy_server(const host_port& at, std::vector<cidr> allow, metrics::registry& reg);
  ~envoy_server();
  envoy_server(const envoy_server&) = delete;
  envoy_server& operator=(const envoy_server&) = delete;

  /// The port bound.
  std::uint16_t port() const { return port_; }
  /// Readable while work waits for the loop (an eventfd).
  int wake_fd() const { return wake_fd_; }
  /// Loop thread: runs the work waiting, oldest first.
  void serve(envoy_decider& d);
  /// Stops: what waits is run with `d` now, calls arriving later are answered
  /// UNAVAILABLE (and stream ends run inline), open streams are ended. The
  /// loop must no longer run. The owner calls it before destroying the server
  /// (a stream's end needs the decider).
  void shutdown(envoy_decider& d);

  /// For the services (grpc_server.cpp): hands `j` to the loop; false when
  /// it cannot (too much waits, unless `always`; or shutting down) and `j` did not run.
  bool post(job j, bool always = false);
  /// Runs `j` inline when the loop no longer runs (shutting down); false otherwise.
  bool run_if_closed(const job& j);
  /// True when `peer` (gRPC's "ipv4:1.2.3.4:5" form) may call.
  bool allowed(const std::string& peer) const;
  metrics::counter& unavailable() { return unavailable_; }
  metrics::counter& denied() { return denied_; }
  std::uint64_t next_stream_id() { return ++stream_ids_; }
  metrics::gauge& streams() { return streams_; }

private:
  std::vector<cidr> allow_;
  metrics::counter& unavailable_;
  metrics::counter& denied_;
  metrics::gauge& streams_;
  int wake_fd_ = -1;
  std::uint16_t port_ = 0;
  std::mutex mutex_;
  std::vector<job> waiting_;
  bool closed_ = false;
  envoy_decider* closed_decider_ = nullptr;  ///< after shutdown: jobs run inline, under mutex_
  std::atomic<std::uint64_t> stream_ids_{0};
  struct services;
  std::unique_ptr<services> services_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace smockron::master
