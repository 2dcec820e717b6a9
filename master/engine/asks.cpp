// The GOs of exact admission (see asks.hpp).
#include "master/engine/asks.hpp"

#include <algorithm>

namespace smockron::master {

const std::string& asks::key(std::string_view domain, std::string_view identifier) const {
  key_.assign(domain).push_back('\0');
  key_.append(identifier);
  return key_;
}

std::int64_t asks::open_units(std::string_view domain, std::string_view identifier) const {
  if (entries_.empty()) return 0;
  const auto it = entries_.find(key(domain, identifier));
  return it == entries_.end() ? 0 : it->second.units;
}

bool asks::open(std::uint64_t peer, std::string_view domain, std::string_view identifier, std::int64_t seq,
                std::int64_t cost, std::int64_t now_us) {
  auto it = entries_.find(key(domain, identifier));
  if (it == entries_.end()) {
    if (entries_.size() >= max_entries_) return false;
    it = entries_.emplace(key_, entry{}).first;
  }
  it->second.items.push_back({peer, seq, cost, now_us});
  it->second.units += cost;
  units_ += cost;
  return true;
}

std::optional<std::int64_t> asks::settle(std::uint64_t peer, std::string_view domain, std::string_view identifier,
                                         std::int64_t seq) {
  if (entries_.empty()) return std::nullopt;
  const auto it = entries_.find(key(domain, identifier));
  if (it == entries_.end()) return std::nullopt;
  auto& items = it->second.items;
  const auto go =
      std::find_if(items.begin(), items.end(), [&](const item& i) { return i.peer == peer && i.seq == seq; });
  if (go == items.end()) return std::nullopt;
  const std::int64_t since = go->since_us;
  it->second.units -= go->cost;
  units_ -= go->cost;
  items.erase(go);
  if (items.empty()) entries_.erase(it);
  return since;
}

template <class F>
std::size_t asks::drop_if(F&& drop) {
  std::size_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& items = it->second.items;
    for (auto i = items.begin(); i != items.end();) {
      if (!drop(*i)) {
        ++i;
        continue;
      }
      it->second.units -= i->cost;
      units_ -= i->cost;
      i = items.erase(i);
      ++n;
    }
    it = items.empty() ? entries_.erase(it) : std::next(it);
  }
  return n;
}

std::size_t asks::peer_closed(std::uint64_t peer) {
  return drop_if([&](const item& i) { return i.peer == peer; });
}

std::size_t asks::expire(std::int64_t now_us) {
  return drop_if([&](const item& i) { return now_us - i.since_us >= k_ttl_us; });
}

}  // namespace smockron::master
