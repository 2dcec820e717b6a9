// The proxy's control side: one thread owning the libzmq SUB socket,
// connected to every master and subscribed to the routes' domains, feeding
// DELAY_UNTIL, POLICY and QUOTA into the gate, CONCURRENCY into the
// concurrency policies and each GRANT to the worker it names.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "proxy/cluster/domain_registry.hpp"
#include "proxy/gate/asks.hpp"
#include "proxy/gate/gate.hpp"
#include "proxy/gate/slots.hpp"
#include "shared/base/clock.hpp"
#include "shared/base/log.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/string_hash.hpp"
#include "shared/daemon/zmq_util.hpp"
#include "shared/protocol/wire.hpp"
#include "shared/protocol/wire_lease.hpp"
#include "shared/protocol/zmtp_curve.hpp"

namespace smockron::proxy {

class control_subscriber {
public:
  /// Where the concurrency messages go: CONCURRENCY into `policies`, each
  /// GRANT to `grant` (on this thread: it hands it to the worker it names,
  /// and says whether it named one of this proxy's).
  /// Where the additions addressed to workers go: CONCURRENCY and EXACT
  /// (kept for every worker), GRANT and ANSWER (handed to the worker they
  /// name; false: none of this proxy's).
  struct concurrency_sinks {
    concurrency_policies* policies = nullptr;
    std::function<bool(const wire::grant&)> grant;
    exact_domains* exact = nullptr;
    std::function<bool(const wire::answer&)> answer;
  };
  /// `curve`: the keys of each endpoint that speaks CURVE (the others are plaintext).
  using curve_keys = std::map<std::string, std::shared_ptr<const zmtp::curve::client_keys>, std::less<>>;
  control_subscriber(zmq::context_t& ctx, const std::vector<std::string>& endpoints, gate& g, domain_registry& domains,
                     const clock& clk, metrics::registry& reg, concurrency_sinks concurrency, curve_keys curve = {});
  ~control_subscriber();

  /// Subscribes to exactly these domains (called at start and on reload; thread-safe).
  void set_domains(const std::vector<std::string>& domains);
  /// The masters a DNS endpoint (one of `endpoints`) stands for now: the
  /// socket connects to the new ones and disconnects the gone ones (thread-safe).
  void set_masters(const std::string& configured, const std::vector<std::string>& masters);
  /// Number of masters currently connected.
  int connected() const { return connected_.load(); }
  /// Masters the socket is to be connected to (a DNS name's: those of its last good answer).
  int endpoints() const { return endpoints_now_.load(); }
  /// The masters each configured endpoint stands for now (a static one: itself), for /status.
  std::map<std::string, std::vector<std::string>> masters() const;

private:
  void run();
  /// Applies the domains set_domains() asked for, if it did.
  void sync_subscriptions(zmq::socket_t& sub, std::set<std::string>& subscribed);
  /// Connects `endpoint` (with the CURVE keys of `configured`, if it has some).
  void connect(zmq::socket_t& sub, const std::string& configured, const std::string& endpoint);
  /// Applies the masters set_masters() gave, if it did; `handshaken` loses the gone ones.
  void sync_masters(zmq::socket_t& sub, std::set<std::string, std::less<>>& handshaken);
  /// Applies one control message (DELAY_UNTIL or POLICY) to the gate, or counts why not.
  void apply(const zmq_util::multipart& in);
  /// CONCURRENCY and GRANT (true: it was one of them, applied or counted).
  bool apply_concurrency(const zmq_util::multipart& in);

  zmq::context_t& ctx_;
  std::vector<std::string> endpoints_;
  gate& gate_;
  domain_registry& domains_;
  const clock& clock_;
  metrics::counter& received_;
  metrics::counter* errors_[wire::decode_error_count] = {};
  metrics::counter& unknown_domain_;
  metrics::counter& policies_;
  metrics::counter& policies_ignored_;
  concurrency_sinks concurrency_;
  metrics::counter& grants_;
  metrics::counter& answers_;
  metrics::counter& exact_;
  metrics::counter& handshake_failures_;
  curve_keys curve_;
  std::shared_ptr<spdlog::logger> log_;
  log::rate_limiter bad_log_;
  std::atomic<int> connected_{0};
  std::atomic<bool> stop_{false};
  std::mutex pending_mutex_;
  std::optional<std::vector<std::string>> pending_domains_;
  std::map<std::string, std::vector<std::string>> pending_masters_;  ///< configured -> masters, not yet applied
  /// On the thread: the masters each configured endpoint stands for now (a static one: itself).
  std::map<std::string, std::vector<std::string>> masters_;
  std::atomic<int> endpoints_now_{0};
  mutable std::mutex view_mutex_;
  std::map<std::string, std::vector<std::string>> masters_view_;  ///< masters_, copied for other threads
  std::thread thread_;
};

}  // namespace smockron::proxy
