// The master's loop (see service.hpp).
#include "master/server/service.hpp"

#include <sys/epoll.h>

#include <algorithm>
#include <array>
#include <thread>
#include <vector>

#include "master/io/control_publisher.hpp"
#include "master/io/udp_responder.hpp"
#include "master/server/status.hpp"
#include "master/store/redis_store.hpp"
#include "shared/protocol/wire_batch.hpp"

namespace smockron::master {
namespace {

std::string topic(std::string_view domain) { return std::string(domain) + std::string(1, '\0'); }

// Settings that need a restart keep their running values in `next`; returns
// the keys that differed (for the log).
std::string keep_restart_only(const config::master_config& running, config::master_config& next) {
  using c = config::master_config;
  std::string mechanism;
  if ((running.curve == nullptr) != (next.curve == nullptr)) {  // plaintext <-> CURVE: a restart
    next.curve = running.curve;
    next.curve_secret_key = running.curve_secret_key;
    next.curve_allowed_keys = running.curve_allowed_keys;
    mechanism = "curve_secret_key (CURVE on or off)";
  }
  std::string changed = config::restart_only<c>(running, next)
                            .keep(&c::accounting, "accounting")
                            .keep(&c::control, "control")
                            .keep(&c::admin, "admin")
                            .keep(&c::query, "query")
                            .keep(&c::query_allow, "query_allow")
                            .keep(&c::rls, "rls")
                            .keep(&c::rls_allow, "rls_allow")
                            .keep(&c::max_accounting_peers, "max_accounting_peers")
                            .keep(&c::control_hwm, "control_hwm")
                            .keep(&c::accounting_allow, "accounting_allow")
                            .keep(&c::admin_allow, "admin_allow")
                            .keep(&c::control_allow, "control_allow")
                            .keep(&c::startup_backlog, "startup_backlog")
                            .keep(&c::store, "store")
                            .keep(&c::redis, "redis")
                            .keep(&c::redis_target, "redis")
                            .keep(&c::redis_timeout, "redis_timeout")
                            .keep(&c::log_level, "log_level")
                            .keep(&c::trace, "trace_*")
                            .changed();
  if (!mechanism.empty()) changed += (changed.empty() ? "" : ", ") + mechanism;
  return changed;
}

}  // namespace

service::service(const config::master_config& cfg, const clock& clk, metrics::registry& reg)
    : cfg_(cfg),
      file_cfg_(cfg),
      clock_(clk),
      metrics_(reg),
      accounting_(loop_, cfg.accounting,
                  {.max_peers = cfg.max_accounting_peers, .allow = cfg.accounting_allow, .curve = cfg.curve}, clk, reg),
      ingest_(cfg, clk, reg),
      control_(std::make_unique<control_publisher>(loop_, cfg, clk, reg)),
      reloads_(reg.add_counter("smockron_master_reloads_total", "Successful configuration reloads")),
      reload_failures_(reg.add_counter("smockron_master_reload_failures_total",
                                       "Reloads rejected because the new configuration was invalid")),
      held_dropped_(reg.add_counter("smockron_master_accounting_dropped_total",
                                    "Accounting messages dropped while the master read its states from Redis "
                                    "(more than startup_backlog arrived)")),
      restore_skipped_(reg.add_counter(
          "smockron_master_redis_restore_skipped_total",
          "States and reservations read from Redis and not used (unknown domain, other shape, expired, cap)")),
      log_(log::get("master")) {
  // Subscribed to exactly the owned domains: topic = name + "\0" makes the
  // prefix match exact, so masters can split domains between them.
  for (const auto& d : ingest_.domains()) accounting_.subscribe(topic(d.name));
  accounting_.on_message([this](std::span<const std::string_view> frames, bool truncated) {
    deliver(frames, truncated, accounting_.current_peer(), accounting_.current_gatekeeper());
  });
  // A gatekeeper's reservations die with its connection, its pace count with its last one.
  accounting_.on_peer_closed([this](std::uint64_t peer, std::uint64_t gatekeeper_gone) {
    ingest_.peer_closed(peer, clock_.wall_us(), gatekeeper_gone);
  });
  if (cfg.store == config::store_kind::redis) {
    redis_store::options o;
    o.url = cfg.redis_target;
    o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(cfg.redis_timeout);
    o.load_limit = cfg.max_identifiers;
    o.reservation_owner = reservation_owner(cfg.accounting);
    reservation_writes_ = std::make_unique<reservation_writes>(o.reservation_owner);
    store_ = std::make_unique<redis_store>(std::move(o), reg);
    ingest_.states().track_dirty();
    ingest_.log_reservations(reservation_writes_.get());
    reg.add_callback(
        "smockron_master_redis_unwritten_states", "States changed in memory and not yet written to Redis", "",
        [this] { return static_cast<double>(unwritten_.load(std::memory_order_relaxed) + store_->queued()); });
  }
  if (cfg.query) {
    query_ = std::make_unique<udp_responder>(*cfg.query, cfg.query_allow);
    const auto ignored = [&reg](const char* reason) -> metrics::counter* {
      return &reg.add_counter("smockron_master_query_ignored_total", "Query datagrams not answered, by reason",
                              metrics::labels({{"reason", reason}}));
    };
    query_ignored_ = query_counters{ignored("malformed"), ignored("unknown_command"), ignored("too_large"),
                                    ignored("refused"), ignored("send_failed")};
    if (!loop_.add(query_->fd(), EPOLLIN, queries_ready_))  // level-triggered: what one call leaves is seen again
      throw std::system_error(errno, std::generic_category(), "epoll_ctl (query endpoint)");
  }
  // Before the RLS server starts: its calls may throttle (and so trace) at once, on gRPC's threads.
  tracer_ = tracing::exporter::from_config(cfg.trace, "smockron-master", reg, "smockron_master");
  if (cfg.rls) {
    envoy_ = std::make_unique<envoy_decider>(cfg_, ingest_, clk, reg,
                                             [this](const wire::delay_until& d) { throttled(d, "rls"); });
    envoy_server_ = std::make_unique<envoy_server>(*cfg.rls, cfg.rls_allow, reg, *envoy_, engine_mutex_);
    if (!loop_.add(envoy_server_->wake_fd(), EPOLLIN, envoy_ready_))
      throw std::system_error(errno, std::generic_category(), "epoll_ctl (rls endpoint)");
  }
  metrics::add_build_info(reg, "master");
  heartbeat_ns_ = clock_.steady_now().time_since_epoch().count();
  // A master that answers its admin endpoint but whose loop has stopped is
  // stale: no accounting is decided (what /livez says, as a number to alert on).
  reg.add_callback("smockron_master_loop_age_seconds", "Seconds since the accounting loop last turned", "", [this] {
    const auto beat = std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(heartbeat_ns_.load(std::memory_order_relaxed)));
    return std::chrono::duration<double>(clock_.steady_now() - beat).count();
  });
}

