// Concurrency leases (see leases.hpp).
#include "master/engine/leases.hpp"

#include <algorithm>
#include <numeric>

namespace smockron::master {

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

bool leases::on_lease(std::uint64_t peer, const wire::lease& m, std::int64_t limit, std::int64_t now_us) {
  std::string key = key_of(m.domain, m.identifier);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (m.want == 0 && m.held == 0) return true;  // nothing held, nothing wanted: nothing to keep
    if (entries_.size() >= max_entries_) return false;
    it = entries_.emplace(key, entry{}).first;
  }
  entry& e = it->second;
  e.limit = limit;
  auto h = std::find_if(e.holders.begin(), e.holders.end(),
                        [&](const holder& x) { return x.peer == peer && x.id == m.holder; });
  if (h == e.holders.end()) {
    // A holder new to this connection: what it says it holds is in flight
    // (its connection came back, or this master restarted), so it is counted.
    e.holders.push_back({peer, m.holder, m.held, m.held, 0, m.returned, 0, m.held > 0});
    held_ += m.held;
    h = std::prev(e.holders.end());
  } else if (m.returned > h->seen) {
    const std::int64_t back = std::min(h->held, m.returned - h->seen);
    h->held -= back;
    h->cap = std::min(h->cap, h->held);
    held_ -= back;
    h->seen = m.returned;
  }
  h->want = m.want;
  rebalance(e, now_us);
  if (std::any_of(e.holders.begin(), e.holders.end(), [](const holder& x) { return x.changed; })) {
    changed_.push_back(std::move(key));
  } else {
    prune(it);
  }
  return true;
}

std::int64_t leases::peer_closed(std::uint64_t peer, std::int64_t now_us) {
  std::int64_t freed = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    entry& e = it->second;
    const auto gone = std::remove_if(e.holders.begin(), e.holders.end(), [&](const holder& h) {
      if (h.peer != peer) return false;
      freed += h.held;
      return true;
    });
    if (gone == e.holders.end()) {
      ++it;
      continue;
    }
    e.holders.erase(gone, e.holders.end());
    if (e.holders.empty()) {
      it = entries_.erase(it);
      continue;
    }
    rebalance(e, now_us);
    changed_.push_back(it->first);
    ++it;
  }
  held_ -= freed;
  return freed;
}

void leases::rebalance(entry& e, std::int64_t now_us) {
  auto& hs = e.holders;
  const auto set = [](holder& h, std::int64_t held, std::int64_t cap) {
    if (h.held != held || h.cap != cap) h.changed = true;
    h.held = held;
    h.cap = cap;
  };
  if (e.limit == 0) {  // no rule: what is wanted is granted
    for (holder& h : hs) {
      const std::int64_t held = std::max(h.held, h.want);
      held_ += held - h.held;
      set(h, held, held);
      h.asked_us = 0;
    }
    return;
  }
  for (holder& h : hs) {
    if (h.want > h.held && h.asked_us == 0) h.asked_us = now_us;
  }
  // Max-min fair shares of the limit over the wants (water-filling; the
  // remainder of an even split goes to those that asked first).
  std::vector<std::size_t> order(hs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (hs[a].want != hs[b].want) return hs[a].want < hs[b].want;
    return hs[a].asked_us > hs[b].asked_us;
  });
  std::vector<std::int64_t> share(hs.size());
  std::int64_t left = e.limit;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto n = static_cast<std::int64_t>(order.size() - i);
    share[order[i]] = std::min(hs[order[i]].want, left / n);
    left -= share[order[i]];
  }
  for (std::size_t i = order.size(); i-- > 0 && left > 0;) {  // the remainder
    const std::size_t k = order[i];
    if (share[k] < hs[k].want) {
      ++share[k];
      --left;
    }
  }
  // Free slots to those waiting, first come first served: up to the share, then beyond.
  std::int64_t free = e.limit;
  for (const holder& h : hs) free -= h.held;
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
      const std::int64_t give = std::min(free, room - h.held);
      if (give <= 0) continue;
      held_ += give;
      free -= give;
      set(h, h.held + give, h.held + give);
    }
  }
  // Caps: while some holder waits, or more is held than the limit (claims
  // after a comeback, a lower limit after a reload), each keeps its share.
  bool starving = free < 0;
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
  if (hs.empty()) entries_.erase(it);
}

std::int64_t leases::held_by(std::string_view domain, std::string_view identifier) const {
  const auto it = entries_.find(key_of(domain, identifier));
  if (it == entries_.end()) return -1;
  std::int64_t n = 0;
  for (const holder& h : it->second.holders) n += h.held;
  return n;
}

}  // namespace smockron::master
