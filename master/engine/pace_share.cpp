// Pace share (see pace_share.hpp).
#include "master/engine/pace_share.hpp"

#include <algorithm>
#include <iterator>

namespace smockron::master {

void pace_share::make_key(std::size_t domain, std::string_view identifier) {
  const auto d = static_cast<std::uint32_t>(domain);  // (domains are few)
  key_.assign(reinterpret_cast<const char*>(&d), sizeof d);
  key_.append(identifier);
}

void pace_share::roll_all(std::vector<sighting>& seen, std::int64_t window) {
  for (auto& s : seen) {
    if (s.window_us == window) continue;
    // The window before this one carries on; anything else (older, or a
    // wall clock stepped back) counts no more.
    s.previous = s.window_us == window - k_window_us ? s.current : 0;
    s.current = 0;
    s.window_us = window;
  }
  std::erase_if(seen, [](const sighting& s) { return s.previous == 0 && s.current == 0; });
}

double pace_share::effective(const std::vector<sighting>& seen, std::int64_t window, std::int64_t now_us) {
  // The sliding window's count of each: the part of the previous window it still covers, and this one.
  const double covered = 1.0 - static_cast<double>(now_us - window) / static_cast<double>(k_window_us);
  double sum = 0, squares = 0;
  for (const auto& s : seen) {
    const double n = s.previous * covered + s.current;
    sum += n;
    squares += n * n;
  }
  return squares > 0 ? std::max(1.0, sum * sum / squares) : 1.0;
}

double pace_share::seen(std::size_t domain, std::string_view identifier, std::uint64_t gatekeeper,
                        std::int64_t now_us) {
  make_key(domain, identifier);
  auto it = clients_.find(std::string_view(key_));
  if (it == clients_.end()) {
    if (clients_.size() >= k_max_clients) return 1;
    it = clients_.emplace(key_, std::vector<sighting>{}).first;
  }
  auto& seen = it->second;
  const std::int64_t window = now_us - now_us % k_window_us;
  roll_all(seen, window);
  const auto mine =
      std::find_if(seen.begin(), seen.end(), [&](const sighting& s) { return s.gatekeeper == gatekeeper; });
  if (mine != seen.end()) ++mine->current;
  else if (seen.size() < k_max_gatekeepers) seen.push_back({gatekeeper, window, 0, 1});
  return effective(seen, window, now_us);
}

double pace_share::count(std::size_t domain, std::string_view identifier, std::int64_t now_us) {
  make_key(domain, identifier);
  const auto it = clients_.find(std::string_view(key_));
  if (it == clients_.end()) return 1;
  const std::int64_t window = now_us - now_us % k_window_us;
  roll_all(it->second, window);
  return effective(it->second, window, now_us);
}

void pace_share::sweep(std::int64_t now_us) {
  const std::int64_t window = now_us - now_us % k_window_us;
  for (auto it = clients_.begin(); it != clients_.end();) {
    roll_all(it->second, window);
    it = it->second.empty() ? clients_.erase(it) : std::next(it);
  }
}

void pace_share::forget(std::uint64_t gatekeeper) {
  for (auto it = clients_.begin(); it != clients_.end();) {
    std::erase_if(it->second, [&](const sighting& s) { return s.gatekeeper == gatekeeper; });
    it = it->second.empty() ? clients_.erase(it) : std::next(it);
  }
}

}  // namespace smockron::master