service::~service() {
  if (envoy_server_) envoy_server_->shutdown();  // its calls use the engine: they end first
}

std::uint16_t service::rls_port() const { return envoy_server_ ? envoy_server_->port() : 0; }

const std::string& service::control_endpoint() const { return control_->endpoint(); }

std::uint16_t service::query_port() const { return query_ ? query_->port() : 0; }

void service::serve_queries() {
  const std::int64_t now_us = clock_.wall_us();
  query_->serve([&](std::string_view in, std::string& out) {
    const auto parsed = query::parse(in);
    if (!parsed.req) {
      (parsed.why == query::ignored::unknown_command ? query_ignored_->unknown_command : query_ignored_->malformed)
          ->inc();
      return false;
    }
    const auto result = ingest_.answer(*parsed.req, now_us, out);
    if (result.publish) throttled(*result.publish, "query");
    return result.answered;
  });
  const auto& seen = query_->seen();
  const std::uint64_t now[3] = {seen.too_large, seen.refused, seen.send_failed};
  metrics::counter* counters[3] = {query_ignored_->too_large, query_ignored_->refused, query_ignored_->send_failed};
  for (int i = 0; i < 3; ++i) {
    counters[i]->inc(now[i] - query_seen_[i]);
    query_seen_[i] = now[i];
  }
}

void service::deliver(std::span<const std::string_view> frames, bool truncated, std::uint64_t peer,
                      std::uint64_t gatekeeper) {
  // A gatekeeper on a CURVE link packs messages into batches (wire_batch.hpp);
  // a malformed one is handled as the one message it is (and counted as such).
  if (!truncated && wire::is_batch(frames) &&
      wire::for_each_batch_record(frames,
                                  [&](std::span<const std::string_view> f) { handle(f, false, peer, gatekeeper); }))
    return;
  handle(frames, truncated, peer, gatekeeper);
}

void service::handle(std::span<const std::string_view> frames, bool truncated, std::uint64_t peer,
                     std::uint64_t gatekeeper) {
  if (const auto d = ingest_.handle(frames, truncated, clock_.wall_us(), peer, gatekeeper)) throttled(*d, "accounting");
}

