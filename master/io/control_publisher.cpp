// The master's control stream (see control_publisher.hpp).
#include "master/io/control_publisher.hpp"

#include <array>
#include <utility>

#include "shared/protocol/wire_limit.hpp"
#include "shared/protocol/wire_tier.hpp"

namespace smockron::master {

namespace {
/// Subscriptions remembered between two ticks; beyond, every domain's POLICY goes.
constexpr std::size_t k_max_asked = 1024;
}  // namespace

control_publisher::control_publisher(event_loop& loop, const config::master_config& cfg, const clock& clk,
                                     metrics::registry& reg)
    : server_(loop, cfg.control,
              {.role = zmtp::session::role::pub,
               .name = "control",
               .max_peers = cfg.max_control_peers,
               .allow = cfg.control_allow,
               .max_queued = static_cast<std::size_t>(cfg.control_hwm),
               .curve = cfg.curve},
              clk, reg),
      sent_(reg.add_counter("smockron_master_control_messages_total", "DELAY_UNTIL messages published")),
      dropped_(reg.add_counter("smockron_master_control_dropped_total",
                               "DELAY_UNTIL messages not queued for a gatekeeper whose queue was full (control_hwm)")),
      limits_sent_(
          reg.add_counter("smockron_master_limit_messages_total",
                          "LIMIT messages published (which limit set a DELAY_UNTIL, for a client with several)")),
      policy_sent_(reg.add_counter("smockron_master_policy_messages_total",
                                   "POLICY messages published (each domain's rules, every second)")),
      grants_sent_(reg.add_counter("smockron_master_grant_messages_total",
                                   "GRANT messages published (concurrency slots leased to a gatekeeper)")),
      grants_dropped_(reg.add_counter("smockron_master_grant_dropped_total",
                                      "GRANT messages not queued for a gatekeeper whose queue was full (control_hwm)")),
      answers_sent_(
          reg.add_counter("smockron_master_answers_sent_total", "ANSWER messages published (exact admission)")),
      answers_dropped_(
          reg.add_counter("smockron_master_answer_dropped_total",
                          "ANSWER messages not queued for a gatekeeper whose queue was full (control_hwm)")) {
  // Every subscription is told (not only a topic's first), so that each
  // gatekeeper gets a domain's policy as soon as it subscribes.
  server_.on_subscription([this](std::string_view topic) {
    if (asked_.size() < k_max_asked) asked_.emplace_back(topic);
    else ask_all_ = true;
  });
  slots_.resize(cfg.domains.size());
}

void control_publisher::delay_until(const wire::delay_until& m) {
  auto enc = wire::encode(m, scratch_);
  if (!enc) {
    dropped_.inc();
    return;
  }
  sent_.inc();
  dropped_.inc(server_.publish(enc->view()).dropped);
  // Which limit set it, right after it (the same connections keep the order).
  if (auto limit = wire::encode_limit(m, scratch_)) {
    limits_sent_.inc();
    server_.publish(limit->view());
  }
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
  if (lookup.domains()[i].exact) {
    if (auto enc = wire::encode(wire::exact_policy{domain}, scratch_)) {
      server_.publish(enc->view());
      policy_sent_.inc();
    }
  }
  // Each override goes with its domain, so a gatekeeper that hears the
  // domain's rules hears its exceptions within the same burst of messages.
  for (const auto& [identifier, l] : limits.overrides) send_policy(domain, identifier, l);
  // A domain where some identifier has a concurrency rule: its CONCURRENCY,
  // and each override's own (0: none), so that gatekeepers lease slots for
  // exactly those identifiers.
  // (A gatekeeper only asks whether an identifier takes slots: under a
  // shared limit every one does, with its own limit or, lacking one, the pool's.)
  const auto slots = [](const rules::limits& l) { return l.concurrency > 0 ? l.concurrency : l.shared_concurrency; };
  // Each tier, with its rules and its concurrency limit.
  for (const auto& [name, l] : limits.tiers) send_tier(domain, name, l, slots(l));
  bool concurrency = slots(limits.base) > 0;
  for (const auto& [identifier, l] : limits.overrides) concurrency = concurrency || slots(l) > 0;
  for (const auto& [name, l] : limits.tiers) concurrency = concurrency || slots(l) > 0;
  if (!concurrency) return;
  send_concurrency(domain, {}, slots(limits.base));
  for (const auto& [identifier, l] : limits.overrides) send_concurrency(domain, identifier, slots(l));
}

void control_publisher::send_concurrency(std::string_view domain, std::string_view identifier, std::int64_t limit) {
  if (auto enc = wire::encode(wire::concurrency_policy{domain, identifier, limit}, scratch_)) {
    server_.publish(enc->view());
    policy_sent_.inc();
  }
}

void control_publisher::answer(const wire::answer& a) {
  auto enc = wire::encode(a, scratch_);
  if (!enc) return;
  answers_sent_.inc();
  answers_dropped_.inc(server_.publish(enc->view()).dropped);
}

void control_publisher::grant(const wire::grant& g) {
  auto enc = wire::encode(g, scratch_);
  if (!enc) return;
  grants_sent_.inc();
  grants_dropped_.inc(server_.publish(enc->view()).dropped);
}

namespace {
// Any subset of the rules bounds less, never more: the first few that the
// wire can carry are enough. The domain's shared rate goes last, when there
// is room: no identifier may use more than all of it.
std::size_t policy_rules(const rules::limits& l, std::array<wire::policy::rule, wire::max_policy_rules>& out) {
  std::size_t n = 0;
  const auto add = [&](const rules::rule& r) {
    if (n < wire::max_policy_rules && wire::policy_fits(r.interval_us, r.burst)) {
      out[n++] = {r.interval_us, r.burst};
    }
  };
  for (const rules::rule& r : l.rules) add(r);
  if (l.shared_rate.interval_us > 0) add(l.shared_rate);
  return n;
}
}  // namespace

void control_publisher::send_tier(std::string_view domain, std::string_view name, const rules::limits& l,
                                  std::int64_t concurrency) {
  wire::tier_policy t;
  t.domain = domain;
  t.name = name;
  t.count = policy_rules(l, t.rules);
  t.concurrency = concurrency;
  if (auto enc = wire::encode(t, scratch_)) {
    server_.publish(enc->view());
    policy_sent_.inc();
  }
}

void control_publisher::send_policy(std::string_view domain, std::string_view identifier, const rules::limits& l) {
  wire::policy p;
  p.domain = domain;
  p.identifier = identifier;
  // A domain without rules gets an empty POLICY: it still tells gatekeepers
  // that a master covers the domain (fail_closed).
  p.count = policy_rules(l, p.rules);
  if (auto enc = wire::encode(p, scratch_)) {
    server_.publish(enc->view());
    policy_sent_.inc();
  }
  // The domain's quotas go beside its POLICY (QUOTA: the RateLimit-Policy
  // field describes them). An override's quotas are not published.
  if (l.quotas.empty() || !identifier.empty()) return;
  wire::quota_policy q;
  q.domain = domain;
  for (const rules::quota& r : l.quotas) {
    if (q.count == wire::max_quota_items) break;
    q.items[q.count++] = {r.limit, r.per, r.offset_us / 1'000'000, r.length_us / 1'000'000};
  }
  if (auto qenc = wire::encode(q, scratch_)) {
    server_.publish(qenc->view());
    policy_sent_.inc();
  }
}

void control_publisher::tick(const std::vector<ingest::domain>& domains, const ingest& lookup,
                             std::chrono::steady_clock::time_point now) {
  const auto ask = [&](std::size_t i) {
    if (now - slots_[i].sent >= k_policy_gap) publish_policy(lookup, i, now);
    else if (!std::exchange(slots_[i].due, true)) due_.push_back(i);
  };
  // A subscription's topic is a domain + "\0" ("" for everything).
  if (std::exchange(ask_all_, false)) {
    for (std::size_t i = 0; i < domains.size(); ++i) ask(i);
  }
  for (std::string_view topic : asked_) {
    if (topic.empty()) {
      for (std::size_t i = 0; i < domains.size(); ++i) ask(i);
      continue;
    }
    if (topic.back() == '\0') topic.remove_suffix(1);
    if (const auto i = lookup.find(topic)) ask(*i);
  }
  asked_.clear();
  std::erase_if(due_, [&](std::size_t i) {
    if (i >= domains.size() || !slots_[i].due) return true;
    if (now - slots_[i].sent < k_policy_gap) return false;
    publish_policy(lookup, i, now);
    return true;
  });
  if (now >= next_policy_) {
    for (std::size_t i = 0; i < domains.size(); ++i) publish_policy(lookup, i, now);
    // Every lease again: a GRANT lost on the way (a full queue, a control
    // connection that came back) is healed within the interval.
    lookup.each_grant([&](const wire::grant& g) { grant(g); });
    next_policy_ = now + std::chrono::milliseconds(wire::policy_interval_ms);
  }
}

}  // namespace smockron::master
