// The master's decisions (see ingest.hpp).
#include "master/engine/ingest.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace smockron::master {
namespace {

std::vector<domain_limits> compile_all(const config::master_config& cfg) {
  std::vector<domain_limits> out;
  for (const auto& d : cfg.domains) {
    domain_limits& l = out.emplace_back(compile(d, cfg.max_clock_skew));
    for (const auto& o : d.overrides) l.overrides.emplace(o.identifier, compile(d, o, cfg.max_clock_skew));
    for (const auto& t : d.tiers) l.tiers.emplace_back(t.name, compile(d, t, cfg.max_clock_skew));  // sorted
  }
  return out;
}

std::int64_t ceil_ms(std::int64_t us) { return (us + 999) / 1000; }

// Each domain's shared rate, as the shares book takes it (none: nullopt).
std::vector<std::optional<shares::pool_config>> share_configs(const config::master_config& cfg) {
  std::vector<std::optional<shares::pool_config>> out;
  for (const auto& d : cfg.domains) {
    if (d.shared_rate)
      out.push_back(shares::pool_config{d.shared_rate->r.interval_us(), d.shared_rate->burst, d.share_window.count()});
    else out.emplace_back();
  }
  return out;
}

// A state's cost beside its history: hash node, key, LRU and dirty links (get_size's estimate).
constexpr std::uint64_t k_state_overhead = 160;

}  // namespace