void service::throttled(const wire::delay_until& d, std::string_view source) {
  control_->delay_until(d);
  if (!tracer_ || !tracer_->sampled(std::nullopt)) return;
  // A point in time: the decision that a client must wait (the request it was about is in the gatekeeper's trace).
  const std::int64_t now_us = clock_.wall_us();
  tracing::span s;
  s.trace = tracing::exporter::new_trace_id();
  s.id = tracing::exporter::new_span_id();
  s.name = "smockron.throttle";
  s.start_ns = s.end_ns = tracing::unix_ns(now_us);
  s.add("smockron.domain", d.domain);
  s.add_hash("smockron.identifier_hash", tracing::identifier_hash(d.identifier));
  s.add("smockron.delay_ms", std::max<std::int64_t>(0, d.next_ms - now_us / 1000));
  s.add_literal("smockron.source", source);
  tracer_->submit(s);
}

std::size_t service::poll_once(std::chrono::milliseconds timeout) {
  const std::size_t before = accounting_.delivered();
  // The turn's work is under the engine's lock (Envoy's calls decide under it too); the wait is not.
  std::unique_lock lock(engine_mutex_, std::defer_lock);
  loop_.run_once(timeout, &lock);
  accounting_.after_turn();
  const std::size_t n = accounting_.delivered() - before;
  const auto now = clock_.steady_now();
  heartbeat_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  if (store_) pump_store(now, false);
  if (now >= next_sweep_) {
    sweep_left_ = ingest::k_sweep_batch;
    next_sweep_ = now + cfg_.sweep_interval;
  }
  if (sweep_left_ > 0) {
    const std::size_t slice = std::min(sweep_left_, ingest::k_sweep_slice);
    ingest_.sweep(clock_.wall_us(), slice);
    sweep_left_ -= slice;
  }
  // The leases this turn's LEASE messages changed: one GRANT per holder.
  ingest_.take_grants([&](const wire::grant& g) { control_->grant(g); });
  // This turn's ASKs: one ANSWER each.
  ingest_.take_answers([&](const wire::answer& a) { control_->answer(a); });
  control_->tick(ingest_.domains(), ingest_, now);
  if (queries_pending_.exchange(false)) answer_queries();
  control_->after_turn();  // what this turn published leaves now, together
  if (reload_requested_.exchange(false)) {
    std::function<std::optional<config::master_config>()> loader;
    {
      std::lock_guard lock(status_mutex_);
      loader = reload_loader_;
    }
    if (auto next = loader ? loader() : std::nullopt) reconfigure(std::move(*next));
    else reload_failures_.inc();
  }
  return n;
}

