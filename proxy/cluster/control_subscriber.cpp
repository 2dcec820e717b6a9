// The proxy's control subscriber (see control_subscriber.hpp).
#include "proxy/cluster/control_subscriber.hpp"

#include <array>
#include <cstring>
#include <set>

#include "shared/base/log.hpp"
#include "shared/base/net.hpp"
#include "shared/daemon/zmq_util.hpp"
#include "shared/protocol/wire_limit.hpp"
#include "shared/protocol/wire_tier.hpp"

namespace smockron::proxy {

control_subscriber::control_subscriber(zmq::context_t& ctx, const std::vector<std::string>& endpoints, gate& g,
                                       domain_registry& domains, const clock& clk, metrics::registry& reg,
                                       concurrency_sinks concurrency, curve_keys curve)
    : ctx_(ctx),
      endpoints_(endpoints),
      gate_(g),
      domains_(domains),
      clock_(clk),
      received_(reg.add_counter("smockron_proxy_control_messages_total", "DELAY_UNTIL messages applied")),
      unknown_domain_(reg.add_counter("smockron_proxy_control_unknown_domain_total",
                                      "Control messages for a domain no route uses")),
      policies_(
          reg.add_counter("smockron_proxy_control_policies_total",
                          "POLICY messages applied (a domain's rules, or one identifier's own, for the gate's own "
                          "first-round-trip bound)")),
      policies_ignored_(reg.add_counter("smockron_proxy_control_policies_ignored_total",
                                        "POLICY messages not kept: more domains, or identifiers with rules of their "
                                        "own, than the gate keeps policies for (those are not bounded before the "
                                        "master's first DELAY_UNTIL, and the identifiers get the domain's fields)")),
      concurrency_(std::move(concurrency)),
      grants_(reg.add_counter("smockron_proxy_control_grants_total",
                              "GRANT messages for this proxy's workers (concurrency slots leased)")),
      answers_(reg.add_counter("smockron_proxy_control_answers_total",
                               "ANSWER messages for this proxy's workers (exact admission)")),
      exact_(reg.add_counter("smockron_proxy_control_exact_total",
                             "EXACT messages applied (a domain whose master answers ASK)")),
      handshake_failures_(reg.add_counter("smockron_proxy_control_handshake_failures_total",
                                          "Control connections to a master whose handshake failed (under CURVE: "
                                          "the master's key is not curve_master_key, or ours is not listed)")),
      curve_(std::move(curve)),
      log_(log::get("proxy.control")) {
  for (std::size_t i = 0; i < wire::decode_error_count; ++i) {
    errors_[i] = &reg.add_counter("smockron_proxy_control_decode_errors_total", "Malformed control messages by reason",
                                  metrics::labels({{"reason", wire::to_string(static_cast<wire::decode_error>(i))}}));
  }
  reg.add_counter_callback(
      "smockron_proxy_gate_unguarded_total",
      "Requests the gate could not bound on its own (its guard state would pass half the control memory)",
      [&g] { return static_cast<double>(g.unguarded()); });
  reg.add_callback("smockron_proxy_gate_overrides",
                   "Identifiers with rules of their own (a master's overrides) the gate keeps", "",
                   [&g] { return static_cast<double>(g.overrides()); });
  reg.add_callback("smockron_proxy_gate_tiers", "Tiers (rules a request selects by name) the gate keeps", "",
                   [&g] { return static_cast<double>(g.tiers()); });
  reg.add_callback("smockron_proxy_masters_connected", "Masters the control socket is connected to", "",
                   [this] { return static_cast<double>(connected_.load()); });
  thread_ = std::thread([this] { run(); });
}

control_subscriber::~control_subscriber() {
  stop_ = true;
  thread_.join();
}

void control_subscriber::set_domains(const std::vector<std::string>& domains) {
  std::lock_guard lock(pending_mutex_);
  pending_domains_ = domains;
}

void control_subscriber::run() {
  zmq::socket_t sub(ctx_, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::rcvhwm, 1'000'000);
  sub.set(zmq::sockopt::reconnect_ivl, 100);
  // A restarted master is found again within half a second however long it was gone.
  sub.set(zmq::sockopt::reconnect_ivl_max, 500);
  // A monitor tells whether masters are connected (for /readyz and metrics).
  const std::string monitor_endpoint =
      "inproc://smockron-control-monitor-" + std::to_string(reinterpret_cast<std::uintptr_t>(this));
  // A master counts once its handshake succeeded (under CURVE a connection
  // with the wrong master key is connected and useless).
  zmq_socket_monitor(sub.handle(), monitor_endpoint.c_str(),
                     ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
  zmq::socket_t monitor(ctx_, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect(monitor_endpoint);
  // A DNS name's masters come with set_masters(); the rest are connected now.
  for (const auto& e : endpoints_) {
    if (parse_dns_endpoint(e)) continue;
    masters_[e] = {e};
    connect(sub, e, e);
  }
  endpoints_now_ = static_cast<int>(masters_.size());
  {
    std::lock_guard lock(view_mutex_);
    masters_view_ = masters_;
  }
  std::set<std::string, std::less<>> handshaken;  // endpoints whose connection finished its handshake

  std::set<std::string> subscribed;
  zmq_util::multipart in;
  auto last_sweep = clock_.steady_now();
  while (!stop_.load()) {
    sync_subscriptions(sub, subscribed);
    sync_masters(sub, handshaken);
    zmq::pollitem_t items[] = {{sub.handle(), 0, ZMQ_POLLIN, 0}, {monitor.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      // Short: new subscriptions (start-up, reload) are applied at the next wake-up.
      zmq::poll(items, 2, std::chrono::milliseconds(10));
      while (zmq_util::recv(monitor, in)) {
        if (in.count >= 1 && in.views[0].size() >= 2) {
          std::uint16_t event = 0;
          std::memcpy(&event, in.views[0].data(), 2);
          const std::string endpoint(in.count >= 2 ? in.views[1] : std::string_view());
          if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED && handshaken.insert(endpoint).second) ++connected_;
          if (event == ZMQ_EVENT_DISCONNECTED && handshaken.erase(endpoint) > 0) --connected_;
          if (event != ZMQ_EVENT_HANDSHAKE_SUCCEEDED && event != ZMQ_EVENT_DISCONNECTED) {
            handshake_failures_.inc();
            std::uint64_t suppressed = 0;
            if (bad_log_.allow(clock_.steady_now(), suppressed)) {
              log_->warn("control handshake with {} failed ({}): check curve_master_key ({} similar suppressed)",
                         endpoint, event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "refused" : "protocol", suppressed);
            }
          }
        }
      }
      // ZMQ_FD is edge-triggered: always drain everything that is ready.
      while (zmq_util::recv(sub, in)) apply(in);
      if (clock_.steady_now() - last_sweep > std::chrono::milliseconds(50)) {
        last_sweep = clock_.steady_now();
        gate_.sweep(clock_.wall_us());
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      log_->error("control loop: {}", e.what());
    }
  }
}

void control_subscriber::connect(zmq::socket_t& sub, const std::string& configured, const std::string& endpoint) {
  // libzmq takes the mechanism's options at connect: each endpoint its master's key.
  if (const auto it = curve_.find(configured); it != curve_.end()) {
    const auto& k = *it->second;
    const auto bytes = [](const zmtp::curve::key& key) {
      return std::string_view(reinterpret_cast<const char*>(key.data()), key.size());
    };
    sub.set(zmq::sockopt::curve_secretkey, bytes(k.own.secret_key));
    sub.set(zmq::sockopt::curve_publickey, bytes(k.own.public_key));
    sub.set(zmq::sockopt::curve_serverkey, bytes(k.server));
  }
  // libzmq resolves a name as IPv6 (v4-mapped) when this is on: only an IPv6 literal gets it.
  sub.set(zmq::sockopt::ipv6, endpoint.starts_with("tcp://[") ? 1 : 0);
  sub.connect(endpoint);
}

void control_subscriber::set_masters(const std::string& configured, const std::vector<std::string>& masters) {
  std::lock_guard lock(pending_mutex_);
  pending_masters_[configured] = masters;
}

void control_subscriber::sync_masters(zmq::socket_t& sub, std::set<std::string, std::less<>>& handshaken) {
  std::map<std::string, std::vector<std::string>> pending;
  {
    std::lock_guard lock(pending_mutex_);
    pending.swap(pending_masters_);
  }
  for (auto& [configured, next] : pending) {
    auto& now = masters_[configured];
    for (const auto& m : now) {
      if (std::find(next.begin(), next.end(), m) != next.end()) continue;
      log_->info("control: {} is gone from {}", m, configured);
      try {
        sub.disconnect(m);
      } catch (const zmq::error_t& e) {
        log_->warn("control: disconnecting {}: {}", m, e.what());
      }
      // libzmq may not report the end of a connection it was told to end.
      if (handshaken.erase(m) > 0) --connected_;
    }
    for (const auto& m : next) {
      if (std::find(now.begin(), now.end(), m) != now.end()) continue;
      log_->info("control: connecting to {} (of {})", m, configured);
      try {
        connect(sub, configured, m);
      } catch (const zmq::error_t& e) {
        log_->warn("control: connecting to {}: {}", m, e.what());
      }
    }
    now = std::move(next);
  }
  if (pending.empty()) return;
  int n = 0;
  for (const auto& [configured, list] : masters_) n += static_cast<int>(list.size());
  endpoints_now_ = n;
  std::lock_guard lock(view_mutex_);
  masters_view_ = masters_;
}

std::map<std::string, std::vector<std::string>> control_subscriber::masters() const {
  std::lock_guard lock(view_mutex_);
  return masters_view_;
}

void control_subscriber::sync_subscriptions(zmq::socket_t& sub, std::set<std::string>& subscribed) {
  std::lock_guard lock(pending_mutex_);
  if (!pending_domains_) return;
  const std::set<std::string> wanted(pending_domains_->begin(), pending_domains_->end());
  for (const auto& d : subscribed) {
    if (!wanted.contains(d)) sub.set(zmq::sockopt::unsubscribe, d + std::string(1, '\0'));
  }
  for (const auto& d : wanted) {
    if (!subscribed.contains(d)) sub.set(zmq::sockopt::subscribe, d + std::string(1, '\0'));
  }
  subscribed = wanted;
  pending_domains_.reset();
}

void control_subscriber::apply(const zmq_util::multipart& in) {
  const auto bad = [&](wire::decode_error e) {
    errors_[static_cast<int>(e)]->inc();
    std::uint64_t suppressed = 0;
    if (bad_log_.allow(clock_.steady_now(), suppressed)) {
      log_->warn("malformed control message: {} ({} similar suppressed)", wire::to_string(e), suppressed);
    }
  };
  if (in.truncated) return bad(wire::decode_error::frame_count);
  if (apply_concurrency(in)) return;
  if (wire::control_command(in.frames()) == wire::policy_command) {
    const auto p = wire::decode_policy(in.frames());
    if (!p) return bad(p.error());
    if (const auto domain = domains_.find(p->domain)) {
      const std::span<const guard_rule> rules{p->rules.data(), p->count};
      const bool kept = p->identifier.empty() ? gate_.set_policy(*domain, rules, clock_.wall_us())
                                              : gate_.set_override(*domain, p->identifier, rules, clock_.wall_us());
      if (kept) policies_.inc();
      else policies_ignored_.inc();
    }
    return;
  }
  if (wire::control_command(in.frames()) == wire::tier_command) {
    const auto t = wire::decode_tier(in.frames());
    if (!t) return bad(t.error());
    if (const auto domain = domains_.find(t->domain)) {
      const bool kept = gate_.set_tier(*domain, t->name, {t->rules.data(), t->count}, clock_.wall_us());
      if (concurrency_.policies) concurrency_.policies->set_tier(t->domain, t->name, t->concurrency, clock_.wall_us());
      if (kept) policies_.inc();
      else policies_ignored_.inc();
    }
    return;
  }
  if (wire::control_command(in.frames()) == wire::quota_command) {
    const auto q = wire::decode_quota(in.frames());
    if (!q) return bad(q.error());
    if (const auto domain = domains_.find(q->domain); domain && q->identifier.empty()) {
      if (gate_.set_quotas(*domain, {q->items.data(), q->count}, clock_.wall_us())) policies_.inc();
      else policies_ignored_.inc();
    }
    return;
  }
  if (wire::control_command(in.frames()) == wire::limit_command) {
    const auto l = wire::decode_limit(in.frames());
    if (!l) return bad(l.error());
    if (const auto domain = domains_.find(l->domain))
      gate_.name_limit(*domain, l->identifier, l->next_ms * 1000, l->limit);
    return;
  }
  const auto m = wire::decode_delay_until(in.frames());
  if (!m) return bad(m.error());
  const auto domain = domains_.find(m->domain);
  if (!domain) return unknown_domain_.inc();
  gate_.update(*domain, m->identifier, m->next_ms * 1000, m->interval_ms * 1000, clock_.wall_us());
  received_.inc();
}

bool control_subscriber::apply_concurrency(const zmq_util::multipart& in) {
  const std::string_view command = wire::control_command(in.frames());
  const auto bad = [&](wire::decode_error e) {
    errors_[static_cast<int>(e)]->inc();
    std::uint64_t suppressed = 0;
    if (bad_log_.allow(clock_.steady_now(), suppressed)) {
      log_->warn("malformed control message: {} ({} similar suppressed)", wire::to_string(e), suppressed);
    }
  };
  if (command == wire::grant_command) {
    const auto g = wire::decode_grant(in.frames());
    if (!g) bad(g.error());
    else if (concurrency_.grant && concurrency_.grant(g.value())) grants_.inc();
    return true;
  }
  if (command == wire::answer_command) {
    const auto a = wire::decode_answer(in.frames());
    if (!a) bad(a.error());
    else if (concurrency_.answer && concurrency_.answer(a.value())) answers_.inc();
    return true;
  }
  if (command == wire::exact_command) {
    const auto x = wire::decode_exact(in.frames());
    if (!x) bad(x.error());
    else if (domains_.find(x->domain) && concurrency_.exact) {
      concurrency_.exact->set(x->domain, clock_.wall_us());
      exact_.inc();
    }
    return true;
  }
  if (command != wire::concurrency_command) return false;
  const auto c = wire::decode_concurrency(in.frames());
  if (!c) {
    bad(c.error());
  } else if (domains_.find(c->domain) && concurrency_.policies) {
    concurrency_.policies->set(c->domain, c->identifier, c->limit, clock_.wall_us());
    policies_.inc();
  }
  return true;
}

}  // namespace smockron::proxy
