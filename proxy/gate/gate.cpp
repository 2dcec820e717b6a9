// Control memory and per-request decisions (see gate.hpp).
#include "proxy/gate/gate.hpp"

#include <algorithm>
#include <functional>
#include <utility>

namespace smockron::proxy {

std::size_t gate::key_hash::operator()(const key_view& k) const {
  return std::hash<std::string_view>{}(k.id) ^ (static_cast<std::size_t>(k.domain) * 0x9E3779B97F4A7C15ULL);
}

gate::gate(std::size_t max_entries, double horizon)
    : max_per_shard_(std::max<std::size_t>(1, max_entries / k_shards)),
      horizon_cut_(std::clamp(horizon, 0.0, 1.0) * k_horizon_spread) {}

gate::shard& gate::shard_for(const key_view& k) { return shards_[(key_hash{}(k) >> 7) % k_shards]; }

bool gate::set_policy(std::uint32_t domain, std::span<const guard_rule> rules, std::int64_t now_us) {
  if (domain >= k_policy_domains) return false;
  policy_slot& p = policies_[domain];
  const std::size_t n = std::min(rules.size(), k_guard_rules);
  bool same = p.count.load(std::memory_order_relaxed) == n;
  for (std::size_t i = 0; same && i < n; ++i) {
    same = p.interval[i].load(std::memory_order_relaxed) == rules[i].interval_us &&
           p.burst[i].load(std::memory_order_relaxed) == rules[i].burst;
  }
  if (!same) {
    // Odd while writing: a reader that sees it, or sees it change, reads again.
    p.seq.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    for (std::size_t i = 0; i < n; ++i) {
      p.interval[i].store(rules[i].interval_us, std::memory_order_relaxed);
      p.burst[i].store(rules[i].burst, std::memory_order_relaxed);
    }
    p.count.store(n, std::memory_order_relaxed);
    p.seq.fetch_add(1, std::memory_order_release);
  }
  p.updated_us.store(now_us, std::memory_order_relaxed);
  return true;
}

bool gate::set_quotas(std::uint32_t domain, std::span<const wire::quota_policy::item> quotas, std::int64_t now_us) {
  if (domain >= k_policy_domains) return false;
  std::lock_guard lock(quotas_mutex_);
  quota_slot& q = quotas_[domain];
  q.count = std::min(quotas.size(), q.items.size());
  std::copy_n(quotas.begin(), q.count, q.items.begin());
  q.updated_us = now_us;
  any_quotas_.store(true, std::memory_order_relaxed);
  return true;
}

bool gate::assign(policy& p, std::span<const guard_rule> rules) {
  const std::size_t n = std::min(rules.size(), k_guard_rules);
  bool same = p.seq != 0 && p.count == n;
  for (std::size_t i = 0; same && i < n; ++i) {
    same = p.rules[i].interval_us == rules[i].interval_us && p.rules[i].burst == rules[i].burst;
  }
  if (same) return false;
  std::copy_n(rules.begin(), n, p.rules.begin());
  p.count = n;
  p.seq = override_seq_ += 2;
  return true;
}

bool gate::set_override(std::uint32_t domain, std::string_view identifier, std::span<const guard_rule> rules,
                        std::int64_t now_us) {
  if (domain >= k_policy_domains) return false;
  const key_view k{domain, identifier};
  shard& s = shard_for(k);
  {
    std::lock_guard lock(s.mutex);
    auto it = s.overrides.find(k);
    if (it == s.overrides.end()) {
      if (override_count_.load(std::memory_order_relaxed) >= k_max_overrides) return false;
      it = s.overrides.emplace(key{domain, std::string(identifier)}, override_policy{}).first;
      override_count_.fetch_add(1, std::memory_order_relaxed);
    }
    if (assign(it->second.rules, rules)) {
      // Changed rules: the client's guard state starts afresh, and so does
      // what the master said of it under the old ones (it started the client
      // afresh too: an override set at run time).
      entries_.fetch_sub(s.map.erase(key{domain, std::string(identifier)}), std::memory_order_relaxed);
    }
    it->second.updated_us = now_us;
  }
  policies_[domain].override_updated_us.store(now_us, std::memory_order_relaxed);
  return true;
}

bool gate::set_tier(std::uint32_t domain, std::string_view tier, std::span<const guard_rule> rules,
                    std::int64_t now_us) {
  if (domain >= k_policy_domains) return false;
  std::unique_lock lock(tiers_mutex_);
  auto it = tiers_.find(key_view{domain, tier});
  if (it == tiers_.end()) {
    if (tiers_.size() >= k_max_tiers) return false;
    it = tiers_.emplace(key{domain, std::string(tier)}, tier_slot{}).first;
  }
  assign(it->second.rules, rules);  // changed: its clients' guard state starts afresh (a new seq)
  it->second.updated_us = now_us;
  any_tiers_.store(true, std::memory_order_relaxed);
  return true;
}

std::size_t gate::tiers() const {
  std::shared_lock lock(tiers_mutex_);
  return tiers_.size();
}

gate::policy gate::read_policy(std::uint32_t domain, std::int64_t now_us, std::string_view tier, bool& tiered) const {
  tiered = false;
  if (!tier.empty() && any_tiers_.load(std::memory_order_relaxed)) {
    std::shared_lock lock(tiers_mutex_);
    const auto it = tiers_.find(key_view{domain, tier});
    if (it != tiers_.end() && now_us - it->second.updated_us <= wire::policy_fresh_ms * 1000) {
      tiered = true;
      return it->second.rules;
    }
  }
  return read_policy(domain, now_us);
}

gate::policy gate::policy_for(const shard& s, const key_view& k, const policy& domain_policy,
                              std::int64_t now_us) const {
  if (k.domain >= k_policy_domains) return domain_policy;
  const std::int64_t fresh_us = wire::policy_fresh_ms * 1000;
  // Most domains have no overrides: one relaxed load, no lookup.
  const std::int64_t any = policies_[k.domain].override_updated_us.load(std::memory_order_relaxed);
  if (any == 0 || now_us - any > fresh_us) return domain_policy;
  const auto it = s.overrides.find(k);
  if (it == s.overrides.end() || now_us - it->second.updated_us > fresh_us) return domain_policy;
  return it->second.rules;
}

bool gate::covered(std::uint32_t domain, std::int64_t now_us) const {
  if (domain >= k_policy_domains) return false;
  const std::int64_t updated = policies_[domain].updated_us.load(std::memory_order_relaxed);
  return updated != 0 && now_us - updated <= wire::policy_fresh_ms * 1000;
}

gate::policy gate::read_policy(std::uint32_t domain, std::int64_t now_us) const {
  policy out;
  if (!covered(domain, now_us)) return out;
  const policy_slot& p = policies_[domain];
  while (true) {
    const std::uint32_t before = p.seq.load(std::memory_order_acquire);
    if (before & 1) continue;
    out.count = p.count.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < out.count; ++i) {
      out.rules[i] = {p.interval[i].load(std::memory_order_relaxed), p.burst[i].load(std::memory_order_relaxed)};
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    out.seq = before;
    if (p.seq.load(std::memory_order_relaxed) == before) return out;
  }
}

void gate::update(std::uint32_t domain, std::string_view identifier, std::int64_t next_us, std::int64_t interval_us,
                  std::int64_t now_us) {
  const key_view k{domain, identifier};
  shard& s = shard_for(k);
  std::lock_guard lock(s.mutex);
  auto it = s.map.find(k);
  if (it == s.map.end()) {
    if (next_us <= now_us) return;  // already in the past: nothing to remember
    if (s.map.size() >= max_per_shard_) {
      // Make room from expired entries; if none, fail open for this key.
      entries_.fetch_sub(std::erase_if(s.map, [&](const auto& kv) { return kv.second.expires_us() <= now_us; }),
                         std::memory_order_relaxed);
      if (s.map.size() >= max_per_shard_) {
        dropped_updates_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    it = s.map.emplace(key{domain, std::string(identifier)}, entry{}).first;
    entries_.fetch_add(1, std::memory_order_relaxed);
  }
  entry& e = it->second;
  if (next_us > e.next_us) e.limit = wire::limit_ref::kind::none;  // its LIMIT comes next
  e.next_us = std::max(e.next_us, next_us);                        // delays only move forward
  e.updated_us = now_us;
  if (interval_us > 0) e.interval_us = interval_us;
}

void gate::name_limit(std::uint32_t domain, std::string_view identifier, std::int64_t next_us,
                      const wire::limit_ref& limit) {
  const key_view k{domain, identifier};
  shard& s = shard_for(k);
  std::lock_guard lock(s.mutex);
  const auto it = s.map.find(k);
  // Only the DELAY_UNTIL it came with: one dropped or overtaken names nothing.
  if (it == s.map.end() || it->second.next_us != next_us) return;
  entry& e = it->second;
  e.limit = limit.by;
  e.limit_index = limit.index;
  if (limit.by != wire::limit_ref::kind::share) return;
  e.share_burst = static_cast<std::uint32_t>(limit.share_burst);  // POLICY's bounds: at most 1,000,000
  e.share_window_s = static_cast<std::uint32_t>((limit.share_burst * limit.share_interval_us + 999'999) / 1'000'000);
}

quota_state gate::quota(std::uint32_t domain, std::string_view identifier, std::int64_t now_us, std::string_view tier) {
  quota_state q;
  bool tiered = false;
  policy guard = read_policy(domain, now_us, tier, tiered);
  std::array<std::int64_t, k_guard_rules> tat{};
  std::int64_t next_us = 0;  // the master's DELAY_UNTIL for the client
  bool overridden = false;
  entry named;  // the limit the master named for it (limit, limit_index, share_*)
  {
    const key_view k{domain, identifier};
    shard& s = shard_for(k);
    std::lock_guard lock(s.mutex);
    const policy own = policy_for(s, k, guard, now_us);
    overridden = tiered || own.seq != guard.seq;  // the domain's quotas are not its
    guard = own;
    if (const auto it = s.map.find(k); it != s.map.end()) {
      if (it->second.policy_seq == guard.seq) tat = it->second.tat;
      next_us = it->second.next_us;
      // The master named a limit among those it judged the client's last
      // use by: shown only where this request shows the same rules (its
      // tier's, fresh here, or the domain's for a client without a tier).
      const std::uint32_t shown_tier = tier_tag(tier);
      const bool same_rules = (tier.empty() || tiered) && (it->second.tier == 0 || it->second.tier == shown_tier);
      if (next_us > now_us && same_rules) named = it->second;
    }
  }
  if (guard.count == 0 && !covered(domain, now_us)) return q;
  add_quotas(q, domain, overridden, next_us, now_us);
  name_in(q, named, guard.count);
  if (guard.count == 0) return q;
  // The rate rules first, then the quotas.
  std::move_backward(q.items.begin(), q.items.begin() + static_cast<std::ptrdiff_t>(q.count),
                     q.items.begin() + static_cast<std::ptrdiff_t>(q.count + guard.count));
  q.count += guard.count;
  for (std::size_t i = 0; i < guard.count; ++i) {
    const guard_rule& r = guard.rules[i];
    const std::int64_t ahead = std::max<std::int64_t>(0, tat[i] - now_us);  // GCRA: how far the TAT runs ahead
    auto& it = q.items[i];
    it.quota = r.burst;
    it.window_s = std::max<std::int64_t>(1, (r.burst * r.interval_us + 999'999) / 1'000'000);
    it.remaining = std::clamp<std::int64_t>((r.burst * r.interval_us - ahead) / r.interval_us, 0, r.burst);
    it.reset_s = (ahead + 999'999) / 1'000'000;
  }
  return q;
}

void gate::name_in(quota_state& q, const entry& named, std::size_t rules) {
  using kind = wire::limit_ref::kind;
  // q holds the quotas now; the rules go before them. An index past what
  // this gatekeeper shows (an override's quotas, a policy not refreshed)
  // names nothing.
  if (named.limit == kind::rule && named.limit_index < rules) q.limiting = named.limit_index;
  if (named.limit == kind::quota && named.limit_index < q.count) {
    q.items[named.limit_index].remaining = 0;  // exhausted, the master says
    q.limiting = static_cast<int>(rules + named.limit_index);
  }
  if (named.limit == kind::share) q.share = {named.share_burst, std::max<std::int64_t>(1, named.share_window_s)};
}

void gate::add_quotas(quota_state& q, std::uint32_t domain, bool overridden, std::int64_t next_us,
                      std::int64_t now_us) const {
  // An identifier with rules of its own: the domain's quotas may not be its.
  if (overridden || !any_quotas_.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(quotas_mutex_);
  const auto it = quotas_.find(domain);
  if (it == quotas_.end() || now_us - it->second.updated_us > wire::policy_fresh_ms * 1000) return;
  for (std::size_t i = 0; i < it->second.count; ++i) {
    const auto w = it->second.items[i].window();
    const std::int64_t start = calendar::window_start_us(w, now_us);
    const std::int64_t end = calendar::window_end_us(w, now_us);
    auto& item = q.items[q.count++];
    item.quota = it->second.items[i].limit;
    item.window_s = std::max<std::int64_t>(1, (end - start) / 1'000'000);
    // The units left are the master's to know; an exhausted quota shows here
    // as the master's DELAY_UNTIL to its window's end.
    item.remaining = next_us >= end ? 0 : -1;
    item.reset_s = (end - now_us + 999'999) / 1'000'000;
  }
}

bool gate::take_held(const gate_limits& limits) {
  if (held_.fetch_add(1, std::memory_order_relaxed) >= limits.max_held) {
    held_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  if (limits.route_held != nullptr &&
      limits.route_held->fetch_add(1, std::memory_order_relaxed) >= limits.route_max_held) {
    limits.route_held->fetch_sub(1, std::memory_order_relaxed);
    held_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

bool gate::over_quota(std::uint32_t domain, std::int64_t units, std::int64_t now_us) const {
  if (units <= 1 || !any_quotas_.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(quotas_mutex_);
  const auto it = quotas_.find(domain);
  if (it == quotas_.end() || now_us - it->second.updated_us > wire::policy_fresh_ms * 1000) return false;
  const auto items = std::span(it->second.items).first(it->second.count);
  return std::any_of(items.begin(), items.end(), [&](const auto& q) { return units > q.limit; });
}

gate_decision gate::decide(std::uint32_t domain, std::string_view identifier, std::int64_t now_us,
                           const gate_limits& limits, std::int64_t units, std::int64_t pace_units,
                           std::string_view tier, bool names_tier) {
  bool tiered = false;
  policy guard = read_policy(domain, now_us, tier, tiered);
  guard.own = tier.empty() || tiered;
  // A tier's quotas are the master's to apply; so are an override's, which
  // replace the domain's (known once the override is looked up, below: the
  // quotas' lock is not taken under a shard's).
  const bool over = !tiered && over_quota(domain, units, now_us);
  const key_view k{domain, identifier};
  shard& s = shard_for(k);
  std::lock_guard lock(s.mutex);
  const std::uint32_t domain_seq = guard.seq;
  guard = policy_for(s, k, guard, now_us);
  if (over && guard.seq == domain_seq) {  // (an override's sequence is odd, the domain's even)
    gate_decision d;
    d.v = verdict::reject;
    d.reason = reject_reason::cost_over_limit;
    d.units = units;
    return d;
  }
  auto it = s.map.find(k);
  if (it == s.map.end()) {
    if (guard.count == 0) return {};
    // Half the control memory stays for the master's DELAY_UNTIL: identifiers
    // the guard cannot track pass (fail-open) and are counted.
    if (s.map.size() >= max_per_shard_ / 2) {
      unguarded_.fetch_add(1, std::memory_order_relaxed);
      return {};
    }
    it = s.map.emplace(key{domain, std::string(identifier)}, entry{}).first;
    entries_.fetch_add(1, std::memory_order_relaxed);
  }
  entry& e = it->second;
  if (const std::uint32_t tag = tier_tag(tier); names_tier && e.tier != tag) {
    // The client's tier changed (its plan): what the master said of it was
    // under the old tier's rules. Its next use tells the master the new
    // tier, which answers under those within a round trip. Only a route with
    // a tier source says (a request of another route of the domain names
    // none and changes nothing: alternating routes frees no one).
    if (e.tier != 0) e.next_us = e.interval_us = 0;
    e.tier = tag;
  }
  refresh(e, guard, now_us);
  const std::int64_t max_delay =
      limits.max_delay_us - static_cast<std::int64_t>(static_cast<double>(limits.max_delay_us) * horizon_cut_);
  const request_plan p = plan_request(e, guard, max_delay, limits.pacing_fresh_us, now_us, units);
  gate_decision d;
  d.units = units;
  if (p.never) {
    d.v = verdict::reject;
    d.reason = reject_reason::cost_over_limit;
    return d;
  }
  if (p.accept) {
    record_accept(e, guard, now_us, units);
    if (units == 0 || limits.fit_after) d.fit_units = units_that_fit(e, guard, now_us, units);
    return d;
  }
  // (Not for a request whose body is bounded by what fits after it: a slot says nothing of that.)
  if (p.spare_us != 0 && units == 1 && !limits.fit_after && take_held(limits)) {
    record_spare(e);
    d.v = verdict::delay;
    d.release_us = p.spare_us;
    d.retry_after_s = retry_after_s(p.spare_us, now_us);
    d.interval_us = e.interval_us;
    d.prepaid = true;
    return d;
  }
  d.release_us = p.release_us;
  d.retry_after_s = retry_after_s(p.release_us, now_us);
  if (p.too_long) {
    d.v = verdict::reject;
    d.reason = reject_reason::delay_too_long;
    return d;
  }
  if (!take_held(limits)) {
    d.v = verdict::reject;
    d.reason = reject_reason::held_full;
    return d;
  }
  d.v = verdict::delay;
  d.interval_us = p.pace_us;
  record_hold(e, guard, p, units, pace_units > 0 ? pace_units : 1);
  if (units == 0 || limits.fit_after) d.fit_units = units_that_fit(e, guard, p.release_us, units);
  return d;
}

void gate::charge(std::uint32_t domain, std::string_view identifier, std::int64_t units, std::int64_t now_us,
                  std::string_view tier) {
  if (units > 0) correct(domain, identifier, units, now_us, tier);
}

void gate::refund(std::uint32_t domain, std::string_view identifier, std::int64_t units, std::int64_t now_us,
                  std::string_view tier) {
  if (units > 0) correct(domain, identifier, -units, now_us, tier);
}

void gate::correct(std::uint32_t domain, std::string_view identifier, std::int64_t delta, std::int64_t now_us,
                   std::string_view tier) {
  if (delta == 0) return;
  bool tiered = false;
  policy guard = read_policy(domain, now_us, tier, tiered);
  guard.own = tier.empty() || tiered;
  const key_view k{domain, identifier};
  shard& s = shard_for(k);
  std::lock_guard lock(s.mutex);
  guard = policy_for(s, k, guard, now_us);
  const auto it = s.map.find(k);
  if (guard.count == 0 || it == s.map.end()) return;  // decide() made the entry if the guard tracks the client
  refresh(it->second, guard, now_us);
  if (delta > 0) proxy::charge(it->second, guard, now_us, delta);
  else proxy::refund(it->second, guard, now_us, -delta);
}

void gate::cancel(std::uint32_t domain, std::string_view identifier, const gate_decision& d, std::int64_t now_us) {
  if (d.v != verdict::delay || d.release_us <= now_us || d.units != 1) return;
  const key_view k{domain, identifier};
  shard& s = shard_for(k);
  std::lock_guard lock(s.mutex);
  auto it = s.map.find(k);
  if (it == s.map.end()) return;
  give_back(it->second, d.release_us, now_us);
}

std::size_t gate::sweep(std::int64_t now_us) {
  shard& s = shards_[sweep_cursor_.fetch_add(1, std::memory_order_relaxed) % k_shards];
  std::lock_guard lock(s.mutex);
  const std::size_t removed = std::erase_if(s.map, [&](const auto& kv) { return kv.second.expires_us() <= now_us; });
  entries_.fetch_sub(removed, std::memory_order_relaxed);
  // An override no master refreshes any more (removed from its configuration, or the master is gone).
  const auto stale = [&](const auto& kv) { return now_us - kv.second.updated_us > wire::policy_fresh_ms * 1000; };
  override_count_.fetch_sub(std::erase_if(s.overrides, stale), std::memory_order_relaxed);
  // So with tiers, on one shard's turn in k_shards (they are few).
  if (&s == &shards_[0] && any_tiers_.load(std::memory_order_relaxed)) {
    std::unique_lock tiers_lock(tiers_mutex_);
    std::erase_if(tiers_, stale);
  }
  return removed;
}

}  // namespace smockron::proxy
