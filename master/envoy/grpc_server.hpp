// The gRPC endpoint of Envoy's rate limit services (master `rls`): RLS v3
// (ShouldRateLimit, unary) and RLQS (StreamRateLimitQuotas, a stream each
// way), served by libgrpc++'s callback API on its own threads. Each call is
// decided on the gRPC thread that received it, under the engine's lock (the
// one the master's loop holds for each turn's work, never while it waits):
// no hand-over to another thread, whose two context switches per batch cost
// a third of the throughput (docs/benchmarks.md). A DELAY_UNTIL a decision
// publishes is buffered by the control publisher; the loop is woken (an
// eventfd it watches) to send it with its turn.
#pragma once

#include <cstdint>
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
  /// Listens on `at` (port 0: any); throws std::runtime_error when it cannot.
  /// `allow`: who may call (empty: anyone); others get PERMISSION_DENIED.
  /// `engine`: held while `decider` decides (the loop holds it for its turns).
  envoy_server(const host_port& at, std::vector<cidr> allow, metrics::registry& reg, envoy_decider& decider,
               std::mutex& engine);
  ~envoy_server();
  envoy_server(const envoy_server&) = delete;
  envoy_server& operator=(const envoy_server&) = delete;

  /// The port bound.
  std::uint16_t port() const { return port_; }
  /// Readable when a decision published something the loop should send now (an eventfd).
  int wake_fd() const { return wake_fd_; }
  /// Loop thread: the wake is taken (what was published leaves with the turn).
  void woken();
  /// Stops: calls under way finish, open streams are ended. Not under the engine's lock.
  void shutdown();

  /// For the services (grpc_server.cpp): runs `f(decider)` under the engine's
  /// lock and wakes the loop if it published a DELAY_UNTIL.
  template <class F>
  auto decide(F&& f) {
    std::lock_guard lock(engine_);
    const std::uint64_t before = decider_.published();
    auto r = f(decider_);
    if (decider_.published() != before) wake();
    return r;
  }
  /// True when `peer` (gRPC's "ipv4:1.2.3.4:5" form) may call.
  bool allowed(const std::string& peer) const;
  metrics::counter& denied() { return denied_; }
  metrics::gauge& streams() { return streams_; }
  std::uint64_t next_stream_id() {
    std::lock_guard lock(engine_);
    return ++stream_ids_;
  }

private:
  void wake();

  envoy_decider& decider_;
  std::mutex& engine_;
  std::vector<cidr> allow_;
  metrics::counter& denied_;
  metrics::gauge& streams_;
  int wake_fd_ = -1;
  std::uint16_t port_ = 0;
  std::uint64_t stream_ids_ = 0;  ///< under engine_
  struct services;
  std::unique_ptr<services> services_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace smockron::master
