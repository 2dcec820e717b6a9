// Concurrency leases (see leases.hpp).
#include "master/engine/leases.hpp"

#include <algorithm>
#include <numeric>

namespace smockron::master {

namespace {

// Max-min fair shares of `limit` over `wants` (water-filling), each i
// counting as weights[i] even shares (none: 1); the remainder of the split
// goes to the last in `order` (ascending want per weight) that wants more.
std::vector<std::int64_t> water_fill(std::int64_t limit, const std::vector<std::int64_t>& wants,
                                     const std::vector<std::size_t>& order,
                                     const std::vector<std::int64_t>* weights = nullptr) {
  std::vector<std::int64_t> share(wants.size());
  const auto weight = [&](std::size_t k) { return weights != nullptr ? (*weights)[k] : std::int64_t{1}; };
  std::int64_t left = limit;
  std::int64_t rest = 0;  // the weights of those not served yet
  for (std::size_t k : order) rest += weight(k);
  for (std::size_t k : order) {
    share[k] = std::min(wants[k], left * weight(k) / rest);
    left -= share[k];
    rest -= weight(k);
  }
  for (std::size_t i = order.size(); i-- > 0 && left > 0;) {
    const std::size_t k = order[i];
    if (share[k] < wants[k]) {
      ++share[k];
      --left;
    }
  }
  return share;
}

}  // namespace

std::string leases::key_of(std::string_view domain, std::string_view identifier) {
  std::string k;
  k.reserve(domain.size() + 1 + identifier.size());
  k.append(domain).push_back('\0');  // a domain name has no "\0": the key splits unambiguously
  k.append(identifier);
  return k;
}

std::pair<std::string_view, std::string_view> leases::split(std::string_view key) {
  const std::size_t at = key.find('\0');
  return {key.substr(0, at), key.substr(at + 1)};
}

void leases::set_limits(entry& e, limits l) {
  e.own = l.own > 0 ? l.own : k_unlimited;
  e.weight = std::max<std::int64_t>(1, l.weight);
  pool* next = nullptr;
  if (l.shared > 0) {
    const auto domain = split(*e.key).first;
    auto it = pools_.find(domain);
    if (it == pools_.end()) it = pools_.emplace(std::string(domain), pool{}).first;
    next = &it->second;
    next->limit = l.shared;
  }
  if (next == e.in) return;
  std::int64_t held = 0;
  for (const holder& h : e.holders) held += h.held;
  if (e.in != nullptr) {
    std::erase(e.in->members, &e);
    e.in->held -= held;
  }
  e.in = next;
  if (next != nullptr) {
    next->members.push_back(&e);
    next->held += held;
  }
  e.limit = e.own;
}

bool leases::on_lease(std::uint64_t peer, const wire::lease& m, limits l, std::int64_t now_us) {
  auto it = entries_.find(key_of(m.domain, m.identifier));
  if (it == entries_.end()) {
    if (m.want == 0 && m.held == 0) return true;  // nothing held, nothing wanted: nothing to keep
    if (entries_.size() >= max_entries_) return false;
    it = entries_.emplace(key_of(m.domain, m.identifier), entry{}).first;
    it->second.key = &it->first;
  }
  entry& e = it->second;
  if (e.tier != m.tier) e.tier = m.tier;
  set_limits(e, l);
  auto h = std::find_if(e.holders.begin(), e.holders.end(),
                        [&](const holder& x) { return x.peer == peer && x.id == m.holder; });
  std::int64_t delta = 0;
  if (h == e.holders.end()) {
    // A holder new to this connection: what it says it holds is in flight
    // (its connection came back, or this master restarted), so it is counted.
    e.holders.push_back({peer, m.holder, m.held, m.held, 0, m.returned, 0, m.held > 0});
    delta = m.held;
    h = std::prev(e.holders.end());
  } else if (m.returned > h->seen) {
    const std::int64_t back = std::min(h->held, m.returned - h->seen);
    h->held -= back;
    h->cap = std::min(h->cap, h->held);
    delta = -back;
    h->seen = m.returned;
  } else if (m.returned < h->seen) {
    h->seen = m.returned;  // the holder counts afresh (it forgot this identifier): nothing owed
  }
  held_ += delta;
  if (e.in != nullptr) e.in->held += delta;
  h->want = m.want;
  settle(e, now_us);
  if (std::none_of(e.holders.begin(), e.holders.end(), [](const holder& x) { return x.changed; })) prune(it);
  return true;
}

void leases::settle(entry& e, std::int64_t now_us) {
  if (e.in != nullptr) {
    rebalance_pool(*e.in, now_us);
    return;
  }
  e.limit = e.own;
  rebalance(e, now_us);
  if (std::any_of(e.holders.begin(), e.holders.end(), [](const holder& x) { return x.changed; })) {
    changed_.push_back(*e.key);
  }
}

void leases::rebalance_pool(pool& p, std::int64_t now_us) {
  // Each identifier's share of the pool, max-min over what its holders want
  // (at most its own limit); then grants, those furthest below their share first.
  const std::size_t n = p.members.size();
  std::vector<std::int64_t> wants(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t w = 0;
    for (const holder& h : p.members[i]->holders) w += h.want;
    wants[i] = std::min(w, p.members[i]->own);
  }
  std::vector<std::int64_t> weights(n);
  for (std::size_t i = 0; i < n; ++i) weights[i] = p.members[i]->weight;
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Ascending want per weight (a x wb < b x wa, in integers).
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return wants[a] * weights[b] < wants[b] * weights[a]; });
  const auto share = water_fill(p.limit, wants, order, &weights);
  std::vector<std::int64_t> held(n);
  for (std::size_t i = 0; i < n; ++i) {
    p.members[i]->limit = std::min(p.members[i]->own, share[i]);
    for (const holder& h : p.members[i]->holders) held[i] += h.held;
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return held[a] - share[a] < held[b] - share[b]; });
  std::int64_t free = p.limit - p.held;
  for (std::size_t i : order) {
    entry& e = *p.members[i];
    rebalance(e, now_us, &free);
    if (std::any_of(e.holders.begin(), e.holders.end(), [](const holder& x) { return x.changed; })) {
      changed_.push_back(*e.key);
    }
  }
}

