// The master's accounting loop (see service.hpp).
#include "master/service.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

namespace smockron::master {
namespace {

std::vector<rules::limits> compile(const config::master_config& cfg) {
  std::vector<rules::limits> out;
  for (const auto& d : cfg.domains) out.push_back(d.compile(cfg.max_clock_skew));
  return out;
}

std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::int64_t ceil_ms(std::int64_t us) { return (us + 999) / 1000; }

}  // namespace

service::service(const config::master_config& cfg, zmq::context_t& ctx, const clock& clk, metrics::registry& reg)
    : cfg_(cfg),
      clock_(clk),
      metrics_(reg),
      accounting_(cfg.accounting, {.max_peers = cfg.max_accounting_peers}, clk, reg),
      control_(ctx, zmq::socket_type::xpub),
      limiter_(compile(cfg), cfg.max_identifiers),
      unknown_domain_(reg.add_counter("smockron_master_unknown_domain_total",
                                      "Accounting messages for a domain this master does not own")),
      control_sent_(reg.add_counter("smockron_master_control_messages_total", "DELAY_UNTIL messages published")),
      control_dropped_(reg.add_counter("smockron_master_control_dropped_total",
                                       "DELAY_UNTIL messages dropped because the send queue was full")),
      policy_sent_(reg.add_counter("smockron_master_policy_messages_total",
                                   "POLICY messages published (each domain's rules, every second)")),
      evictions_(reg.add_counter("smockron_master_evictions_total",
                                 "Tracked identifiers evicted (least recently used) at max_identifiers")),
      expirations_(reg.add_counter("smockron_master_expirations_total", "Tracked identifiers expired by the sweep")),
      reloads_(reg.add_counter("smockron_master_reloads_total", "Successful configuration reloads")),
      reload_failures_(reg.add_counter("smockron_master_reload_failures_total",
                                       "Reloads rejected because the new configuration was invalid")),
      held_dropped_(reg.add_counter("smockron_master_accounting_dropped_total",
                                    "Accounting messages dropped while the master read its states from Redis "
                                    "(more than accounting_hwm arrived)")),
      restore_skipped_(reg.add_counter("smockron_master_redis_restore_skipped_total",
                                       "States read from Redis and not used (unknown domain, other shape, expired, cap)")),
      latency_(reg.add_histogram("smockron_master_processing_seconds",
                                 "Time to process one accounting message (decode, rules, publish); one message in 16 is sampled",
                                 metrics::exponential_buckets(1e-6, 2, 18))),
      log_(log::get("master")) {
  for (std::size_t i = 0; i < wire::decode_error_count; ++i) {
    decode_errors_[i] = &reg.add_counter(
        "smockron_master_decode_errors_total", "Malformed accounting messages by reason",
        metrics::labels({{"reason", wire::to_string(static_cast<wire::decode_error>(i))}}));
  }
  reg.add_callback("smockron_master_tracked_identifiers", "Tracked (domain, identifier) states", "",
                   [this] { return static_cast<double>(limiter_.tracked()); });
  control_.set(zmq::sockopt::sndhwm, static_cast<int>(cfg.control_hwm));
  control_.set(zmq::sockopt::linger, 0);
  // Every subscription is passed up (not only a topic's first), so that each
  // gatekeeper gets a domain's policy as soon as it subscribes.
  control_.set(zmq::sockopt::xpub_verbose, 1);
  control_.bind(cfg.control);
  install_domains(cfg);
  if (cfg.store == config::store_kind::redis) {
    redis_store::options o;
    o.url = cfg.redis_target;
    o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(cfg.redis_timeout);
    o.load_limit = cfg.max_identifiers;
    store_ = std::make_unique<redis_store>(std::move(o), reg);
    limiter_.track_dirty();
    reg.add_callback("smockron_master_redis_unwritten_states", "States changed in memory and not yet written to Redis",
                     "", [this] { return static_cast<double>(unwritten_.load(std::memory_order_relaxed) + store_->queued()); });
  }
  heartbeat_ns_ = clock_.steady_now().time_since_epoch().count();
}

service::~service() = default;

void service::pump_store(std::chrono::steady_clock::time_point now, bool force) {
  if (store_->take_resync()) limiter_.mark_all_dirty();
  const std::int64_t now_us = clock_.wall_us();
  for (auto& l : store_->take_loaded()) {
    const auto it = domain_index_.find(l.domain);
    if (it == domain_index_.end() || domains_[it->second].limits.algo != l.algo ||
        !limiter_.restore(it->second, l.identifier, l.st, now_us)) {
      restore_skipped_.inc();
    }
  }
  unwritten_.store(limiter_.dirty(), std::memory_order_relaxed);
  if (limiter_.dirty() == 0 || !store_->idle() || (!force && now < next_flush_)) return;
  next_flush_ = now + k_flush_interval;
  std::vector<redis_store::write> batch;
  batch.reserve(std::min(limiter_.dirty(), k_flush_batch));
  limiter_.drain_dirty(k_flush_batch, [&](std::size_t domain, std::string_view identifier, const rules::state& st) {
    const rules::limits& l = domains_[domain].limits;
    const std::int64_t ttl_ms = ceil_ms(rules::expires_at_us(l, st) - now_us);
    if (ttl_ms <= 0) return;  // can no longer matter; Redis lets its copy expire too
    batch.push_back({store_key(domains_[domain].name, identifier), encode_state(l.algo, st), ttl_ms});
  });
  store_->submit(std::move(batch));
  unwritten_.store(limiter_.dirty(), std::memory_order_relaxed);
}

void service::finish(std::chrono::milliseconds deadline) {
  if (!store_) return;
  const auto until = clock_.steady_now() + deadline;
  while (limiter_.dirty() > 0 && store_->up() && clock_.steady_now() < until) {
    if (store_->idle()) pump_store(clock_.steady_now(), true);
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_.steady_now());
  store_->stop(std::max(left, std::chrono::milliseconds(0)));
  if (limiter_.dirty() > 0) log_->warn("shutdown: {} state(s) not written to redis", limiter_.dirty());
}

std::string service::readiness() const {
  if (!store_) return "ready (store: memory)\n";
  return "ready (store: " + store_->describe() + ")\n";
}

void service::install_domains(const config::master_config& cfg) {
  // Subscribe to exactly the owned domains: topic = name + "\0" makes the
  // ZeroMQ prefix match exact, so masters can split domains between them.
  for (const auto& d : domains_) {
    if (!cfg.find_domain(d.name)) accounting_.unsubscribe(d.name + std::string(1, '\0'));
  }
  std::vector<domain_slot> slots;
  domain_index_.clear();
  for (const auto& d : cfg.domains) {
    domain_slot s;
    s.name = d.name;
    s.limits = d.compile(cfg.max_clock_skew);
    for (auto st : {wire::status::accepted, wire::status::delayed, wire::status::rejected}) {
      s.messages[static_cast<int>(st)] = &metrics_.add_counter(
          "smockron_master_accounting_messages_total", "Accounting messages processed by domain and status",
          metrics::labels({{"domain", d.name}, {"status", wire::to_string(st)}}));
    }
    s.tracked = &metrics_.add_gauge("smockron_master_domain_tracked_identifiers",
                                    "Tracked identifiers per domain", metrics::labels({{"domain", d.name}}));
    const bool existed = std::any_of(domains_.begin(), domains_.end(), [&](const auto& o) { return o.name == d.name; });
    if (!existed) accounting_.subscribe(d.name + std::string(1, '\0'));
    domain_index_.emplace(d.name, slots.size());
    slots.push_back(std::move(s));
  }
  domains_ = std::move(slots);
}

void service::reconfigure(const config::master_config& next) {
  std::vector<std::optional<std::size_t>> old_index;
  for (const auto& d : next.domains) {
    auto it = domain_index_.find(d.name);
    old_index.push_back(it == domain_index_.end() ? std::nullopt : std::optional<std::size_t>(it->second));
  }
  for (const auto& d : domains_) {
    if (!next.find_domain(d.name)) d.tracked->set(0);
  }
  limiter_.reconfigure(compile(next), old_index);
  limiter_.set_max_identifiers(next.max_identifiers);
  install_domains(next);
  next_policy_ = {};  // the new rules reach the gatekeepers at once
  policy_due_.clear();
  {
    std::lock_guard lock(status_mutex_);
    const auto endpoints = std::tie(cfg_.accounting, cfg_.control, cfg_.admin);
    if (endpoints != std::tie(next.accounting, next.control, next.admin) || cfg_.max_accounting_peers != next.max_accounting_peers ||
        cfg_.control_hwm != next.control_hwm) {
      log_->warn("reload: endpoint, max_accounting_peers and high-water-mark changes take effect only after a restart");
    }
    if (cfg_.store != next.store || cfg_.redis_target != next.redis_target || cfg_.redis_timeout != next.redis_timeout) {
      log_->warn("reload: store changes take effect only after a restart");
    }
    const auto kept_store = std::tuple(cfg_.store, cfg_.redis, cfg_.redis_target, cfg_.redis_timeout);
    const auto keep_accounting = cfg_.accounting, keep_control = cfg_.control;
    const auto keep_admin = cfg_.admin;
    const auto keep_hwm = std::tuple(cfg_.accounting_hwm, cfg_.max_accounting_peers, cfg_.control_hwm);
    cfg_ = next;
    cfg_.accounting = keep_accounting;
    cfg_.control = keep_control;
    cfg_.admin = keep_admin;
    std::tie(cfg_.accounting_hwm, cfg_.max_accounting_peers, cfg_.control_hwm) = keep_hwm;
    std::tie(cfg_.store, cfg_.redis, cfg_.redis_target, cfg_.redis_timeout) = kept_store;
  }
  reloads_.inc();
  log_->info("configuration reloaded: {} domain(s)", domains_.size());
}

void service::request_reload(std::function<std::optional<config::master_config>()> loader) {
  {
    std::lock_guard lock(status_mutex_);
    reload_loader_ = std::move(loader);
  }
  reload_requested_ = true;
}

void service::log_bad(std::string_view what, std::string_view detail) {
  std::uint64_t suppressed = 0;
  if (bad_input_log_.allow(clock_.steady_now(), suppressed)) {
    if (suppressed > 0) log_->warn("{}: {} ({} similar messages suppressed)", what, detail, suppressed);
    else log_->warn("{}: {}", what, detail);
  }
}

void service::handle(std::span<const std::string_view> frames, bool truncated) {
  // The latency histogram samples one message in 16: two clock reads per
  // message would cost more than the measurement is worth at 500k msg/s.
  const bool sampled = (++handled_ & 15) == 0;
  const auto started = sampled ? clock_.steady_now() : std::chrono::steady_clock::time_point{};
  auto msg = truncated ? wire::result<wire::accounting>(wire::decode_error::frame_count)
                       : wire::decode_accounting(frames);
  if (!msg) {
    decode_errors_[static_cast<int>(msg.error())]->inc();
    log_bad("malformed accounting message", wire::to_string(msg.error()));
    return;
  }
  const auto it = domain_index_.find(msg->domain);
  if (it == domain_index_.end()) {
    unknown_domain_.inc();
    log_bad("accounting message for unknown domain", msg->domain);
    return;
  }
  domain_slot& d = domains_[it->second];
  d.messages[static_cast<int>(msg->state)]->inc();
  const std::int64_t now_us = clock_.wall_us();
  rules::event e;
  switch (msg->state) {
    case wire::status::accepted: e = {rules::event_kind::accepted, msg->received_ms * 1000}; break;
    case wire::status::delayed: e = {rules::event_kind::delayed, msg->delayed_ms * 1000}; break;
    case wire::status::rejected: e = {rules::event_kind::rejected, msg->received_ms * 1000}; break;
  }
  const rules::decision dec = limiter_.apply(it->second, msg->identifier, e, now_us);
  if (dec.throttled && dec.next_us > now_us) publish(d, msg->identifier, dec);
  d.tracked->set(static_cast<double>(limiter_.tracked(it->second)));
  if (sampled) latency_.observe(std::chrono::duration<double>(clock_.steady_now() - started).count());
}

void service::publish(const domain_slot& d, std::string_view identifier, const rules::decision& dec) {
  wire::delay_until m;
  m.domain = d.name;
  m.identifier = identifier;
  m.next_ms = ceil_ms(dec.next_us);
  m.interval_ms = std::max<std::int64_t>(1, (dec.interval_us + 500) / 1000);
  auto enc = wire::encode(m, scratch_);
  if (enc && zmq_util::send(control_, enc->view())) control_sent_.inc();
  else control_dropped_.inc();
}

void service::publish_policy(domain_slot& d, std::chrono::steady_clock::time_point now) {
  d.policy_sent = now;
  d.policy_due = false;
  wire::policy p;
  p.domain = d.name;
  // Any subset of the rules bounds less, never more: the first few that the
  // wire can carry are enough. A domain without rules gets an empty POLICY:
  // it still tells gatekeepers that a master covers the domain (fail_closed).
  for (const rules::rule& r : d.limits.rules) {
    if (p.count == wire::max_policy_rules) break;
    if (r.burst <= wire::max_policy_burst && r.interval_us <= wire::max_policy_span_us / r.burst) {
      p.rules[p.count++] = {r.interval_us, r.burst};
    }
  }
  auto enc = wire::encode(p, scratch_);
  if (enc && zmq_util::send(control_, enc->view())) policy_sent_.inc();
}

void service::serve_subscriptions(std::chrono::steady_clock::time_point now) {
  const auto ask = [&](std::size_t i) {
    domain_slot& d = domains_[i];
    if (now - d.policy_sent >= k_policy_gap) publish_policy(d, now);
    else if (!std::exchange(d.policy_due, true)) policy_due_.push_back(i);
  };
  // XPUB hands up each subscription as one frame: \x01 + topic (domain + "\0";
  // "" for everything). Unsubscriptions (\x00) need nothing.
  zmq_util::multipart m;
  while (zmq_util::recv(control_, m, zmq::recv_flags::dontwait)) {
    if (m.count != 1 || m.views[0].empty() || m.views[0][0] != 1) continue;
    std::string_view topic = m.views[0].substr(1);
    if (topic.empty()) {
      for (std::size_t i = 0; i < domains_.size(); ++i) ask(i);
      continue;
    }
    if (topic.back() == '\0') topic.remove_suffix(1);
    if (const auto it = domain_index_.find(topic); it != domain_index_.end()) ask(it->second);
  }
  std::erase_if(policy_due_, [&](std::size_t i) {
    if (i >= domains_.size() || !domains_[i].policy_due) return true;
    if (now - domains_[i].policy_sent < k_policy_gap) return false;
    publish_policy(domains_[i], now);
    return true;
  });
}

void service::sweep(std::int64_t now_us) {
  // Small slices often: a long sweep would stall the loop and show in the
  // control-loop p99 (1,000 entries every 10 ms = 100k entries/s examined).
  const std::size_t removed = limiter_.sweep(now_us, k_sweep_batch);
  expirations_.inc(removed);
  evictions_.inc(limiter_.evictions() - reported_evictions_);
  reported_evictions_ = limiter_.evictions();
  for (std::size_t i = 0; i < domains_.size(); ++i) domains_[i].tracked->set(static_cast<double>(limiter_.tracked(i)));
}

std::size_t service::poll_once(std::chrono::milliseconds timeout) {
  const std::size_t n = accounting_.poll(timeout, [this](std::span<const std::string_view> frames, bool truncated) {
    handle(frames, truncated);
  });
  const auto now = clock_.steady_now();
  heartbeat_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  if (store_) pump_store(now, false);
  if (now >= next_sweep_) {
    sweep(clock_.wall_us());
    next_sweep_ = now + cfg_.sweep_interval;
  }
  serve_subscriptions(now);
  if (now >= next_policy_) {
    for (domain_slot& d : domains_) publish_policy(d, now);
    next_policy_ = now + std::chrono::milliseconds(wire::policy_interval_ms);
  }
  if (reload_requested_.exchange(false)) {
    std::function<std::optional<config::master_config>()> loader;
    {
      std::lock_guard lock(status_mutex_);
      loader = reload_loader_;
    }
    if (auto next = loader ? loader() : std::nullopt) reconfigure(*next);
    else reload_failures_.inc();
  }
  return n;
}

void service::run(const std::atomic<bool>& stop) {
  if (store_) {
    const auto since = clock_.steady_now();
    // Gatekeepers connect and publish meanwhile: their messages are held (at
    // most accounting_hwm, the rest dropped and counted) and processed in
    // order once the states are back.
    std::vector<std::vector<std::string>> held;
    while (!store_->settled() && !stop.load(std::memory_order_relaxed)) {
      pump_store(clock_.steady_now(), false);
      heartbeat_ns_.store(clock_.steady_now().time_since_epoch().count(), std::memory_order_relaxed);
      accounting_.poll(std::chrono::milliseconds(2), [&](std::span<const std::string_view> frames, bool truncated) {
        if (held.size() >= static_cast<std::size_t>(cfg_.accounting_hwm)) {
          held_dropped_.inc();
        } else if (truncated) {
          handle(frames, true);  // counted as malformed now; needs no state
        } else {
          held.emplace_back(frames.begin(), frames.end());
        }
      });
    }
    pump_store(clock_.steady_now(), false);
    log_->info("store {}: serving after {:.3f}s ({} state(s) in memory, {} accounting message(s) held meanwhile)",
               store_->describe(), std::chrono::duration<double>(clock_.steady_now() - since).count(),
               limiter_.tracked(), held.size());
    for (const auto& m : held) {
      std::array<std::string_view, zmtp_subscriber::k_max_frames> v;
      for (std::size_t i = 0; i < m.size(); ++i) v[i] = m[i];
      handle({v.data(), m.size()});
    }
  }
  while (!stop.load(std::memory_order_relaxed)) {
    try {
      // Wake at least every 50 ms whatever sweep_interval is: stop and reload
      // requests and the liveness heartbeat must not wait for a long sweep tick.
      const auto tick = std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.sweep_interval);
      poll_once(std::clamp(tick, std::chrono::milliseconds(1), std::chrono::milliseconds(50)));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      if (e.num() == ETERM) return;
      log_->error("accounting loop: {}", e.what());
    } catch (const std::exception& e) {
      // Never seen; if it were to repeat, a pause keeps it from spinning a core.
      log_->error("accounting loop: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

bool service::alive(std::chrono::steady_clock::duration max_stall) const {
  const auto beat = std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(heartbeat_ns_.load(std::memory_order_relaxed)));
  return clock_.steady_now() - beat < max_stall;
}

std::string service::status_json() const {
  std::lock_guard lock(status_mutex_);
  std::string out = "{\"store\":\"";
  out += cfg_.store == config::store_kind::memory ? "memory" : "redis";
  out += "\",";
  if (store_) {
    out += "\"redis\":{\"connected\":";
    out += store_->up() ? "true" : "false";
    out += ",\"unwritten_states\":" + std::to_string(unwritten_.load(std::memory_order_relaxed) + store_->queued()) + "},";
  }
  out += "\"max_identifiers\":" + std::to_string(cfg_.max_identifiers);
  out += ",\"domains\":[";
  bool first = true;
  for (const auto& d : cfg_.domains) {
    if (!first) out += ",";
    first = false;
    out += "{\"name\":\"" + json_escape(d.name) + "\",\"algorithm\":\"";
    out += d.algorithm == rules::algorithm::gcra ? "gcra" : "sliding-log";
    out += "\",\"rules\":[";
    for (std::size_t i = 0; i < d.rules.size(); ++i) {
      if (i) out += ",";
      out += "{\"rate\":\"" + format_rate(d.rules[i].r) + "\",\"burst\":" + std::to_string(d.rules[i].burst) + "}";
    }
    const auto* g = &metrics_.add_gauge("smockron_master_domain_tracked_identifiers", "Tracked identifiers per domain",
                                        metrics::labels({{"domain", d.name}}));
    out += "],\"tracked_identifiers\":" + std::to_string(static_cast<std::uint64_t>(g->value())) + "}";
  }
  out += "]}";
  return out;
}

}  // namespace smockron::master
