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

void asks::pending(std::string_view domain, std::string_view identifier, std::vector<rules::event>& out) const {
  out.clear();
  if (entries_.empty()) return;
  const auto it = entries_.find(key(domain, identifier));
  if (it == entries_.end()) return;
  for (const item& i : it->second.items) out.push_back({rules::event_kind::accepted, i.expected_us, i.cost});
  // (Nearly sorted already: each GO is placed behind those before it, but
  // for a GO for now on a connection of smaller lag.)
  std::stable_sort(out.begin(), out.end(),
                   [](const rules::event& a, const rules::event& b) { return a.at_us < b.at_us; });
}

std::int64_t asks::lag_us(std::uint64_t peer) const {
  const auto it = lags_.find(peer);
  return it == lags_.end() ? 0 : it->second;
}

bool asks::open(std::uint64_t peer, std::string_view domain, std::string_view identifier, std::int64_t seq,
                std::int64_t cost, std::int64_t now_us, std::int64_t at_us, std::int64_t expected_us) {
  auto it = entries_.find(key(domain, identifier));
  if (it == entries_.end()) {
    if (entries_.size() >= max_entries_) return false;
    it = entries_.emplace(key_, entry{}).first;
  }
  it->second.items.push_back({peer, seq, cost, now_us, at_us, expected_us});
  it->second.units += cost;
  units_ += cost;
  return true;
}

std::optional<std::int64_t> asks::settle(std::uint64_t peer, std::string_view domain, std::string_view identifier,
                                         std::int64_t seq, std::int64_t went_us) {
  if (entries_.empty()) return std::nullopt;
  const auto it = entries_.find(key(domain, identifier));
  if (it == entries_.end()) return std::nullopt;
  auto& items = it->second.items;
  const auto go =
      std::find_if(items.begin(), items.end(), [&](const item& i) { return i.peer == peer && i.seq == seq; });
  if (go == items.end()) return std::nullopt;
  const std::int64_t expected = go->expected_us;
  // The lag: how long after the GO its request went, when it went on the
  // answer's arrival (a GO for now, or one that came after its time; one
  // that waited for its time says only that the answer came sooner).
  if (go->at_us == 0 || went_us > go->at_us + 1'000) {
    const std::int64_t seen = std::clamp<std::int64_t>(went_us - go->given_us, 0, k_max_lag_us);
    std::int64_t& lag = lags_[peer];
    lag = seen >= lag ? seen : lag - (lag - seen) / 16;
  }
  it->second.units -= go->cost;
  units_ -= go->cost;
  items.erase(go);
  if (items.empty()) entries_.erase(it);
  return expected;
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
  lags_.erase(peer);
  return drop_if([&](const item& i) { return i.peer == peer; });
}

std::size_t asks::expire(std::int64_t now_us) {
  return drop_if([&](const item& i) { return now_us - i.given_us >= k_ttl_us; });
}

}  // namespace smockron::master