std::int64_t leases::peer_closed(std::uint64_t peer, std::int64_t now_us) {
  std::int64_t freed = 0;
  std::vector<entry*> touched;
  for (auto it = entries_.begin(); it != entries_.end();) {
    entry& e = it->second;
    std::int64_t gone_here = 0;
    const auto gone = std::remove_if(e.holders.begin(), e.holders.end(), [&](const holder& h) {
      if (h.peer != peer) return false;
      gone_here += h.held;
      return true;
    });
    if (gone == e.holders.end()) {
      ++it;
      continue;
    }
    e.holders.erase(gone, e.holders.end());
    freed += gone_here;
    if (e.in != nullptr) e.in->held -= gone_here;
    if (e.holders.empty()) {
      auto next = std::next(it);
      erase(it);
      std::erase(touched, &e);
      it = next;
      continue;
    }
    touched.push_back(&e);
    ++it;
  }
  held_ -= freed;
  // Whoever waits gets the freed slots (every pool the departed held slots of, too).
  std::vector<pool*> pools;
  for (entry* e : touched) {
    if (e->in == nullptr) settle(*e, now_us);
    else if (std::find(pools.begin(), pools.end(), e->in) == pools.end()) pools.push_back(e->in);
  }
  for (auto& [domain, p] : pools_) {
    if (std::find(pools.begin(), pools.end(), &p) == pools.end() && freed > 0) pools.push_back(&p);
  }
  for (pool* p : pools) rebalance_pool(*p, now_us);
  return freed;
}

