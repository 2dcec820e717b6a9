// Concurrency on the gatekeeper's side (see slots.hpp).
#include "proxy/gate/slots.hpp"

#include <algorithm>

namespace smockron::proxy {

// ---- concurrency_policies ---------------------------------------------------

void concurrency_policies::set(std::string_view domain, std::string_view identifier, std::int64_t limit,
                               std::int64_t now_us) {
  std::lock_guard lock(mutex_);
  auto it = domains_.find(domain);
  if (it == domains_.end()) it = domains_.emplace(std::string(domain), domain_items{}).first;
  domain_items& d = it->second;
  if (identifier.empty()) {
    d.own = {limit, now_us};
  } else {
    // Overrides a master lists are bounded (config::max_overrides); a stale one is replaced in place.
    auto o = d.overrides.find(identifier);
    if (o == d.overrides.end()) o = d.overrides.emplace(std::string(identifier), item{}).first;
    o->second = {limit, now_us};
  }
  any_.store(true, std::memory_order_relaxed);
}

void concurrency_policies::set_tier(std::string_view domain, std::string_view tier, std::int64_t limit,
                                    std::int64_t now_us) {
  std::lock_guard lock(mutex_);
  auto it = domains_.find(domain);
  if (it == domains_.end()) it = domains_.emplace(std::string(domain), domain_items{}).first;
  // A domain has at most config::max_tiers; a stale one is replaced in place.
  auto t = it->second.tiers.find(tier);
  if (t == it->second.tiers.end()) t = it->second.tiers.emplace(std::string(tier), item{}).first;
  t->second = {limit, now_us};
  if (limit > 0) any_.store(true, std::memory_order_relaxed);
}

std::int64_t concurrency_policies::limit(std::string_view domain, std::string_view identifier, std::int64_t now_us,
                                         std::string_view tier) const {
  const auto fresh = [&](const item& i) { return now_us - i.updated_us <= wire::policy_fresh_ms * 1000; };
  std::lock_guard lock(mutex_);
  const auto it = domains_.find(domain);
  if (it == domains_.end()) return 0;
  const domain_items& d = it->second;
  if (!d.overrides.empty()) {
    if (const auto o = d.overrides.find(identifier); o != d.overrides.end() && fresh(o->second)) {
      return o->second.limit;
    }
  }
  if (!tier.empty() && !d.tiers.empty()) {
    if (const auto t = d.tiers.find(tier); t != d.tiers.end() && fresh(t->second)) return t->second.limit;
  }
  return fresh(d.own) ? d.own.limit : 0;
}

// ---- slot_table ----------------------------------------------------------------

slot_table::entry* slot_table::find_or_add(std::string_view domain, std::string_view identifier) {
  key_.assign(domain).push_back('\0');
  key_.append(identifier);
  if (auto it = entries_.find(key_); it != entries_.end()) return &it->second;
  if (entries_.size() >= k_max_entries) return nullptr;
  entry& e = entries_.emplace(key_, entry{}).first->second;
  e.domain = domain;
  e.identifier = identifier;
  return &e;
}

slot_table::entry* slot_table::acquire(std::string_view domain, std::string_view identifier, bool online, waiter& w,
                                       std::int64_t now_us, std::string_view tier) {
  entry* e = find_or_add(domain, identifier);
  if (e == nullptr) return &untracked_;
  e->quiet_since_us = 0;
  if (e->tier != tier) e->tier = tier;
  // No master: fail-open, but counted in flight (claimed when one is back).
  // Else a free slot of the lease, unless others wait before it.
  if (!online || (e->waiting == 0 && e->in_use < std::min(e->held, e->cap))) {
    ++e->in_use;
    report(*e, now_us);
    return e;
  }
  w.on = e;
  w.prev = e->tail;
  w.next = nullptr;
  (e->tail ? e->tail->next : e->head) = &w;
  e->tail = &w;
  ++e->waiting;
  report(*e, now_us);
  return nullptr;
}

void slot_table::unlink(waiter& w) {
  entry& e = *w.on;
  (w.prev ? w.prev->next : e.head) = w.next;
  (w.next ? w.next->prev : e.tail) = w.prev;
  w.prev = w.next = nullptr;
  w.on = nullptr;
  --e.waiting;
}

void slot_table::release(entry& e, std::int64_t now_us) {
  if (&e == &untracked_) return;
  --e.in_use;
  serve(e);
  report(e, now_us);
}

void slot_table::cancel(waiter& w, std::int64_t now_us) {
  if (w.on == nullptr) return;
  entry& e = *w.on;
  unlink(w);
  report(e, now_us);
}

void slot_table::serve(entry& e) {
  while (e.head != nullptr && e.in_use < std::min(e.held, e.cap)) {
    waiter& w = *e.head;
    unlink(w);
    ++e.in_use;
    w.granted = &e;
    w.wake();  // may release() or cancel() others: the loop reads the entry afresh
  }
}

void slot_table::on_grant(const wire::grant& g, std::int64_t now_us) {
  key_.assign(g.domain).push_back('\0');
  key_.append(g.identifier);
  auto it = entries_.find(key_);
  if (it == entries_.end()) {
    // Forgotten here (nothing in flight): the master's count is the baseline.
    if (g.held == 0) return;
    entry* e = find_or_add(g.domain, g.identifier);
    if (e == nullptr) return;
    e->returned = e->sent_returned = g.seen;
    it = entries_.find(key_);
  }
  entry& e = it->second;
  // What the master counted, less the give-backs still on their way to it.
  e.held = std::max<std::int64_t>(0, g.held - (e.returned - g.seen));
  e.cap = std::min(g.cap, e.held);
  serve(e);
  report(e, now_us);
}

void slot_table::report(entry& e, std::int64_t now_us, bool force) {
  const std::int64_t want = e.in_use + static_cast<std::int64_t>(e.waiting);
  std::int64_t keep = e.held;
  if (e.cap < e.held) {
    keep = std::max(e.in_use, std::min(e.cap, want));  // the master asks for slots back
  } else if (want >= e.held) {
    e.idle_since_us = 0;
  } else if (e.idle_since_us == 0) {
    e.idle_since_us = now_us;
  } else if (now_us - e.idle_since_us >= k_linger_us) {
    keep = std::max(e.in_use, want);
  }
  if (keep < e.held) {
    e.returned += e.held - keep;
    e.held = keep;
    e.cap = std::min(e.cap, e.held);
    e.idle_since_us = 0;
  }
  // The master hears a want above the lease whenever it changes (it grants
  // by it), and when the want crosses the lease either way: a slot that goes
  // idle here is one it can ask back for a holder that waits.
  const auto side = [&](std::int64_t x) { return (x > e.held) - (x < e.held); };
  const bool tell = force || e.returned != e.sent_returned || side(want) != side(e.sent_want) ||
                    (want > e.held && want != e.sent_want);
  if (tell && send_) {
    send_(wire::lease{e.domain, e.identifier, holder_, want, e.held, e.returned, e.tier});
    e.sent_want = want;
    e.sent_returned = e.returned;
    e.asked_us = now_us;
  }
  count(e);
  const bool quiet = want == 0 && e.held == 0 && e.sent_want == 0;
  if (!quiet) e.quiet_since_us = 0;
  else if (e.quiet_since_us == 0) e.quiet_since_us = now_us;
}

void slot_table::links_changed(const std::function<bool(std::string_view)>& online, std::int64_t now_us) {
  for (auto& [key, e] : entries_) {
    if (!online(e.domain)) {
      // The lease died with the connection (the master freed it): requests go, counted in flight.
      e.held = e.cap = 0;
      while (e.head != nullptr) {
        waiter& w = *e.head;
        unlink(w);
        ++e.in_use;
        w.granted = &e;
        w.wake();
      }
      e.sent_want = 0;
      count(e);
      continue;
    }
    if (e.in_use > 0 && e.held == 0) {
      // Back: what is still in flight is claimed (counted by the master even beyond its limit).
      e.held = e.cap = e.in_use;
      report(e, now_us, true);
    }
  }
}

void slot_table::tick(std::int64_t now_us) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    entry& e = it->second;
    if (e.quiet_since_us != 0 && now_us - e.quiet_since_us >= k_forget_us) {
      it = entries_.erase(it);
      continue;
    }
    const bool waits = e.waiting > 0 && now_us - e.asked_us >= k_ask_again_us;
    report(e, now_us, waits);
    ++it;
  }
}

void slot_table::count(entry& e) {
  const std::int64_t now[3] = {e.in_use, e.held, static_cast<std::int64_t>(e.waiting)};
  for (int i = 0; i < 3; ++i) {
    if (now[i] != e.counted[i]) totals_[i].fetch_add(now[i] - e.counted[i], std::memory_order_relaxed);
    e.counted[i] = now[i];
  }
}

}  // namespace smockron::proxy
