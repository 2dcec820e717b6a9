// Transparent string hashing so maps keyed by std::string can be searched
// with a std::string_view (no temporary string per lookup).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace smockron {

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

/// unordered_map<std::string, V> searchable by string_view.
template <class V>
using string_map = std::unordered_map<std::string, V, string_hash, std::equal_to<>>;

}  // namespace smockron
