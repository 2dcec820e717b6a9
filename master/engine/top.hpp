// Who is limited now (the admin endpoint's GET /top): per domain, the
// identifiers limited most in the last minute, in bounded memory whatever the
// number of identifiers.
//
// A Space-Saving summary (Metwally, Agrawal, El Abbadi 2005) per domain and
// per half minute: `capacity` counters. An identifier not counted yet takes
// the place of the one counted least and starts from its count, which it
// keeps as its possible error; so every identifier limited more often than
// 1/capacity of the half minute's limited uses is in the summary, and its
// count is at most `error` too high. The current half and the last are
// summed: the window is the last 30 to 60 seconds. Single-threaded (the
// accounting loop).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/string_hash.hpp"

namespace smockron::master {

class space_saving {
public:
  explicit space_saving(std::size_t capacity) : capacity_(capacity) {}

  struct item {
    std::string key;
    std::uint64_t count = 0;
    std::uint64_t error = 0;  ///< how much of `count` may belong to keys it replaced
  };
  /// Counts one occurrence of `key`.
  void add(std::string_view key);
  const std::vector<item>& items() const { return items_; }
  void clear();

private:
  std::size_t capacity_;
  std::vector<item> items_;
  string_map<std::size_t> index_;  ///< key -> position in items_
  // The items counted least, found without a scan per replacement: positions
  // whose count was min_count_ when listed (one whose count has grown since is
  // skipped when taken); refilled by one scan when none is left.
  std::vector<std::size_t> least_;
  std::uint64_t min_count_ = 0;
};

class top_limited {
public:
  /// Half of the window: the summaries turn over every 30 s.
  static constexpr std::int64_t k_half_us = 30'000'000;

  top_limited(std::size_t domains, std::size_t capacity);

  /// A use of `identifier` in `domain` was limited at `now_us` (DELAYED or
  /// REJECTED at a gatekeeper, or a use after which the master published
  /// DELAY_UNTIL).
  void limited(std::size_t domain, std::string_view identifier, std::int64_t now_us);

  struct entry {
    std::string identifier;
    std::uint64_t limited = 0;  ///< limited uses in the window (at most `error` too many)
    std::uint64_t error = 0;
  };
  /// The `n` identifiers of `domain` limited most in the window holding `now_us`, most first.
  std::vector<entry> top(std::size_t domain, std::size_t n, std::int64_t now_us) const;

  /// Starts afresh for `domains` domains (after a reload).
  void reset(std::size_t domains);
  std::size_t capacity() const { return capacity_; }

private:
  struct halves {
    std::int64_t half = 0;  ///< which half minute `current` counts (now / k_half_us)
    space_saving current, last;
  };
  halves& at(std::size_t domain, std::int64_t now_us);

  std::size_t capacity_;
  std::vector<halves> domains_;
};

}  // namespace smockron::master
