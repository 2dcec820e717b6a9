// Open reservations per gatekeeper connection (see reservations.hpp).
#include "master/engine/reservations.hpp"

#include <functional>

namespace smockron::master {

std::size_t reservations::key_hash::operator()(const key& k) const {
  const std::size_t h = std::hash<std::string_view>{}(k.identifier) * 31 + std::hash<std::string_view>{}(k.domain);
  return h ^ (std::hash<std::uint64_t>{}(k.peer) * 0x9E3779B97F4A7C15ULL) ^ std::hash<std::int64_t>{}(k.at_ms);
}

const reservations::reservation* reservations::open(reservation r) {
  if (order_.size() >= max_open_) return nullptr;
  order_.push_back(std::move(r));
  const auto it = std::prev(order_.end());
  index_.emplace(key_of(*it), slot{++seq_, it});
  return &*it;
}

bool reservations::restore(reservation r) {
  if (order_.size() >= max_open_) return false;
  r.peer = k_restored;
  // Restored before this run's own (the store is read before accounting is
  // taken), oldest first: take_older() stops at the first one too young.
  auto at = order_.begin();
  while (at != order_.end() && at->peer == k_restored && at->opened_us <= r.opened_us) ++at;
  const auto it = order_.insert(at, std::move(r));
  index_.emplace(key_of(*it), slot{++seq_, it});
  return true;
}

reservations::reservation reservations::take(list::iterator it) {
  // The index entry of this very node (several reservations may share a key).
  auto [lo, hi] = index_.equal_range(key_of(*it));
  for (; lo != hi; ++lo) {
    if (lo->second.it == it) {
      index_.erase(lo);
      break;
    }
  }
  reservation r = std::move(*it);
  order_.erase(it);
  return r;
}

std::optional<reservations::reservation> reservations::close(std::uint64_t peer, std::string_view domain,
                                                             std::string_view identifier, std::int64_t at_ms) {
  for (const std::uint64_t p : {peer, k_restored}) {
    auto [lo, hi] = index_.equal_range(key{p, domain, identifier, at_ms});
    if (lo == hi) continue;
    auto first = lo;
    for (; lo != hi; ++lo) {
      if (lo->second.seq < first->second.seq) first = lo;
    }
    return take(first->second.it);
  }
  return std::nullopt;
}

std::vector<reservations::reservation> reservations::take_peer(std::uint64_t peer) {
  std::vector<reservation> out;
  for (auto it = order_.begin(); it != order_.end();) {
    const auto next = std::next(it);
    if (it->peer == peer) out.push_back(take(it));
    it = next;
  }
  return out;
}

std::vector<reservations::reservation> reservations::take_older(std::int64_t before_us, std::size_t budget) {
  std::vector<reservation> out;
  while (!order_.empty() && out.size() < budget && order_.front().opened_us < before_us) {
    out.push_back(take(order_.begin()));
  }
  return out;
}

void reservations::remember_released(const reservation& r) {
  if (released_.size() >= k_max_released) {
    const auto oldest = released_.begin();
    auto [lo, hi] = released_index_.equal_range(key{0, oldest->domain, oldest->identifier, oldest->at_ms});
    for (; lo != hi; ++lo) {
      if (lo->second == oldest) {
        released_index_.erase(lo);
        break;
      }
    }
    released_.erase(oldest);
  }
  released_.push_back(r);
  const auto it = std::prev(released_.end());
  released_index_.emplace(key{0, it->domain, it->identifier, it->at_ms}, it);
}

std::optional<std::int64_t> reservations::take_released(std::string_view domain, std::string_view identifier,
                                                        std::int64_t at_ms) {
  auto [lo, hi] = released_index_.equal_range(key{0, domain, identifier, at_ms});
  if (lo == hi) return std::nullopt;
  // The oldest: the one released first (its node comes first in released_).
  auto first = lo;
  for (auto i = lo; i != hi; ++i) {
    if (i->second->opened_us < first->second->opened_us) first = i;
  }
  const auto node = first->second;
  const std::int64_t units = node->units;
  released_index_.erase(first);
  released_.erase(node);
  return units;
}

}  // namespace smockron::master