void service::run(const std::atomic<bool>& stop) {
  if (store_) {
    std::lock_guard lock(engine_mutex_);  // Envoy's calls wait for the states, as accounting does
    restore_from_store(stop);
  }
  while (!stop.load(std::memory_order_relaxed)) {
    try {
      // Wake at least every 50 ms whatever sweep_interval is: stop and reload
      // requests and the liveness heartbeat must not wait for a long sweep tick.
      const auto tick = std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.sweep_interval);
      // While a sweep is under way, its next slice comes right after what has arrived.
      poll_once(sweep_left_ > 0 ? std::chrono::milliseconds(0)
                                : std::clamp(tick, std::chrono::milliseconds(1), std::chrono::milliseconds(50)));
    } catch (const std::exception& e) {
      // Never seen; if it were to repeat, a pause keeps it from spinning a core.
      log_->error("accounting loop: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

// Gatekeepers connect and publish while the states are read back: their
// messages are held (at most startup_backlog, the rest dropped and counted)
// and processed in order once the states are back.
void service::restore_from_store(const std::atomic<bool>& stop) {
  const auto since = clock_.steady_now();
  struct held_message {
    std::vector<std::string> frames;
    std::uint64_t peer;        ///< the connection it came on
    std::uint64_t gatekeeper;  ///< the name that connection gave
  };
  std::vector<held_message> held;
  accounting_.on_message([&](std::span<const std::string_view> frames, bool truncated) {
    if (held.size() >= static_cast<std::size_t>(cfg_.startup_backlog)) {
      held_dropped_.inc();
    } else if (truncated) {
      handle(frames, true);  // counted as malformed now; needs no state
    } else {
      held.push_back({std::vector<std::string>(frames.begin(), frames.end()), accounting_.current_peer(),
                      accounting_.current_gatekeeper()});
    }
  });
  while (!store_->settled() && !stop.load(std::memory_order_relaxed)) {
    pump_store(clock_.steady_now(), false);
    heartbeat_ns_.store(clock_.steady_now().time_since_epoch().count(), std::memory_order_relaxed);
    loop_.run_once(std::chrono::milliseconds(2));
    accounting_.after_turn();
    control_->after_turn();
  }
  accounting_.on_message([this](std::span<const std::string_view> frames, bool truncated) {
    deliver(frames, truncated, accounting_.current_peer(), accounting_.current_gatekeeper());
  });
  pump_store(clock_.steady_now(), false);
  log_->info("store {}: serving after {:.3f}s ({} state(s) in memory, {} accounting message(s) held meanwhile)",
             store_->describe(), std::chrono::duration<double>(clock_.steady_now() - since).count(), tracked(),
             held.size());
  for (const auto& m : held) {
    std::array<std::string_view, zmtp_server::k_max_frames> v;
    for (std::size_t i = 0; i < m.frames.size(); ++i) v[i] = m.frames[i];
    deliver({v.data(), m.frames.size()}, false, m.peer, m.gatekeeper);  // (a CURVE link's BATCH unpacked)
  }
}

void service::pump_store(std::chrono::steady_clock::time_point now, bool force) {
  limiter& states = ingest_.states();
  restore_overrides();  // before the states: they are checked against these rules
  if (store_->take_resync()) {
    // Redis may have come back empty: everything held is written again.
    states.mark_all_dirty();
    for (const auto& [key, entry] : runtime_overrides_)
      override_writes_.push_back({override_key(entry.first, entry.second.identifier), entry.second.text, false});
    ingest_.reservation_book().each([&](const reservations::reservation& r) { reservation_writes_->opened(r); });
  }
  const std::int64_t now_us = clock_.wall_us();
  for (auto& l : store_->take_loaded()) {
    const auto i = ingest_.find(l.domain);
    if (!i || states.limits_of(*i, l.identifier, l.tier).algo != l.algo ||
        !states.restore(*i, l.identifier, l.st, now_us, l.tier)) {
      restore_skipped_.inc();
    }
  }
  // After the states they were charged in (the store reads them last): open
  // again until their correction comes, or given back at the timeout.
  for (auto& rec : store_->take_loaded_reservations()) {
    reservations::reservation r{reservations::k_restored,
                                std::move(rec.domain),
                                std::move(rec.identifier),
                                rec.at_ms,
                                rec.units,
                                rec.opened_us,
                                rec.tag};
    if (!ingest_.find(r.domain)) {
      reservation_writes_->closed(r);  // a domain no longer owned: forgotten
      restore_skipped_.inc();
    } else if (!ingest_.restore_reservation(std::move(r))) {
      restore_skipped_.inc();
    }
  }
  unwritten_.store(states.dirty(), std::memory_order_relaxed);
  if ((states.dirty() == 0 && reservation_writes_->pending() == 0 && override_writes_.empty()) || !store_->idle() ||
      (!force && now < next_flush_))
    return;
  next_flush_ = now + k_flush_interval;
  std::vector<redis_store::write> batch;
  batch.reserve(std::min(states.dirty(), k_flush_batch) + reservation_writes_->pending());
  states.drain_dirty(k_flush_batch, [&](std::size_t domain, std::string_view identifier, const rules::state& st,
                                        const rules::limits& l) {
    const auto& d = ingest_.domains()[domain];
    const std::int64_t ttl_ms = (rules::expires_at_us(l, st) + limiter::k_late_us - now_us + 999) / 1000;
    if (ttl_ms <= 0) return;  // can no longer matter, even for a late use; Redis lets its copy expire too
    batch.push_back(
        {store_key(d.name, identifier), encode_state(l.algo, st, states.limits(domain).tier_of(&l)), ttl_ms});
  });
  reservation_writes_->drain(batch, cfg_.reservation_timeout);
  for (auto& w : std::exchange(override_writes_, {})) {
    redis_store::write out{std::move(w.key), std::move(w.value)};
    out.erase = w.erase;
    out.keep = !w.erase;
    batch.push_back(std::move(out));
  }
  store_->submit(std::move(batch));
  unwritten_.store(states.dirty(), std::memory_order_relaxed);
}

void service::finish(std::chrono::milliseconds deadline) {
  if (envoy_server_) envoy_server_->shutdown();  // calls under way are answered, open streams ended
  if (!store_) return;
  const auto until = clock_.steady_now() + deadline;
  const limiter& states = ingest_.states();
  while ((states.dirty() > 0 || reservation_writes_->pending() > 0 || !override_writes_.empty()) && store_->up() &&
         clock_.steady_now() < until) {
    if (store_->idle()) pump_store(clock_.steady_now(), true);
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_.steady_now());
  store_->stop(std::max(left, std::chrono::milliseconds(0)));
  if (states.dirty() > 0) log_->warn("shutdown: {} state(s) not written to redis", states.dirty());
}

void service::reconfigure(config::master_config next) {
  if (const std::string waiting = keep_restart_only(cfg_, next); !waiting.empty())
    log_->warn("reload: {} change(s) take effect only after a restart", waiting);
  file_cfg_ = next;
  next = effective(file_cfg_);
  const auto changes = ingest_.reconfigure(next);
  for (const auto& name : changes.removed) accounting_.unsubscribe(topic(name));
  for (const auto& name : changes.added) accounting_.subscribe(topic(name));
  control_->domains_changed(ingest_.domains().size());  // the new rules reach the gatekeepers at once
  // New keys: a rotation's second key, gatekeepers added or removed (those removed are disconnected).
  accounting_.set_curve(next.curve);
  control_->set_curve(next.curve);
  {
    std::lock_guard lock(status_mutex_);
    cfg_ = std::move(next);
  }
  if (envoy_) envoy_->reconfigure(cfg_);
  reloads_.inc();
  log_->info("configuration reloaded: {} domain(s)", ingest_.domains().size());
}

void service::request_reload(std::function<std::optional<config::master_config>()> loader) {
  {
    std::lock_guard lock(status_mutex_);
    reload_loader_ = std::move(loader);
  }
  reload_requested_ = true;
}

std::string service::readiness() const {
  if (!store_) return "ready (store: memory)\n";
  return "ready (store: " + store_->describe() + ")\n";
}

bool service::alive(std::chrono::steady_clock::duration max_stall) const {
  const auto beat = std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(heartbeat_ns_.load(std::memory_order_relaxed)));
  return clock_.steady_now() - beat < max_stall;
}

std::optional<std::string> service::ask(std::shared_ptr<status_query> q, std::chrono::milliseconds timeout) {
  auto answer = q->answer.get_future();
  {
    std::lock_guard lock(queries_mutex_);
    queries_.push_back(std::move(q));
  }
  queries_pending_ = true;
  if (answer.wait_for(timeout) != std::future_status::ready) return std::nullopt;
  return answer.get();
}

std::optional<std::string> service::identifier_status(std::string_view domain, std::string_view identifier,
                                                      std::chrono::milliseconds timeout) {
  auto q = std::make_shared<status_query>();
  q->domain = domain;
  q->identifier = identifier;
  return ask(std::move(q), timeout);
}

std::optional<std::string> service::top(std::string_view domain, std::size_t n, std::chrono::milliseconds timeout) {
  auto q = std::make_shared<status_query>();
  q->domain = domain;
  q->top = true;
  q->n = n;
  return ask(std::move(q), timeout);
}

void service::answer_queries() {
  std::vector<std::shared_ptr<status_query>> batch;
  {
    std::lock_guard lock(queries_mutex_);
    batch.swap(queries_);
  }
  const auto now = clock_.wall_us();
  for (const auto& q : batch) {
    if (q->job) {
      q->answer.set_value(q->job());
      continue;
    }
    if (q->top) {
      q->answer.set_value(master::top_json(ingest_, q->domain, q->n, now));
      continue;
    }
    const auto d = ingest_.find(q->domain);
    if (!d) {
      q->answer.set_value(std::string());  // no such domain
      continue;
    }
    const auto& dom = ingest_.domains()[*d];
    const auto& limits = ingest_.states().limits(*d);
    // The rules it is judged by now: its tier's when its last use named one.
    const rules::limits& current = ingest_.states().current_limits(*d, q->identifier);
    master::identifier_extras extras;
    extras.tier = limits.tier_of(&current);
    extras.share = ingest_.shared_rates().find(*d, q->identifier, now);
    extras.slots_held = ingest_.lease_book().held_by(dom.name, q->identifier);
    extras.slots_limit = ingest_.lease_book().limit_of(dom.name, q->identifier);
    q->answer.set_value(master::identifier_status_json(dom.name, q->identifier, current,
                                                       limits.overrides.contains(q->identifier),
                                                       ingest_.states().find(*d, q->identifier), now, extras));
  }
}

std::string service::status_json() const {
  std::lock_guard lock(status_mutex_);
  std::optional<store_status> st;
  if (store_) st = store_status{store_->up(), unwritten_.load(std::memory_order_relaxed) + store_->queued()};
  return master::status_json(cfg_, st, metrics_, rls_port());
}

}  // namespace smockron::master
