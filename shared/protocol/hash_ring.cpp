// Consistent hashing (see hash_ring.hpp).
#include "shared/protocol/hash_ring.hpp"

#include <algorithm>

namespace smockron {

std::uint64_t stable_hash(std::string_view s) {
  std::uint64_t h = 14695981039346656037ULL;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

hash_ring::hash_ring(const std::vector<std::string>& shares) : shares_(shares.size()) {
  points_.reserve(shares.size() * k_virtual_nodes);
  for (std::size_t s = 0; s < shares.size(); ++s) {
    for (int v = 0; v < k_virtual_nodes; ++v) {
      points_.emplace_back(stable_hash(shares[s] + "#" + std::to_string(v)), static_cast<std::uint32_t>(s));
    }
  }
  // Ties (vanishingly rare) go to the smaller name: still independent of the order given.
  std::sort(points_.begin(), points_.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : shares[a.second] < shares[b.second];
  });
}

std::size_t hash_ring::owner(std::string_view key) const {
  if (points_.empty()) return 0;
  const std::uint64_t h = stable_hash(key);
  auto it =
      std::lower_bound(points_.begin(), points_.end(), h, [](const auto& p, std::uint64_t x) { return p.first < x; });
  if (it == points_.end()) it = points_.begin();  // the ring wraps
  return it->second;
}

}  // namespace smockron
