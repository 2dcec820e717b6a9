// Pace share (see pace_share.hpp).
#include "master/engine/pace_share.hpp"

#include <algorithm>

namespace smockron::master {
namespace {
// `s`'s counts rolled forward to the window starting at `window_us`.
void roll(auto& s, std::int64_t window_us) {
  if (s.window_us == window_us) return;
  s.previous = s.window_us == window_us - pace_share::k_window_us ? s.current : 0;
  s.current = 0;
  s.window_us = window_us;
}
}  // namespace

double pace_share::seen(std::size_t domain, std::string_view identifier, std::uint64_t gatekeeper,
                        std::int64_t now_us) {
  key_.assign(reinterpret_cast<const char*>(&domain), 4);  // (domains are few: 4 bytes of the index are enough)
  key_.append(identifier);
  auto it = clients_.find(std::string_view(key_));
  if (it == clients_.end()) {
    if (clients_.size() >= k_max_clients) return 1;
    it = clients_.emplace(key_, std::vector<sighting>{}).first;
  }
  auto& seen = it->second;
  const std::int64_t window = now_us - now_us % k_window_us;
  // (A message stamped before a later one already counted is counted in the later's window.)
  bool mine = false;
  for (auto& s : seen) {
    if (s.window_us < window) roll(s, window);
    if (s.gatekeeper == gatekeeper) {
      ++s.current;
      mine = true;
    }
  }
  std::erase_if(seen, [](const sighting& s) { return s.previous == 0 && s.current == 0; });
  if (!mine && seen.size() < k_max_gatekeepers) seen.push_back({gatekeeper, window, 0, 1});
  // The sliding window's count of each: the previous window's share still covered, and this one's.
  const double covered = 1.0 - static_cast<double>(now_us - window) / static_cast<double>(k_window_us);
  double sum = 0, squares = 0;
  for (const auto& s : seen) {
    const double n = s.previous * covered + s.current;
    sum += n;
    squares += n * n;
  }
  return squares > 0 ? std::max(1.0, sum * sum / squares) : 1.0;
}

void pace_share::sweep(std::int64_t now_us) {
  const std::int64_t window = now_us - now_us % k_window_us;
  std::erase_if(clients_, [&](const auto& kv) {
    return std::none_of(kv.second.begin(), kv.second.end(),
                        [&](const sighting& s) { return s.window_us >= window - k_window_us && s.current > 0; });
  });
}

}  // namespace smockron::master
