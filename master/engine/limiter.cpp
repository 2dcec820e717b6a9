// In-memory limiter state: hash map per domain + one intrusive LRU list.
#include "master/engine/limiter.hpp"

#include "master/engine/top.hpp"

#include <algorithm>
#include <array>
#include <limits>

namespace smockron::master {

namespace {
rules::limits compile_rules(config::algorithm_kind algo, const std::vector<config::rule_config>& rules,
                            std::chrono::microseconds max_clock_skew) {
  rules::limits l;
  l.algo = algo == config::algorithm_kind::gcra ? rules::algorithm::gcra : rules::algorithm::sliding_log;
  l.max_future_us = max_clock_skew.count();
  for (const auto& r : rules) {
    if (!r.is_quota()) {
      l.rules.push_back({r.r.interval_us(), r.burst});
      continue;
    }
    static constexpr std::array k_periods{rules::period::day, rules::period::week, rules::period::month,
                                          rules::period::fixed};
    l.quotas.push_back(
        {r.quota, k_periods[static_cast<std::size_t>(r.per)], r.tz_offset_s * 1'000'000, r.per_length.count()});
  }
  return l;
}
}  // namespace

// The limits of one identifier of domain `d` judged by `rules` (the domain's,
// an override's or a tier's, which replace the domain's, its concurrency rule
// too) with `weight`; the domain's algorithm and shared limits, whoever the identifier.
rules::limits compile_for(const config::domain_config& d, const std::vector<config::rule_config>& rules,
                          std::int64_t concurrency, std::int64_t weight, std::chrono::microseconds max_clock_skew) {
  rules::limits l = compile_rules(d.algorithm, rules, max_clock_skew);
  l.concurrency = concurrency;
  l.shared_concurrency = d.shared_concurrency;
  l.weight = weight;
  if (d.shared_rate) l.shared_rate = {d.shared_rate->r.interval_us(), d.shared_rate->burst};
  return l;
}

rules::limits compile(const config::domain_config& d, std::chrono::microseconds max_clock_skew) {
  return compile_for(d, d.rules, d.concurrency, 1, max_clock_skew);
}

rules::limits compile(const config::domain_config& d, const config::override_config& o,
                      std::chrono::microseconds max_clock_skew) {
  return compile_for(d, o.rules, o.concurrency, o.weight, max_clock_skew);
}

rules::limits compile(const config::domain_config& d, const config::tier_config& t,
                      std::chrono::microseconds max_clock_skew) {
  return compile_for(d, t.rules, t.concurrency, t.weight, max_clock_skew);
}

limiter::limiter(std::vector<domain_limits> domains, std::size_t max_identifiers)
    : limits_(std::move(domains)), maps_(limits_.size()), max_identifiers_(std::max<std::size_t>(1, max_identifiers)) {
  for (auto& m : maps_) m.reserve(std::min<std::size_t>(max_identifiers_, 1 << 16));
}

limiter::~limiter() = default;

void limiter::unlink(entry* e) {
  if (cursor_ == e) cursor_ = e->prev;
  (e->prev ? e->prev->next : head_) = e->next;
  (e->next ? e->next->prev : tail_) = e->prev;
  e->prev = e->next = nullptr;
}

void limiter::push_front(entry* e) {
  e->prev = nullptr;
  e->next = head_;
  if (head_) head_->prev = e;
  head_ = e;
  if (!tail_) tail_ = e;
}

void limiter::mark(entry* e) {
  if (e->dirty) return;
  e->dirty = true;
  e->dirty_next = nullptr;
  e->dirty_prev = dirty_tail_;
  (dirty_tail_ ? dirty_tail_->dirty_next : dirty_head_) = e;
  dirty_tail_ = e;
  ++dirty_count_;
}

void limiter::unmark(entry* e) {
  if (!e->dirty) return;
  e->dirty = false;
  (e->dirty_prev ? e->dirty_prev->dirty_next : dirty_head_) = e->dirty_next;
  (e->dirty_next ? e->dirty_next->dirty_prev : dirty_tail_) = e->dirty_prev;
  e->dirty_prev = e->dirty_next = nullptr;
  --dirty_count_;
}

void limiter::track_dirty() { track_dirty_ = true; }

void limiter::mark_all_dirty() {
  if (!track_dirty_) return;
  for (entry* e = tail_; e; e = e->prev) mark(e);
}

void limiter::erase(entry* e) {
  unmark(e);
  unlink(e);
  maps_[e->domain].erase(e);
  --size_;
}

limiter::entry* limiter::touch(std::size_t domain, std::string_view identifier, bool create) {
  entry* en = maps_[domain].find(identifier);
  if (!en) {
    if (!create) return nullptr;
    if (size_ >= max_identifiers_) {
      ++evictions_;
      erase(tail_);
    }
    return insert(domain, identifier);
  }
  if (en != head_) {
    unlink(en);
    push_front(en);
  }
  return en;
}

void limiter::stats::count(bool refused, std::int64_t now_us) {
  const std::int64_t h = now_us / top_limited::k_half_us;
  if (h != half) {
    uses[1] = h == half + 1 ? uses[0] : 0;
    refusals[1] = h == half + 1 ? refusals[0] : 0;
    uses[0] = refusals[0] = 0;
    half = h;
  }
  ++(refused ? refusals[0] : uses[0]);
}

std::pair<std::uint32_t, std::uint32_t> limiter::stats::last_minute(std::int64_t now_us) const {
  const std::int64_t h = now_us / top_limited::k_half_us;
  if (h == half) return {uses[0] + uses[1], refusals[0] + refusals[1]};
  if (h == half + 1) return {uses[0], refusals[0]};
  return {0, 0};
}

rules::decision limiter::record(entry* en, rules::event e, std::int64_t now_us) {
  if (track_dirty_ && e.kind != rules::event_kind::rejected) mark(en);
  if (e.kind == rules::event_kind::adjust) return rules::apply(*en->lim, en->st, e, now_us);  // not a request
  ++en->counts.n_req;
  if (e.kind != rules::event_kind::accepted) ++en->counts.n_over;
  en->counts.count(e.kind == rules::event_kind::rejected, now_us);
  return rules::apply(*en->lim, en->st, e, now_us);
}

void limiter::rejudge(entry& en, const rules::limits* next) {
  // A changed algorithm or rule count makes old state meaningless; so does a
  // changed layout of the counters and quotas (a rule's burst crossing
  // k_exact_burst, a quota added or removed) for those numbers.
  if (en.lim->algo != next->algo || en.lim->rules.size() != next->rules.size()) en.st.times.clear();
  if (!rules::same_aux_layout(*en.lim, *next)) en.st.aux.clear();
  en.lim = next;
}

rules::decision limiter::apply(std::size_t domain, std::string_view identifier, rules::event e, std::int64_t now_us,
                               std::string_view tier) {
  // A rejection of an identifier nobody knows: nothing to record, nothing known.
  // A refund for an identifier nobody knows (expired, evicted) has nothing to give back.
  const bool use = e.kind == rules::event_kind::accepted || e.kind == rules::event_kind::delayed;
  const bool creates = e.kind == rules::event_kind::adjust ? e.cost > 0 : e.kind != rules::event_kind::rejected;
  entry* en = touch(domain, identifier, creates);
  if (en == nullptr) return {};
  // Only a domain with tiers looks again: its client's tier can change with any request.
  if (use && !limits_[domain].tiers.empty()) {
    const rules::limits* next = &limits_[domain].of(identifier, tier);
    if (next != en->lim) rejudge(*en, next);
  }
  return record(en, e, now_us);
}

const rules::limits& limiter::current_limits(std::size_t domain, std::string_view identifier) const {
  const entry* en = maps_[domain].find(identifier);
  return en != nullptr ? *en->lim : limits_of(domain, identifier);
}

limiter::query_use limiter::use(std::size_t domain, std::string_view identifier, std::int64_t now_us) {
  query_use out;
  entry* en = touch(domain, identifier, true);
  if (!en->st.empty() && rules::evaluate(*en->lim, en->st, now_us).throttled) {
    out.over = true;
    ++en->counts.n_req;
    ++en->counts.n_over;
    en->counts.count(true, now_us);
  } else {
    out.after = record(en, {rules::event_kind::accepted, now_us}, now_us);
  }
  out.st = &en->st;
  out.lim = en->lim;
  out.counts = &en->counts;
  return out;
}

limiter::charge_use limiter::charge(std::size_t domain, std::string_view identifier, std::int64_t cost,
                                    std::int64_t now_us, charge_mode mode) {
  charge_use out;
  // A look (a probe, or a use of no units) makes no state.
  entry* en =
      mode == charge_mode::probe || cost <= 0 ? maps_[domain].find(identifier) : touch(domain, identifier, true);
  const rules::limits& l = en ? *en->lim : limits_of(domain, identifier);
  if (mode == charge_mode::force) {
    out.fits = true;  // recorded whatever: the caller has the verdict it needs, if any
  } else {
    static const rules::state no_state;
    const std::int64_t at = rules::fits_at(l, en ? en->st : no_state, cost, now_us);
    out.never = at == std::numeric_limits<std::int64_t>::max();
    out.fits = at <= now_us;
  }
  if (!en) return out;
  const bool records = mode != charge_mode::probe;
  if (records && (out.fits || mode == charge_mode::force) && cost > 0) {
    out.after = record(en, {rules::event_kind::accepted, now_us, cost}, now_us);
  } else {
    if (records && !out.fits) {
      ++en->counts.n_req;
      ++en->counts.n_over;
      en->counts.count(true, now_us);
    }
    out.after = en->st.empty() ? rules::decision{} : rules::evaluate(l, en->st, now_us);
  }
  out.st = &en->st;
  out.lim = en->lim;
  out.counts = &en->counts;
  return out;
}

std::int64_t limiter::fits_at(std::size_t domain, std::string_view identifier, std::int64_t cost, std::int64_t now_us,
                              std::string_view tier) const {
  static const rules::state no_state;
  const entry* en = maps_[domain].find(identifier);
  return rules::fits_at(limits_of(domain, identifier, tier), en ? en->st : no_state, cost, now_us);
}

limiter::stats limiter::find_stats(std::size_t domain, std::string_view identifier) const {
  const entry* en = maps_[domain].find(identifier);
  return en ? en->counts : stats{};
}

limiter::entry* limiter::insert(std::size_t domain, std::string_view identifier) {
  entry* en = maps_[domain].insert(identifier);
  en->lim = &limits_[domain].of(identifier);
  // A sliding log grows to its history as uses come (a burst of 1,000,000
  // would otherwise reserve 8 MB for every identifier seen once).
  en->st.times.reserve(en->lim->algo == rules::algorithm::gcra ? en->lim->rules.size()
                                                               : std::min<std::size_t>(en->lim->history_cap(), 8));
  en->domain = domain;
  ++size_;
  push_front(en);
  return en;
}

bool limiter::restore(std::size_t domain, std::string_view identifier, const rules::state& st, std::int64_t now_us,
                      std::string_view tier) {
  const rules::limits& l = limits_of(domain, identifier, tier);
  if (!rules::compatible(l, st) || rules::expired(l, st, now_us - k_late_us)) return false;
  entry* en = maps_[domain].find(identifier);
  if (!en) {
    // Restored state never evicts live state: past the cap it is dropped.
    if (size_ >= max_identifiers_) return false;
    en = insert(domain, identifier);
    en->lim = &l;
    en->st = st;
    return true;
  }
  // Uses of this run came first: their limits judge it (the same as `l`
  // unless they named another tier), and a state of another shape is dropped.
  if (en->lim != &l && !rules::compatible(*en->lim, st)) return false;
  rules::merge(*en->lim, en->st, st);
  if (track_dirty_) mark(en);
  return true;
}

std::size_t limiter::sweep(std::int64_t now_us, std::size_t budget) {
  // A cursor walks from the least recently used end towards the head and
  // resumes there on the next call, so every entry is examined eventually
  // whatever the mix of domain windows, at a bounded cost per call.
  std::size_t removed = 0;
  budget = std::min(budget, size_);
  while (budget-- > 0) {
    entry* e = cursor_ ? cursor_ : tail_;
    if (!e) break;
    cursor_ = e->prev;
    if (rules::expired(*e->lim, e->st, now_us - k_late_us)) {
      erase(e);
      ++removed;
    }
  }
  expirations_ += removed;
  return removed;
}

void limiter::reconfigure(std::vector<domain_limits> domains,
                          const std::vector<std::optional<std::size_t>>& old_index) {
  std::vector<map> maps(domains.size());
  std::vector<bool> kept(maps_.size(), false);
  for (std::size_t i = 0; i < domains.size(); ++i) {
    if (!old_index[i]) continue;
    const std::size_t old = *old_index[i];
    kept[old] = true;
    maps[i] = std::move(maps_[old]);
    const domain_limits& before = limits_[old];
    maps[i].for_each([&](entry& en) {
      en.domain = i;
      // An identifier judged by a tier stays with that tier (by name) until its next use names one.
      const std::string_view tier = before.tier_of(en.lim);
      rejudge(en, &domains[i].of(en.key, tier));  // points into `domains`' elements, which move into limits_ below
    });
  }
  for (std::size_t old = 0; old < maps_.size(); ++old) {
    if (kept[old]) continue;
    maps_[old].for_each([&](entry& en) {
      unmark(&en);
      unlink(&en);
      --size_;
    });
  }
  maps_ = std::move(maps);
  limits_ = std::move(domains);
}

void limiter::set_max_identifiers(std::size_t max_identifiers) {
  max_identifiers_ = std::max<std::size_t>(1, max_identifiers);
  while (size_ > max_identifiers_) {
    ++evictions_;
    erase(tail_);
  }
}

const rules::state* limiter::find(std::size_t domain, std::string_view identifier) const {
  const entry* en = maps_[domain].find(identifier);
  return en ? &en->st : nullptr;
}

void limiter::reset(std::size_t domain, std::string_view identifier) {
  entry* en = maps_[domain].find(identifier);
  if (!en) return;
  en->st.times.clear();
  std::fill(en->st.aux.begin(), en->st.aux.end(), 0);
  if (track_dirty_) mark(en);
}

}  // namespace smockron::master
