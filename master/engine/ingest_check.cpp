// A request an external data plane asks about (see ingest.hpp, check()).
#include <algorithm>
#include <cmath>

#include "master/engine/ingest.hpp"

namespace smockron::master {
namespace {

std::int64_t ceil_s(std::int64_t us) { return (us + 999'999) / 1'000'000; }

// Each rule's and quota's units left at `now_us`, and when it is whole again.
void fill_standing(const rules::limits& l, const rules::state& st, std::int64_t now_us, ingest::check_result& out) {
  quota_state& q = out.standing;
  q.count = 0;
  for (std::size_t i = 0; i < l.rules.size() && q.count < q.items.size(); ++i) {
    const auto& r = l.rules[i];
    const double used = std::max(0.0, rules::window_uses(l, st, i, now_us));
    auto& it = q.items[q.count++];
    it.quota = r.burst;
    it.window_s = std::max<std::int64_t>(1, ceil_s(r.window_us()));
    it.remaining =
        std::max<std::int64_t>(0, static_cast<std::int64_t>(std::floor(static_cast<double>(r.burst) - used)));
    it.reset_s = ceil_s(static_cast<std::int64_t>(std::ceil(used)) * r.interval_us);
  }
  for (std::size_t i = 0; i < l.quotas.size() && q.count < q.items.size(); ++i) {
    const auto& qu = l.quotas[i];
    const std::int64_t start = rules::window_start_us(qu, now_us);
    const std::int64_t end = rules::window_end_us(qu, now_us);
    auto& it = q.items[q.count++];
    it.quota = qu.limit;
    it.window_s = std::max<std::int64_t>(1, ceil_s(end - start));
    it.remaining = std::max<std::int64_t>(0, qu.limit - rules::quota_used(l, st, i, now_us));
    it.reset_s = std::max<std::int64_t>(1, ceil_s(end - now_us));
  }
  out.binding = 0;
  for (std::size_t i = 1; i < q.count; ++i) {
    if (q.items[i].remaining < q.items[out.binding].remaining) out.binding = i;
  }
}

}  // namespace

ingest::check_result ingest::check(std::size_t d, std::string_view identifier, std::int64_t cost, std::int64_t now_us,
                                   limiter::charge_mode mode) {
  check_result out;
  const bool probe = mode == limiter::charge_mode::probe;
  const auto use = limiter_.charge(d, identifier, cost, now_us, mode);
  out.fits = use.fits;
  out.never = use.never;
  rules::decision after = use.after;
  if (!probe) {
    domains_[d].tracked->set(static_cast<double>(limiter_.tracked(d)));
    if ((use.fits || mode == limiter::charge_mode::force) && cost > 0) {
      domains_[d].units->inc(static_cast<std::uint64_t>(cost));
      after = share(d, identifier, {rules::event_kind::accepted, now_us, cost}, after, now_us);
    }
    if (!use.fits) {
      shares_.refused(d, identifier, now_us);
      top_.limited(d, identifier, now_us);
    }
  }
  static const rules::state no_state;
  const rules::state& st = use.st ? *use.st : no_state;
  const rules::limits& l = use.lim ? *use.lim : limiter_.limits_of(d, identifier);
  if (!use.fits && !use.never) out.retry_us = rules::fits_at(l, st, cost, now_us);
  if (after.throttled && after.next_us > now_us) out.throttled_until_us = after.next_us;
  fill_standing(l, st, now_us, out);
  // The gatekeepers hold the identifier too (one budget, whoever asks): told
  // when a use throttles it (a refusal changes nothing they were told).
  if (!probe && out.throttled_until_us > 0 && (use.fits || mode == limiter::charge_mode::force) && cost > 0) {
    out.publish.emplace();
    out.publish->domain = domains_[d].name;
    out.publish->identifier = identifier;
    out.publish->next_ms = (after.next_us + 999) / 1000;
    out.publish->interval_ms = std::max<std::int64_t>(1, (after.interval_us + 500) / 1000);
    out.publish->limit = limit_named(d, identifier, after);
  }
  return out;
}

}  // namespace smockron::master
