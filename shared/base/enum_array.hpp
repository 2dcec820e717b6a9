// An array indexed by an enum class whose values are 0..N-1: counters by
// status, by decision, by command, without casts (or a literal size and a
// comment) at each use.
#pragma once

#include <array>
#include <cstddef>

namespace smockron {

template <class Enum, class T, std::size_t N>
class enum_array {
public:
  T& operator[](Enum e) { return items_[static_cast<std::size_t>(e)]; }
  const T& operator[](Enum e) const { return items_[static_cast<std::size_t>(e)]; }
  static constexpr std::size_t size() { return N; }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

private:
  std::array<T, N> items_{};
};

}  // namespace smockron
