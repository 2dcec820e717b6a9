// Open reservations per gatekeeper connection (see reservations.hpp).
#include "master/engine/reservations.hpp"

#include <functional>

namespace smockron::master {

std::size_t reservations::key_hash::operator()(const key& k) const {
  const std::size_t h = std::hash<std::string_view>{}(k.identifier) * 31 + std::hash<std::string_view>{}(k.domain);
  return h ^ (std::hash<std::uint64_t>{}(k.peer) * 0x9E3779B97F4A7C15ULL) ^ std::hash<std::int64_t>{}(k.at_ms);
}

bool reservations::open(reservation r) {
  if (order_.size() >= max_open_) return false;
  order_.push_back(std::move(r));
  const auto it = std::prev(order_.end());
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

std::optional<std::int64_t> reservations::close(std::uint64_t peer, std::string_view domain,
                                                std::string_view identifier, std::int64_t at_ms) {
  auto [lo, hi] = index_.equal_range(key{peer, domain, identifier, at_ms});
  if (lo == hi) return std::nullopt;
  auto first = lo;
  for (; lo != hi; ++lo) {
    if (lo->second.seq < first->second.seq) first = lo;
  }
  return take(first->second.it).units;
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

}  // namespace smockron::master
