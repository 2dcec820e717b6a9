// The master's control stream (see control_publisher.hpp).
#include "master/io/control_publisher.hpp"

#include <array>
#include <utility>

#include "shared/daemon/zmq_util.hpp"

namespace smockron::master {

namespace {

// libzmq's ZAP endpoint: one handler per context (the master's context carries only control).
constexpr const char* k_zap_endpoint = "inproc://zeromq.zap.01";

zmq::socket_t bind_zap(zmq::context_t& ctx) {
  zmq::socket_t s(ctx, zmq::socket_type::rep);
  s.set(zmq::sockopt::linger, 0);
  s.bind(k_zap_endpoint);
  return s;
}

}  // namespace

control_publisher::control_publisher(zmq::context_t& ctx, const config::master_config& cfg, metrics::registry& reg)
    : zap_(cfg.control_allow.empty() ? std::nullopt : std::optional<zmq::socket_t>(bind_zap(ctx))),
      allow_(cfg.control_allow),
      socket_(ctx, zmq::socket_type::xpub),
      sent_(reg.add_counter("smockron_master_control_messages_total", "DELAY_UNTIL messages published")),
      dropped_(reg.add_counter("smockron_master_control_dropped_total",
                               "DELAY_UNTIL messages dropped because the send queue was full")),
      policy_sent_(reg.add_counter("smockron_master_policy_messages_total",
                                   "POLICY messages published (each domain's rules, every second)")),
      refused_(reg.add_counter("smockron_master_refused_connections_total",
                               "Connections refused by an endpoint's allow list",
                               metrics::labels({{"endpoint", "control"}}))) {
  // With a ZAP domain set, libzmq asks the ZAP handler about every connection
  // (NULL mechanism included) before the handshake completes.
  if (zap_) socket_.set(zmq::sockopt::zap_domain, "smockron-control");
  socket_.set(zmq::sockopt::sndhwm, static_cast<int>(cfg.control_hwm));
  socket_.set(zmq::sockopt::linger, 0);
  // Every subscription is passed up (not only a topic's first), so that each
  // gatekeeper gets a domain's policy as soon as it subscribes.
  socket_.set(zmq::sockopt::xpub_verbose, 1);
  socket_.bind(cfg.control);
  slots_.resize(cfg.domains.size());
}

void control_publisher::serve_zap() {
  if (!zap_) return;
  zmq_util::multipart req;
  // Request (RFC 27): version, request id, domain, address, identity, mechanism, credentials...
  while (zmq_util::recv(*zap_, req, zmq::recv_flags::dontwait)) {
    const bool well_formed = req.count >= 6 && req.views[0] == "1.0";
    const auto peer = well_formed ? parse_ip(req.views[3]) : std::nullopt;
    // ipc and inproc peers have no address: local, allowed. An address that
    // does not parse is refused (the list cannot vouch for it).
    const bool ok = well_formed && (req.views[3].empty() || (peer && allowed(allow_, *peer)));
    if (!ok) refused_.inc();
    const std::string_view id = req.count >= 2 ? req.views[1] : std::string_view();
    const std::array<std::string_view, 6> reply = {"1.0", id, ok ? "200" : "400", ok ? "OK" : "not in control_allow",
                                                   "",    ""};
    zmq_util::send(*zap_, reply);
  }
}

void control_publisher::delay_until(const wire::delay_until& m) {
  auto enc = wire::encode(m, scratch_);
  if (enc && zmq_util::send(socket_, enc->view())) sent_.inc();
  else dropped_.inc();
}

void control_publisher::domains_changed(std::size_t count) {
  slots_.assign(count, {});
  due_.clear();
  next_policy_ = {};
}

void control_publisher::publish_policy(const ingest& lookup, std::size_t i, std::chrono::steady_clock::time_point now) {
  policy_slot& slot = slots_[i];
  slot.sent = now;
  slot.due = false;
  const std::string_view domain = lookup.domains()[i].name;
  const domain_limits& limits = lookup.states().limits(i);
  send_policy(domain, {}, limits.base);
  // Each override goes with its domain, so a gatekeeper that hears the
  // domain's rules hears its exceptions within the same burst of messages.
  for (const auto& [identifier, l] : limits.overrides) send_policy(domain, identifier, l);
}

void control_publisher::send_policy(std::string_view domain, std::string_view identifier, const rules::limits& l) {
  wire::policy p;
  p.domain = domain;
  p.identifier = identifier;
  // Any subset of the rules bounds less, never more: the first few that the
  // wire can carry are enough. A domain without rules gets an empty POLICY:
  // it still tells gatekeepers that a master covers the domain (fail_closed).
  for (const rules::rule& r : l.rules) {
    if (p.count == wire::max_policy_rules) break;
    if (r.burst <= wire::max_policy_burst && r.interval_us <= wire::max_policy_span_us / r.burst) {
      p.rules[p.count++] = {r.interval_us, r.burst};
    }
  }
  auto enc = wire::encode(p, scratch_);
  if (enc && zmq_util::send(socket_, enc->view())) policy_sent_.inc();
  // The domain's quotas go beside its POLICY (QUOTA: the RateLimit-Policy
  // field describes them). An override's quotas are not published.
  if (l.quotas.empty() || !identifier.empty()) return;
  wire::quota_policy q;
  q.domain = domain;
  for (const rules::quota& r : l.quotas) {
    if (q.count == wire::max_quota_items) break;
    q.items[q.count++] = {r.limit, r.per, r.offset_us / 1'000'000, r.length_us / 1'000'000};
  }
  auto qenc = wire::encode(q, scratch_);
  if (qenc && zmq_util::send(socket_, qenc->view())) policy_sent_.inc();
}

void control_publisher::tick(const std::vector<ingest::domain>& domains, const ingest& lookup,
                             std::chrono::steady_clock::time_point now) {
  serve_zap();
  const auto ask = [&](std::size_t i) {
    if (now - slots_[i].sent >= k_policy_gap) publish_policy(lookup, i, now);
    else if (!std::exchange(slots_[i].due, true)) due_.push_back(i);
  };
  // XPUB hands up each subscription as one frame: \x01 + topic (domain + "\0";
  // "" for everything). Unsubscriptions (\x00) need nothing.
  zmq_util::multipart m;
  while (zmq_util::recv(socket_, m, zmq::recv_flags::dontwait)) {
    if (m.count != 1 || m.views[0].empty() || m.views[0][0] != 1) continue;
    std::string_view topic = m.views[0].substr(1);
    if (topic.empty()) {
      for (std::size_t i = 0; i < domains.size(); ++i) ask(i);
      continue;
    }
    if (topic.back() == '\0') topic.remove_suffix(1);
    if (const auto i = lookup.find(topic)) ask(*i);
  }
  std::erase_if(due_, [&](std::size_t i) {
    if (i >= domains.size() || !slots_[i].due) return true;
    if (now - slots_[i].sent < k_policy_gap) return false;
    publish_policy(lookup, i, now);
    return true;
  });
  if (now >= next_policy_) {
    for (std::size_t i = 0; i < domains.size(); ++i) publish_policy(lookup, i, now);
    next_policy_ = now + std::chrono::milliseconds(wire::policy_interval_ms);
  }
}

}  // namespace smockron::master