void leases::rebalance(entry& e, std::int64_t now_us, std::int64_t* pool_free) {
  auto& hs = e.holders;
  const auto set = [](holder& h, std::int64_t held, std::int64_t cap) {
    if (h.held != held || h.cap != cap) h.changed = true;
    h.held = held;
    h.cap = cap;
  };
  const auto grant = [&](holder& h, std::int64_t give) {
    held_ += give;
    if (e.in != nullptr) e.in->held += give;
    if (pool_free != nullptr) *pool_free -= give;
    set(h, h.held + give, h.held + give);
  };
  if (e.limit == k_unlimited && pool_free == nullptr) {  // no rule: what is wanted is granted
    for (holder& h : hs) {
      if (h.want > h.held) grant(h, h.want - h.held);
      set(h, h.held, h.held);
      h.asked_us = 0;
    }
    return;
  }
  for (holder& h : hs) {
    if (h.want > h.held && h.asked_us == 0) h.asked_us = now_us;
  }
  // Max-min fair shares of the limit among the holders (the remainder of an
  // even split to those that asked first).
  std::vector<std::int64_t> wants(hs.size());
  for (std::size_t i = 0; i < hs.size(); ++i) wants[i] = hs[i].want;
  std::vector<std::size_t> order(hs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (hs[a].want != hs[b].want) return hs[a].want < hs[b].want;
    return hs[a].asked_us > hs[b].asked_us;
  });
  const auto share = water_fill(std::min(e.limit, INT64_MAX / 2), wants, order);
  // Free slots to those waiting, first come first served: up to the share, then beyond.
  std::int64_t free = e.limit == k_unlimited ? INT64_MAX / 2 : e.limit;
  for (const holder& h : hs) free -= h.held;
  const bool over = free < 0 || (pool_free != nullptr && *pool_free < 0);
  std::vector<std::size_t> waiting;
  for (std::size_t i = 0; i < hs.size(); ++i) {
    if (hs[i].want > hs[i].held) waiting.push_back(i);
  }
  std::sort(waiting.begin(), waiting.end(),
            [&](std::size_t a, std::size_t b) { return hs[a].asked_us < hs[b].asked_us; });
  for (const bool beyond_share : {false, true}) {
    for (std::size_t i : waiting) {
      holder& h = hs[i];
      const std::int64_t room = beyond_share ? h.want : std::min(h.want, share[i]);
      std::int64_t give = std::min(free, room - h.held);
      if (pool_free != nullptr) give = std::min(give, *pool_free);
      if (give <= 0) continue;
      free -= give;
      grant(h, give);
    }
  }
  // Caps: while some holder waits, or more is held than the limit (claims
  // after a comeback, a lower limit after a reload, a pool's shares moved),
  // each keeps its share.
  bool starving = over;
  for (holder& h : hs) {
    if (h.want > h.held) starving = true;
    else h.asked_us = 0;
  }
  for (std::size_t i = 0; i < hs.size(); ++i) {
    holder& h = hs[i];
    set(h, h.held, starving ? std::min(h.held, share[i]) : h.held);
  }
}

void leases::prune(map::iterator it) {
  auto& hs = it->second.holders;
  std::erase_if(hs, [](const holder& h) { return h.held == 0 && h.want == 0 && !h.changed; });
  if (hs.empty()) erase(it);
}

void leases::erase(map::iterator it) {
  entry& e = it->second;
  if (pool* p = e.in) {
    std::erase(p->members, &e);
    if (p->members.empty()) pools_.erase(pools_.find(split(it->first).first));
  }
  entries_.erase(it);
}

std::int64_t leases::held_by(std::string_view domain, std::string_view identifier) const {
  const auto it = entries_.find(key_of(domain, identifier));
  if (it == entries_.end()) return -1;
  std::int64_t n = 0;
  for (const holder& h : it->second.holders) n += h.held;
  return n;
}

std::int64_t leases::limit_of(std::string_view domain, std::string_view identifier) const {
  const auto it = entries_.find(key_of(domain, identifier));
  if (it == entries_.end() || it->second.limit == k_unlimited) return -1;
  return it->second.limit;
}

}  // namespace smockron::master