ingest::ingest(const config::master_config& cfg, const clock& clk, metrics::registry& reg)
    : clock_(clk),
      metrics_(reg),
      limiter_(compile_all(cfg), cfg.max_identifiers),
      top_(cfg.domains.size(), cfg.top_identifiers),
      unknown_domain_(reg.add_counter("smockron_master_unknown_domain_total",
                                      "Accounting messages for a domain this master does not own")),
      query_unknown_domain_(reg.add_counter("smockron_master_query_ignored_total",
                                            "Query datagrams not answered, by reason",
                                            metrics::labels({{"reason", "unknown_domain"}}))),
      evictions_(reg.add_counter("smockron_master_evictions_total",
                                 "Tracked identifiers evicted (least recently used) at max_identifiers")),
      expirations_(reg.add_counter("smockron_master_expirations_total", "Tracked identifiers expired by the sweep")),
      latency_(reg.add_histogram("smockron_master_processing_seconds",
                                 "Time to decide one accounting message (decode, rules); one message in 16 is sampled",
                                 metrics::exponential_buckets(1e-6, 2, 18))),
      reservations_(cfg.max_identifiers),
      reservation_timeout_(cfg.reservation_timeout),
      reservations_opened_(reg.add_counter("smockron_master_reservations_total",
                                           "Uses reported at an estimate (reserve=), held open until corrected")),
      reservations_untracked_(reg.add_counter(
          "smockron_master_reservations_untracked_total",
          "Reservations not held open (max_identifiers already were): charged, never given back on a departure")),
      released_gone_(reg.add_counter("smockron_master_reservations_released_total",
                                     "Open reservations given back, by reason",
                                     metrics::labels({{"reason", "gatekeeper_gone"}}))),
      released_timeout_(reg.add_counter("smockron_master_reservations_released_total",
                                        "Open reservations given back, by reason",
                                        metrics::labels({{"reason", "timeout"}}))),
      late_corrections_(reg.add_counter(
          "smockron_master_reservations_late_corrections_total",
          "Corrections that found their reservation's charge gone (given back, or its GCRA state swept or evicted): "
          "the estimate was charged again")),
      leases_(cfg.max_identifiers),
      shares_(cfg.max_identifiers),
      lease_messages_(reg.add_counter("smockron_master_lease_messages_total",
                                      "LEASE messages applied (concurrency slots wanted or given back)")),
      leases_untracked_(reg.add_counter(
          "smockron_master_leases_untracked_total",
          "LEASE messages not kept (max_identifiers identifiers held leases already): granted, not counted")),
      lease_slots_released_(reg.add_counter("smockron_master_lease_slots_released_total",
                                            "Concurrency slots freed because their gatekeeper's connection closed")),
      asks_(cfg.max_identifiers),
      asks_untracked_(reg.add_counter("smockron_master_asks_untracked_total",
                                      "ASKs answered GO without being held open (max_identifiers identifiers had "
                                      "GOs open already): not counted against later ASKs")),
      asks_settled_(
          reg.add_counter("smockron_master_asks_settled_total", "GOs settled by their request's accounting message")),
      asks_dropped_gone_(reg.add_counter("smockron_master_asks_dropped_total",
                                         "GOs dropped before their accounting came, by reason",
                                         metrics::labels({{"reason", "gatekeeper_gone"}}))),
      asks_dropped_timeout_(reg.add_counter("smockron_master_asks_dropped_total",
                                            "GOs dropped before their accounting came, by reason",
                                            metrics::labels({{"reason", "timeout"}}))),
      next_tag_((std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()),
      log_(log::get("master")) {
  reg.add_callback("smockron_master_lease_slots_held", "Concurrency slots leased to gatekeepers now", "",
                   [this] { return static_cast<double>(leases_.held()); });
  reg.add_callback("smockron_master_lease_identifiers", "Identifiers with concurrency slots leased or wanted", "",
                   [this] { return static_cast<double>(leases_.size()); });
  for (const auto& [v, name] : {std::pair{wire::verdict_kind::go, "go"}, std::pair{wire::verdict_kind::wait, "wait"},
                                std::pair{wire::verdict_kind::never, "never"}}) {
    asks_answered_[static_cast<int>(v)] =
        &reg.add_counter("smockron_master_asks_total", "ASKs answered (exact admission), by verdict",
                         metrics::labels({{"verdict", name}}));
  }
  reg.add_callback("smockron_master_asks_open_units", "Units said GO to and not yet accounted (exact admission)", "",
                   [this] { return static_cast<double>(asks_.units()); });
  reg.add_callback("smockron_master_paced_identifiers",
                   "Held identifiers whose gatekeepers are counted for their pace share (at most 65,536: beyond, a "
                   "new one's gatekeepers pace at its rule's interval)",
                   "", [this] { return static_cast<double>(pacers_.clients()); });
  reg.add_callback("smockron_master_shared_identifiers", "Identifiers with a share of a domain's shared rate", "",
                   [this] { return static_cast<double>(shares_.size()); });
  reg.add_counter_callback("smockron_master_shared_untracked_total",
                           "Uses of a shared-rate domain not given a share (max_identifiers already have one): "
                           "only their own rules applied",
                           [this] { return static_cast<double>(shares_.untracked()); });
  shares_.configure(share_configs(cfg), std::vector<std::optional<std::size_t>>(cfg.domains.size()));
  reg.add_callback("smockron_master_reservations_open", "Reservations held open (not corrected yet)", "",
                   [this] { return static_cast<double>(reservations_.size()); });
  for (std::size_t i = 0; i < wire::decode_error_count; ++i) {
    decode_errors_[i] =
        &reg.add_counter("smockron_master_decode_errors_total", "Malformed accounting messages by reason",
                         metrics::labels({{"reason", wire::to_string(static_cast<wire::decode_error>(i))}}));
  }
  for (const auto& [cmd, name] :
       {std::pair{query::command::over_limit, "over_limit"}, std::pair{query::command::get_stats, "get_stats"},
        std::pair{query::command::get_size, "get_size"}}) {
    queries_[cmd] = &reg.add_counter("smockron_master_queries_total", "Query protocol requests answered, by command",
                                     metrics::labels({{"command", name}}));
  }
  reg.add_callback("smockron_master_tracked_identifiers", "Tracked (domain, identifier) states", "",
                   [this] { return static_cast<double>(limiter_.tracked()); });
  pace_share_ = cfg.pace_share;
  install(cfg);
}

void ingest::install(const config::master_config& cfg) {
  std::vector<domain> slots;
  index_.clear();
  for (const auto& d : cfg.domains) {
    domain s;
    s.name = d.name;
    s.exact = d.exact;
    s.limits = compile(d, cfg.max_clock_skew);
    for (auto st : {wire::status::accepted, wire::status::delayed, wire::status::rejected}) {
      s.messages[st] = &metrics_.add_counter("smockron_master_accounting_messages_total",
                                             "Accounting messages processed by domain and status",
                                             metrics::labels({{"domain", d.name}, {"status", wire::to_string(st)}}));
    }
    s.units = &metrics_.add_counter("smockron_master_units_total",
                                    "Cost units charged by domain (ACCEPTED and DELAYED; a request costs 1 unless "
                                    "its message carries a cost; adjustments up)",
                                    metrics::labels({{"domain", d.name}}));
    s.refunded =
        &metrics_.add_counter("smockron_master_units_refunded_total",
                              "Cost units given back by domain (reservations corrected down, or given back when "
                              "their gatekeeper left or they timed out)",
                              metrics::labels({{"domain", d.name}}));
    s.adjustments = &metrics_.add_counter("smockron_master_adjustments_total",
                                          "Corrections of reported costs by domain (REJECTED messages with adjust=)",
                                          metrics::labels({{"domain", d.name}}));
    s.tracked = &metrics_.add_gauge("smockron_master_domain_tracked_identifiers", "Tracked identifiers per domain",
                                    metrics::labels({{"domain", d.name}}));
    index_.emplace(d.name, slots.size());
    slots.push_back(std::move(s));
  }
  domains_ = std::move(slots);
}

std::optional<std::size_t> ingest::find(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

ingest::domain_changes ingest::reconfigure(const config::master_config& next) {
  domain_changes changes;
  std::vector<std::optional<std::size_t>> old_index;
  for (const auto& d : next.domains) {
    const auto old = find(d.name);
    old_index.push_back(old);
    if (!old) changes.added.push_back(d.name);
  }
  for (const auto& d : domains_) {
    if (next.find_domain(d.name)) continue;
    d.tracked->set(0);
    changes.removed.push_back(d.name);
  }
  limiter_.reconfigure(compile_all(next), old_index);
  shares_.configure(share_configs(next), old_index);
  pacers_ = {};  // keyed by domain index: counted afresh (within a second)
  pace_share_ = next.pace_share;
  limiter_.set_max_identifiers(next.max_identifiers);
  reservations_.set_max_open(next.max_identifiers);
  reservation_timeout_ = next.reservation_timeout;
  leases_.set_max_entries(next.max_identifiers);
  asks_.set_max_entries(next.max_identifiers);
  top_ = top_limited(next.domains.size(), next.top_identifiers);
  install(next);
  // Leases of a domain gone keep their slots until their holders give them
  // back (they stop asking once the domain's CONCURRENCY is not refreshed).
  leases_.relimit(
      [&](std::string_view d, std::string_view id, std::string_view tier) {
        const auto i = find(d);
        if (!i) return leases::limits{};
        const rules::limits& l = limiter_.limits_of(*i, id, tier);
        return leases::limits{l.concurrency, l.shared_concurrency, l.weight};
      },
      clock_.wall_us());
  return changes;
}

void ingest::log_bad(std::string_view what, std::string_view detail) {
  std::uint64_t suppressed = 0;
  if (bad_input_log_.allow(clock_.steady_now(), suppressed)) {
    if (suppressed > 0) log_->warn("{}: {} ({} similar messages suppressed)", what, detail, suppressed);
    else log_->warn("{}: {}", what, detail);
  }
}

std::optional<wire::delay_until> ingest::handle(std::span<const std::string_view> frames, bool truncated,
                                                std::int64_t now_us, std::uint64_t peer, std::uint64_t gatekeeper) {
  // The latency histogram samples one message in 16: two clock reads per
  // message would cost more than the measurement is worth at 500k msg/s.
  const bool sampled = (++handled_ & 15) == 0;
  const auto started = sampled ? clock_.steady_now() : std::chrono::steady_clock::time_point{};
  if (!truncated && frames.size() >= 2 && frames[1] == wire::lease_status) {
    handle_lease(frames, now_us, peer);
    return std::nullopt;
  }
  if (!truncated && frames.size() >= 2 && frames[1] == wire::ask_status) return handle_ask(frames, now_us, peer);
  auto msg =
      truncated ? wire::result<wire::accounting>(wire::decode_error::frame_count) : wire::decode_accounting(frames);
  if (!msg) {
    decode_errors_[static_cast<int>(msg.error())]->inc();
    log_bad("malformed accounting message", wire::to_string(msg.error()));
    return std::nullopt;
  }
  const auto it = index_.find(msg->domain);
  if (it == index_.end()) {
    unknown_domain_.inc();
    log_bad("accounting message for unknown domain", msg->domain);
    return std::nullopt;
  }
  domain& d = domains_[it->second];
  rules::event e;
  switch (msg->state) {
    case wire::status::accepted: e = {rules::event_kind::accepted, msg->received_ms * 1000, msg->cost}; break;
    case wire::status::delayed: e = {rules::event_kind::delayed, msg->delayed_ms * 1000, msg->cost}; break;
    case wire::status::rejected: e = {rules::event_kind::rejected, msg->received_ms * 1000, 0}; break;
  }
  if (msg->adjust) {
    // A correction of a reservation, not a refusal: never counted as one.
    // The difference is charged whether the reservation is still open or not
    // (one never tracked, the book being full, kept its estimate); one given
    // back already is charged its estimate again (docs/cost.md).
    std::int64_t delta = *msg->adjust;
    std::int64_t recharged = 0;  // charged, not counted: the units metric had it when it was reserved
    if (const auto closed = reservations_.close(peer, d.name, msg->identifier, msg->received_ms)) {
      if (reservation_log_) reservation_log_->closed(*closed);
      const auto gcra = [&] {
        const rules::limits& l = limiter_.limits_of(it->second, msg->identifier);
        return l.algo == rules::algorithm::gcra && !l.rules.empty();
      };
      if (!limiter_.find(it->second, msg->identifier) && gcra()) {
        // Its state is gone (swept while the response went on, evicted at
        // max_identifiers, not read back after a restart), and with it the
        // debt the estimate left: charged again from the use's time, under
        // the difference (not counted again, not given to a share, which
        // keeps its own). A sliding log swept has had every unit leave its
        // windows, the estimate's too: nothing of it is owed.
        recharged = closed->units;
        late_corrections_.inc();
      }
    } else if (const auto released = reservations_.take_released(d.name, msg->identifier, msg->received_ms)) {
      // Given back before its correction came (its connection dropped, or
      // the timeout): the estimate is charged again with the difference.
      delta += *released;
      late_corrections_.inc();
    }
    e = {rules::event_kind::adjust, msg->received_ms * 1000, delta + recharged};
    d.adjustments->inc();
    if (delta == 0 && recharged == 0) return std::nullopt;  // closed as reserved: nothing changes
    if (delta != 0) (delta > 0 ? d.units : d.refunded)->inc(static_cast<std::uint64_t>(delta > 0 ? delta : -delta));
  } else {
    // Exact admission: a request that went settles the GO it was given, and
    // is charged no earlier than that GO (a gatekeeper clock behind ours).
    if (msg->ask >= 0 && d.exact) {
      if (const auto since = asks_.settle(peer, d.name, msg->identifier, msg->ask)) {
        asks_settled_.inc();
        e.at_us = std::max(e.at_us, *since);
      }
    }
    d.messages[msg->state]->inc();
    if (e.kind != rules::event_kind::rejected) d.units->inc(static_cast<std::uint64_t>(msg->cost));
    if (msg->reserve) {
      reservations_opened_.inc();
      const std::int64_t at_ms = msg->state == wire::status::delayed ? msg->delayed_ms : msg->received_ms;
      const auto* held =
          reservations_.open({peer, d.name, std::string(msg->identifier), at_ms, msg->cost, now_us, next_tag_++});
      if (!held) reservations_untracked_.inc();
      else if (reservation_log_) reservation_log_->opened(*held);
    }
  }
  rules::decision dec = limiter_.apply(it->second, msg->identifier, e, now_us, msg->tier);
  if (shares_.any(it->second)) {
    // A share keeps its own count, which nothing gave back or lost: a
    // correction reaches it as reported.
    rules::event used = e;
    if (msg->adjust) used.cost = *msg->adjust;
    dec = share(it->second, msg->identifier, used, dec, now_us);
  }
  d.tracked->set(static_cast<double>(limiter_.tracked(it->second)));
  // Who is limited now (GET /top): held or refused at a gatekeeper, or told to wait.
  if ((msg->state != wire::status::accepted && !msg->adjust) || (dec.throttled && dec.next_us > now_us)) {
    top_.limited(it->second, msg->identifier, now_us);
  }
  std::optional<wire::delay_until> out;
  if (dec.throttled && dec.next_us > now_us) {
    out.emplace();
    out->domain = d.name;
    out->identifier = msg->identifier;
    out->next_ms = ceil_ms(dec.next_us);
    // Each of the gatekeepers holding the client paces its share
    // (pace_share.hpp), counted by its reservations and uses: refusals
    // follow demand, not pacing, and a correction is not a request. A
    // connection that names no gatekeeper (a proxy from before pace share,
    // one connection per worker; a third-party gatekeeper) is not counted:
    // at worst, the pace is the rule's, as before. Nor is a time an exactly
    // logged rule set (pace_shareable()).
    const bool paces = gatekeeper != 0 && msg->state != wire::status::rejected && !msg->adjust;
    // (An empty table: count() would find nothing; no lookup.)
    const bool shared =
        pace_share_ && (paces || pacers_.clients() > 0) && pace_shareable(it->second, msg->identifier, dec);
    const double pacers = !shared ? 1.0
                          : paces ? pacers_.seen(it->second, msg->identifier, gatekeeper, now_us)
                                  : pacers_.count(it->second, msg->identifier, now_us);
    out->interval_ms = std::max<std::int64_t>(1, std::llround(static_cast<double>(dec.interval_us) * pacers / 1000));
    out->limit = limit_named(it->second, msg->identifier, dec);
  }
  if (sampled) latency_.observe(std::chrono::duration<double>(clock_.steady_now() - started).count());
  return out;
}

ingest::query_result ingest::answer(const query::request& r, std::int64_t now_us, std::string& out) {
  query_result result;
  if (r.cmd == query::command::get_size) {
    // Approximate bytes held: each state's node, key and history.
    std::uint64_t bytes = 0;
    for (std::size_t d = 0; d < domains_.size(); ++d) {
      const auto& l = limiter_.limits(d).base;
      const std::size_t times = l.algo == rules::algorithm::gcra ? l.rules.size() : l.history_cap();
      bytes += limiter_.tracked(d) * (k_state_overhead + times * sizeof(std::int64_t));
    }
    query::append_size(out, r.id, bytes, limiter_.tracked());
    queries_[r.cmd]->inc();
    result.answered = true;
    return result;
  }
  const auto it = index_.find(r.domain);
  if (it == index_.end()) {
    query_unknown_domain_.inc();
    return result;
  }
  const std::size_t d = it->second;
  queries_[r.cmd]->inc();
  result.answered = true;
  if (r.cmd == query::command::get_stats) {
    const auto st = limiter_.find_stats(d, r.identifier);
    query::append(out, r.id, query::stats_answer{st.n_req, st.n_over, st.max_rate}, r.domain, r.identifier);
    return result;
  }
  const auto use = limiter_.use(d, r.identifier, now_us);
  domains_[d].tracked->set(static_cast<double>(limiter_.tracked(d)));
  // Rate, limit and period of the binding rule: the one most used now.
  query::over_limit_answer a;
  a.over = use.over;
  const rules::limits& l = *use.lim;
  double most = -1;
  for (std::size_t i = 0; i < l.rules.size(); ++i) {
    const double used = rules::window_uses(l, *use.st, i, now_us);
    const double share = used / static_cast<double>(l.rules[i].burst);
    if (share <= most) continue;
    most = share;
    a.rate = used;
    a.limit = static_cast<double>(l.rules[i].burst);
    a.period_s = std::max<std::int64_t>(1, (l.rules[i].window_us() + 999'999) / 1'000'000);
  }
  auto& max_rate = use.counts->max_rate;
  max_rate = std::max(max_rate, static_cast<std::uint32_t>(std::min(a.rate, 4e9)));
  query::append(out, r.id, a);
  if (!use.over && use.after.throttled && use.after.next_us > now_us) {
    result.publish.emplace();
    result.publish->domain = domains_[d].name;
    result.publish->identifier = r.identifier;
    result.publish->next_ms = ceil_ms(use.after.next_us);
    result.publish->interval_ms = std::max<std::int64_t>(1, (use.after.interval_us + 500) / 1000);
  }
  return result;
}

std::size_t ingest::peer_closed(std::uint64_t peer, std::int64_t now_us, std::uint64_t gatekeeper_gone) {
  if (gatekeeper_gone != 0 && pacers_.clients() > 0) pacers_.forget(gatekeeper_gone);
  const auto gone = reservations_.take_peer(peer);
  release(gone, released_gone_, now_us);
  lease_slots_released_.inc(static_cast<std::uint64_t>(leases_.peer_closed(peer, now_us)));
  asks_dropped_gone_.inc(asks_.peer_closed(peer));
  return gone.size();
}

bool ingest::restore_reservation(reservations::reservation r) {
  const bool tracked = reservations_.restore(r);
  if (!tracked && reservation_log_) reservation_log_->closed(r);  // never to be closed: the store forgets it
  return tracked;
}

void ingest::release(const std::vector<reservations::reservation>& gone, metrics::counter& why, std::int64_t now_us) {
  for (const auto& r : gone) {
    why.inc();
    if (reservation_log_) reservation_log_->closed(r);
    reservations_.remember_released(r);
    const auto i = find(r.domain);
    if (!i) continue;  // the domain was removed by a reload
    domains_[*i].refunded->inc(static_cast<std::uint64_t>(r.units));
    limiter_.apply(*i, r.identifier, {rules::event_kind::adjust, r.at_ms * 1000, -r.units}, now_us);
  }
}

bool ingest::pace_shareable(std::size_t domain, std::string_view identifier, const rules::decision& dec) const {
  // A time with an arrival time behind it (GCRA, a counted rule's) can be
  // shared: the gate keeps a share's slot no later than that arrival time
  // as last told (proxy/gate/plan.cpp), so a slot the other gatekeepers
  // leave free is used late, not lost. An exactly logged rule's next
  // allowed time is one interval after its last use and never goes back to
  // a gap before it: a share there loses every slot no other gatekeeper
  // fills in time (two gatekeepers with three closed-loop connections each
  // got 0.75 of the rate in half the runs; docs/benchmarks.md, "Pace
  // share").
  if (dec.by != rules::limit_kind::rule) return true;
  const domain_limits& all = limiter_.limits(domain);
  if (all.base.algo == rules::algorithm::gcra) return true;  // (overrides and tiers: the domain's algorithm)
  const rules::limits& l =
      all.overrides.empty() && all.tiers.empty() ? all.base : limiter_.current_limits(domain, identifier);
  return dec.index < l.rules.size() && l.counted(l.rules[dec.index]);
}

wire::limit_ref ingest::limit_named(std::size_t domain, std::string_view identifier, const rules::decision& dec) const {
  // As gatekeepers know the client's limits: its POLICY rules (those within
  // the wire's bounds, the shared rate last) and the domain's quotas.
  const auto fits = [](const rules::rule& r) { return wire::policy_fits(r.interval_us, r.burst); };
  const auto shown_of = [&](const rules::limits& l) {
    return static_cast<std::size_t>(std::count_if(l.rules.begin(), l.rules.end(), fits)) +
           (l.shared_rate.interval_us > 0 ? 1 : 0) + l.quotas.size();
  };
  wire::limit_ref out;
  // The common case without a lookup: one limit for everyone in the domain.
  const domain_limits& all = limiter_.limits(domain);
  if (dec.by != rules::limit_kind::share && all.overrides.empty() && all.tiers.empty() && shown_of(all.base) < 2)
    return out;
  const rules::limits& l = limiter_.current_limits(domain, identifier);
  const std::size_t shown = shown_of(l);
  switch (dec.by) {
    case rules::limit_kind::none: break;
    case rules::limit_kind::rule:
      // One limit only: a refusal names it without being told.
      if (shown < 2 || dec.index >= l.rules.size() || !fits(l.rules[dec.index])) break;
      out.by = wire::limit_ref::kind::rule;
      out.index = static_cast<std::uint8_t>(
          std::count_if(l.rules.begin(), l.rules.begin() + static_cast<std::ptrdiff_t>(dec.index), fits));
      break;
    case rules::limit_kind::quota:
      // Only the domain's own quotas are published (QUOTA): an override's or a tier's has no place to name.
      if (shown < 2 || &l != &all.base) break;
      out.by = wire::limit_ref::kind::quota;
      out.index = dec.index;
      break;
    case rules::limit_kind::share:
      out.by = wire::limit_ref::kind::share;
      out.share_interval_us = dec.interval_us;
      out.share_burst = dec.burst;
      break;
  }
  return out;
}

rules::decision ingest::share(std::size_t domain, std::string_view identifier, const rules::event& e,
                              rules::decision dec, std::int64_t now_us) {
  // A use, or an adjustment up (the real cost above the estimate); what is
  // given back is not (a share follows what was used). A refusal says the
  // client wanted more.
  if (e.kind == rules::event_kind::rejected) shares_.refused(domain, identifier, e.at_us);
  if (e.kind == rules::event_kind::rejected || e.cost <= 0) return dec;
  const rules::decision s =
      shares_.use(domain, identifier, e.cost, e.at_us, now_us, e.kind == rules::event_kind::delayed,
                  limiter_.current_limits(domain, identifier).weight);
  return s.throttled && (!dec.throttled || s.next_us > dec.next_us) ? s : dec;
}

void ingest::sweep(std::int64_t now_us, std::size_t budget) {
  // Shares follow demand once a second.
  if (now_us - rebalanced_us_ >= 1'000'000) {
    shares_.rebalance(now_us);
    pacers_.sweep(now_us);
    rebalanced_us_ = now_us;
  }
  release(reservations_.take_older(now_us - reservation_timeout_.count(), budget), released_timeout_, now_us);
  if (now_us - asks_expired_us_ >= 1'000'000) {
    asks_dropped_timeout_.inc(asks_.expire(now_us));
    asks_expired_us_ = now_us;
  }
  // Small slices often: a long sweep would stall the loop and show in the
  // control-loop p99 (1,000 entries every 10 ms = 100k entries/s examined).
  expirations_.inc(limiter_.sweep(now_us, budget));
  evictions_.inc(limiter_.evictions() - reported_evictions_);
  reported_evictions_ = limiter_.evictions();
  for (std::size_t i = 0; i < domains_.size(); ++i) domains_[i].tracked->set(static_cast<double>(limiter_.tracked(i)));
}

}  // namespace smockron::master
