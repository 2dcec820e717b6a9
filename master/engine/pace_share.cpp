// Pace share (see pace_share.hpp).
#include "master/engine/pace_share.hpp"

#include <algorithm>

namespace smockron::master {

std::size_t pace_share::seen(std::size_t domain, std::string_view identifier, std::uint64_t gatekeeper,
                             std::int64_t now_us) {
  key_.assign(reinterpret_cast<const char*>(&domain), 4);  // (domains are few: 4 bytes of the index are enough)
  key_.append(identifier);
  auto it = clients_.find(std::string_view(key_));
  if (it == clients_.end()) {
    if (clients_.size() >= k_max_clients) return 1;
    it = clients_.emplace(key_, std::vector<sighting>{}).first;
  }
  auto& seen = it->second;
  std::erase_if(seen, [&](const sighting& s) { return now_us - s.at_us > k_window_us; });
  const auto mine =
      std::find_if(seen.begin(), seen.end(), [&](const sighting& s) { return s.gatekeeper == gatekeeper; });
  if (mine != seen.end()) mine->at_us = std::max(mine->at_us, now_us);
  else if (seen.size() < k_max_gatekeepers) seen.push_back({gatekeeper, now_us});
  return std::max<std::size_t>(1, seen.size());
}

void pace_share::sweep(std::int64_t now_us) {
  std::erase_if(clients_, [&](const auto& kv) {
    return std::none_of(kv.second.begin(), kv.second.end(),
                        [&](const sighting& s) { return now_us - s.at_us <= k_window_us; });
  });
}

}  // namespace smockron::master
