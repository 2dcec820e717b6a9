// Masters found by DNS. An accounting or control endpoint may be a name
// that stands for several masters: "dns+tcp://name:port" (every IPv4 address,
// or every IPv6 one when the name has no IPv4 address: one family, so that a
// dual-stack master is one master; a Kubernetes headless Service) or
// "srv+tcp://name" (every SRV target, at its port). One thread asks c-ares,
// again when the answer's TTL
// has run out (bounded by dns_min_ttl and dns_max_ttl), and hands each new
// list of masters to the accounting senders and the control subscriber,
// which connect to the new masters and drop the gone ones. A lookup that
// fails or comes back empty keeps the last good list (a DNS outage or a
// rolling restart of every master does not cut the gatekeepers off); it is
// asked again after dns_min_ttl.
//
// Sharding keeps working when a master restarts at a new address: a share
// is keyed by its configured endpoint (e.g. a StatefulSet's ordinal name
// "dns+tcp://master-0.masters:10004"), not by the address it resolves to.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shared/base/log.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/net.hpp"

namespace smockron::proxy {

/// What one lookup of a name found.
struct lookup_result {
  bool ok = false;                     ///< false: the lookup failed (`error` says why)
  std::vector<std::string> endpoints;  ///< "tcp://address:port" of each master
  std::chrono::seconds ttl{0};         ///< the smallest TTL of the records used
  std::string error;
};

/// One configured name: the masters it stands for now and when to ask
/// again. Pure (time is passed in), so the rules are tested without DNS.
class discovered_name {
public:
  using time_point = std::chrono::steady_clock::time_point;
  struct bounds {
    std::chrono::microseconds min_ttl{std::chrono::seconds(1)}, max_ttl{std::chrono::seconds(60)};
    std::size_t max_masters = 64;
  };
  discovered_name(std::string configured, dns_endpoint where, bounds b)
      : configured_(std::move(configured)), where_(std::move(where)), bounds_(b) {}

  /// Takes a lookup's outcome at `now`: true when the masters changed. A
  /// good answer replaces the list (sorted, at most max_masters) and is used
  /// for its TTL within the bounds; a failed or empty one keeps the list and
  /// is retried after min_ttl.
  bool answered(const lookup_result& r, time_point now);
  /// When the name is to be asked again.
  time_point due() const { return due_; }
  const std::vector<std::string>& masters() const { return masters_; }
  const std::string& configured() const { return configured_; }
  const dns_endpoint& where() const { return where_; }
  /// Addresses an answer named beyond max_masters (not used), in the last answer.
  std::size_t truncated() const { return truncated_; }

private:
  std::string configured_;
  dns_endpoint where_;
  bounds bounds_;
  std::vector<std::string> masters_;
  time_point due_{};
  std::size_t truncated_ = 0;
};

class master_discovery {
public:
  struct options {
    std::vector<std::string> servers;  ///< "ip" or "ip:port"; empty: the system's
    discovered_name::bounds bounds;
  };
  /// Called on the discovery thread with a name's new list of masters.
  using on_change = std::function<void(const std::string& configured, const std::vector<std::string>& masters)>;

  /// `configured`: the dns+tcp:// and srv+tcp:// endpoints (others are ignored).
  /// Starts the thread, which looks every name up at once.
  master_discovery(const std::vector<std::string>& configured, options o, on_change f, metrics::registry& reg);
  ~master_discovery();
  master_discovery(const master_discovery&) = delete;
  master_discovery& operator=(const master_discovery&) = delete;

  struct state;  ///< the thread's: the names, the c-ares channel (master_discovery.cpp)

private:
  void run();

  /// Shared with the metrics callback, which may run (a scrape) after this object is gone.
  std::shared_ptr<state> state_;
  std::thread thread_;
};

}  // namespace smockron::proxy
