// Space-Saving heavy hitters of limited identifiers (see top.hpp).
#include "master/engine/top.hpp"

#include <algorithm>

namespace smockron::master {

void space_saving::add(std::string_view key) {
  if (const auto it = index_.find(key); it != index_.end()) {
    ++items_[it->second].count;
    return;
  }
  if (items_.size() < capacity_) {
    index_.emplace(std::string(key), items_.size());
    items_.push_back({std::string(key), 1, 0});
    return;
  }
  if (capacity_ == 0) return;
  // The key counted least gives its place; the newcomer inherits its count
  // (as error: it may have been limited that often unseen).
  while (!least_.empty() && items_[least_.back()].count != min_count_) least_.pop_back();
  if (least_.empty()) {  // one scan per level of the minimum: amortized O(1) per replacement
    min_count_ = std::min_element(items_.begin(), items_.end(), [](const item& a, const item& b) {
                   return a.count < b.count;
                 })->count;
    for (std::size_t i = items_.size(); i-- > 0;) {
      if (items_[i].count == min_count_) least_.push_back(i);
    }
  }
  item& least = items_[least_.back()];
  least_.pop_back();
  index_.erase(index_.find(least.key));
  least.error = least.count;
  ++least.count;
  least.key.assign(key);
  index_.emplace(least.key, static_cast<std::size_t>(&least - items_.data()));
}

void space_saving::clear() {
  items_.clear();
  index_.clear();
  least_.clear();
}

top_limited::top_limited(std::size_t domains, std::size_t capacity) : capacity_(capacity) { reset(domains); }

void top_limited::reset(std::size_t domains) {
  domains_.clear();
  domains_.reserve(domains);
  for (std::size_t i = 0; i < domains; ++i) domains_.push_back({0, space_saving(capacity_), space_saving(capacity_)});
}

top_limited::halves& top_limited::at(std::size_t domain, std::int64_t now_us) {
  halves& h = domains_[domain];
  const std::int64_t half = now_us / k_half_us;
  if (half != h.half) {
    if (half == h.half + 1) std::swap(h.last, h.current);
    else h.last.clear();  // more than a half minute without a limited use: nothing recent
    h.current.clear();
    h.half = half;
  }
  return h;
}

void top_limited::limited(std::size_t domain, std::string_view identifier, std::int64_t now_us) {
  if (domain < domains_.size()) at(domain, now_us).current.add(identifier);
}

std::vector<top_limited::entry> top_limited::top(std::size_t domain, std::size_t n, std::int64_t now_us) const {
  std::vector<entry> out;
  if (domain >= domains_.size()) return out;
  const halves& h = domains_[domain];
  const std::int64_t half = now_us / k_half_us;
  // The halves as of now: `current` is the last one when a half has begun since.
  const space_saving* parts[2] = {nullptr, nullptr};
  if (half == h.half) parts[0] = &h.current, parts[1] = &h.last;
  else if (half == h.half + 1) parts[0] = &h.current;
  string_map<std::size_t> at;
  for (const space_saving* p : parts) {
    if (p == nullptr) continue;
    for (const auto& it : p->items()) {
      auto [pos, fresh] = at.try_emplace(it.key, out.size());
      if (fresh) out.push_back({it.key, 0, 0});
      out[pos->second].limited += it.count;
      out[pos->second].error += it.error;
    }
  }
  std::sort(out.begin(), out.end(), [](const entry& a, const entry& b) {
    return a.limited != b.limited ? a.limited > b.limited : a.identifier < b.identifier;
  });
  if (out.size() > n) out.resize(n);
  return out;
}

}  // namespace smockron::master
