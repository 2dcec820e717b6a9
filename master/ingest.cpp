// The master's decisions (see ingest.hpp).
#include "master/ingest.hpp"

#include <algorithm>

namespace smockron::master {
namespace {

std::vector<domain_limits> compile(const config::master_config& cfg) {
  std::vector<domain_limits> out;
  for (const auto& d : cfg.domains) {
    domain_limits& l = out.emplace_back(d.compile(cfg.max_clock_skew));
    for (const auto& o : d.overrides) l.overrides.emplace(o.identifier, d.compile(o, cfg.max_clock_skew));
  }
  return out;
}

std::int64_t ceil_ms(std::int64_t us) { return (us + 999) / 1000; }

}  // namespace

ingest::ingest(const config::master_config& cfg, const clock& clk, metrics::registry& reg)
    : clock_(clk),
      metrics_(reg),
      limiter_(compile(cfg), cfg.max_identifiers),
      unknown_domain_(reg.add_counter("smockron_master_unknown_domain_total",
                                      "Accounting messages for a domain this master does not own")),
      evictions_(reg.add_counter("smockron_master_evictions_total",
                                 "Tracked identifiers evicted (least recently used) at max_identifiers")),
      expirations_(reg.add_counter("smockron_master_expirations_total", "Tracked identifiers expired by the sweep")),
      latency_(reg.add_histogram("smockron_master_processing_seconds",
                                 "Time to decide one accounting message (decode, rules); one message in 16 is sampled",
                                 metrics::exponential_buckets(1e-6, 2, 18))),
      log_(log::get("master")) {
  for (std::size_t i = 0; i < wire::decode_error_count; ++i) {
    decode_errors_[i] =
        &reg.add_counter("smockron_master_decode_errors_total", "Malformed accounting messages by reason",
                         metrics::labels({{"reason", wire::to_string(static_cast<wire::decode_error>(i))}}));
  }
  reg.add_callback("smockron_master_tracked_identifiers", "Tracked (domain, identifier) states", "",
                   [this] { return static_cast<double>(limiter_.tracked()); });
  install(cfg);
}

void ingest::install(const config::master_config& cfg) {
  std::vector<domain> slots;
  index_.clear();
  for (const auto& d : cfg.domains) {
    domain s;
    s.name = d.name;
    s.limits = d.compile(cfg.max_clock_skew);
    for (auto st : {wire::status::accepted, wire::status::delayed, wire::status::rejected}) {
      s.messages[static_cast<int>(st)] = &metrics_.add_counter(
          "smockron_master_accounting_messages_total", "Accounting messages processed by domain and status",
          metrics::labels({{"domain", d.name}, {"status", wire::to_string(st)}}));
    }
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
  limiter_.reconfigure(compile(next), old_index);
  limiter_.set_max_identifiers(next.max_identifiers);
  install(next);
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
                                                std::int64_t now_us) {
  // The latency histogram samples one message in 16: two clock reads per
  // message would cost more than the measurement is worth at 500k msg/s.
  const bool sampled = (++handled_ & 15) == 0;
  const auto started = sampled ? clock_.steady_now() : std::chrono::steady_clock::time_point{};
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
  d.messages[static_cast<int>(msg->state)]->inc();
  rules::event e;
  switch (msg->state) {
    case wire::status::accepted: e = {rules::event_kind::accepted, msg->received_ms * 1000}; break;
    case wire::status::delayed: e = {rules::event_kind::delayed, msg->delayed_ms * 1000}; break;
    case wire::status::rejected: e = {rules::event_kind::rejected, msg->received_ms * 1000}; break;
  }
  const rules::decision dec = limiter_.apply(it->second, msg->identifier, e, now_us);
  d.tracked->set(static_cast<double>(limiter_.tracked(it->second)));
  std::optional<wire::delay_until> out;
  if (dec.throttled && dec.next_us > now_us) {
    out.emplace();
    out->domain = d.name;
    out->identifier = msg->identifier;
    out->next_ms = ceil_ms(dec.next_us);
    out->interval_ms = std::max<std::int64_t>(1, (dec.interval_us + 500) / 1000);
  }
  if (sampled) latency_.observe(std::chrono::duration<double>(clock_.steady_now() - started).count());
  return out;
}

void ingest::sweep(std::int64_t now_us) {
  // Small slices often: a long sweep would stall the loop and show in the
  // control-loop p99 (1,000 entries every 10 ms = 100k entries/s examined).
  expirations_.inc(limiter_.sweep(now_us, k_sweep_batch));
  evictions_.inc(limiter_.evictions() - reported_evictions_);
  reported_evictions_ = limiter_.evictions();
  for (std::size_t i = 0; i < domains_.size(); ++i) domains_[i].tracked->set(static_cast<double>(limiter_.tracked(i)));
}

}  // namespace smockron::master
