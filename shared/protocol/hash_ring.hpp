// Consistent hashing with virtual nodes, as Gubernator spreads keys over its
// peers: each share (a master, or a group of redundant masters) owns the keys
// that hash between its points on a ring and the points before them. Adding
// or removing a share moves only the keys it gains or held. The hash is fixed
// (FNV-1a, 64 bits, with a final mix) so that every gatekeeper, whatever its
// build or platform, sends an identifier to the same master.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smockron {

/// FNV-1a 64 over `s`, then splitmix64's finalizer (FNV alone clusters short, similar keys).
std::uint64_t stable_hash(std::string_view s);

class hash_ring {
public:
  static constexpr int k_virtual_nodes = 160;

  /// `shares`: each share's name (its first master's endpoint); where they
  /// land depends on the names only, never on their order.
  explicit hash_ring(const std::vector<std::string>& shares);

  /// The index (in the constructor's list) of the share that owns `key`.
  std::size_t owner(std::string_view key) const;
  std::size_t shares() const { return shares_; }

private:
  std::vector<std::pair<std::uint64_t, std::uint32_t>> points_;  ///< sorted by position
  std::size_t shares_ = 0;
};

}  // namespace smockron
