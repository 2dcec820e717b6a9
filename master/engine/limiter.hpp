// The master's in-memory store: rule state per (domain, identifier), with a
// hard cap on tracked identifiers (least recently used evicted) and bounded
// sweeps of expired state. One atomic operation: apply(). Single-threaded.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "master/core/rules.hpp"
#include "master/engine/flat_index.hpp"
#include "shared/base/string_hash.hpp"
#include "shared/config/config.hpp"

namespace smockron::master {

/// The engine's form of a domain's rules (its algorithm, the allowed clock skew).
rules::limits compile(const config::domain_config& d, std::chrono::microseconds max_clock_skew);
/// The engine's form of one override's rules (the domain's algorithm).
rules::limits compile(const config::domain_config& d, const config::override_config& o,
                      std::chrono::microseconds max_clock_skew);
/// The engine's form of one tier's rules (the domain's algorithm).
rules::limits compile(const config::domain_config& d, const config::tier_config& t,
                      std::chrono::microseconds max_clock_skew);

/// A domain's limits, the identifiers that have limits of their own (the
/// per-identifier overrides) and its tiers (rules a request selects by
/// name); one algorithm.
struct domain_limits {
  rules::limits base;
  string_map<rules::limits> overrides;
  /// Sorted by name; never resized once built (states point into it).
  std::vector<std::pair<std::string, rules::limits>> tiers;

  domain_limits() = default;
  domain_limits(rules::limits b) : base(std::move(b)) {}  // NOLINT: a domain without overrides
  /// The limits that apply to `identifier` when its requests name no tier.
  const rules::limits& of(std::string_view identifier) const {
    if (overrides.empty()) return base;
    const auto it = overrides.find(identifier);
    return it == overrides.end() ? base : it->second;
  }
  /// The limits that apply to `identifier` when its request names `tier`:
  /// its override, else the tier's, else (no tier, or one the domain does
  /// not have) the domain's.
  const rules::limits& of(std::string_view identifier, std::string_view tier) const {
    if (!overrides.empty()) {
      if (const auto it = overrides.find(identifier); it != overrides.end()) return it->second;
    }
    const rules::limits* t = find_tier(tier);
    return t != nullptr ? *t : base;
  }
  const rules::limits* find_tier(std::string_view name) const {
    if (name.empty() || tiers.empty()) return nullptr;
    const auto it = std::lower_bound(tiers.begin(), tiers.end(), name,
                                     [](const auto& t, std::string_view n) { return t.first < n; });
    return it != tiers.end() && it->first == name ? &it->second : nullptr;
  }
  /// The name of the tier `l` points into (empty: none of them).
  std::string_view tier_of(const rules::limits* l) const {
    for (const auto& [name, t] : tiers) {
      if (&t == l) return name;
    }
    return {};
  }
};

class limiter {
public:
  limiter(std::vector<domain_limits> domains, std::size_t max_identifiers);
  limiter(const limiter&) = delete;
  limiter& operator=(const limiter&) = delete;
  ~limiter();

  /// Records `e` for (domain, identifier) and returns the decision. A use
  /// (accepted, delayed) names the request's `tier` (empty: none): in a
  /// domain with tiers the identifier is judged by that tier's rules from
  /// then on (domain_limits::of), its state kept when they have the same
  /// shape. Refusals and adjustments keep the rules in force.
  rules::decision apply(std::size_t domain, std::string_view identifier, rules::event e, std::int64_t now_us,
                        std::string_view tier = {});

  /// How long past the time it stops mattering (rules::expires_at_us) a
  /// state is kept: a use may reach the master this long after its
  /// timestamp (transit, batching, a gatekeeper's clock behind ours) and is
  /// still charged on top of the uses before it, not from nothing.
  static constexpr std::int64_t k_late_us = 2'000'000;

  /// Removes state expired k_late_us ago, examining at most `budget`
  /// entries, resuming where the previous sweep stopped. Returns how many
  /// were removed.
  std::size_t sweep(std::int64_t now_us, std::size_t budget);

  /// Replaces the domains. `old_index[i]` is the index new domain i had before
  /// (its state is kept) or nullopt (it starts empty). Dropped domains lose
  /// their state; a state whose limits changed algorithm or rule count (an
  /// override added or removed included) starts afresh.
  void reconfigure(std::vector<domain_limits> domains, const std::vector<std::optional<std::size_t>>& old_index);

  /// The limits that apply to (domain, identifier) when it names no tier.
  const rules::limits& limits_of(std::size_t domain, std::string_view identifier) const {
    return limits_[domain].of(identifier);
  }
  /// The limits that apply to (domain, identifier) naming `tier`.
  const rules::limits& limits_of(std::size_t domain, std::string_view identifier, std::string_view tier) const {
    return limits_[domain].of(identifier, tier);
  }
  /// The limits (domain, identifier) is judged by now: those of the tier its
  /// last use named, or limits_of() when it has no state.
  const rules::limits& current_limits(std::size_t domain, std::string_view identifier) const;
  const domain_limits& limits(std::size_t domain) const { return limits_[domain]; }

  /// Changes the cap; evicts least recently used state at once if over it.
  void set_max_identifiers(std::size_t max_identifiers);

  std::size_t tracked() const { return size_; }
  std::size_t tracked(std::size_t domain) const { return maps_[domain].size(); }
  std::uint64_t evictions() const { return evictions_; }

  // Write-behind support for a persistent store. Once tracking is on, every
  // recorded event marks its entry dirty (once: a busy identifier is written
  // once per flush however many messages it had); drain_dirty() hands out the
  // oldest dirty entries. Entries that are erased leave the dirty list.
  void track_dirty();
  std::size_t dirty() const { return dirty_count_; }
  /// Marks every entry dirty (the store lost or may have lost what it had).
  void mark_all_dirty();
  /// Calls f(domain, identifier, state, limits) for up to `max` dirty
  /// entries, oldest first, and unmarks them; `limits`: those the state is
  /// judged by (its tier's or its override's, when it has them).
  template <class F>
  std::size_t drain_dirty(std::size_t max, F&& f) {
    std::size_t n = 0;
    while (n < max && dirty_head_) {
      entry* e = dirty_head_;
      unmark(e);
      f(e->domain, std::string_view(e->key), static_cast<const rules::state&>(e->st), *e->lim);
      ++n;
    }
    return n;
  }
  /// Folds a state read back from the store into memory (see rules::merge),
  /// judged by `tier`'s limits (the tier its uses named; empty: none) until
  /// its next use. Returns false when it was not taken: expired (k_late_us
  /// ago), of another shape, or the cap is reached.
  bool restore(std::size_t domain, std::string_view identifier, const rules::state& st, std::int64_t now_us,
               std::string_view tier = {});

  std::uint64_t expirations() const { return expirations_; }
  const rules::state* find(std::size_t domain, std::string_view identifier) const;
  /// Starts (domain, identifier) afresh: its uses forgotten (written to the
  /// store as such). Its rules changed at run time (the override API).
  void reset(std::size_t domain, std::string_view identifier);

  /// What happened to an identifier while its state has been kept: every
  /// accounting message and query use (`n_req`), those over the limit
  /// (DELAYED or REJECTED at a gatekeeper, a query answered "Y"), and the
  /// highest window use a query reported (the query protocol's get_stats).
  struct stats {
    std::uint32_t n_req = 0, n_over = 0, max_rate = 0;
    // Uses (ACCEPTED, DELAYED, queries) and refusals (REJECTED, queries
    // answered "Y") in this half minute [0] and the last [1] (GET /top).
    std::int64_t half = 0;
    std::uint32_t uses[2] = {0, 0};
    std::uint32_t refusals[2] = {0, 0};
    /// Counts one use (or refusal) at `now_us`.
    void count(bool refused, std::int64_t now_us);
    /// Uses and refusals in the last 30 to 60 s as of `now_us`.
    std::pair<std::uint32_t, std::uint32_t> last_minute(std::int64_t now_us) const;
  };
  stats find_stats(std::size_t domain, std::string_view identifier) const;
  /// A query's use: recorded as an accepted use at `now_us` unless the
  /// identifier is over its limit now (then nothing is recorded, as for a
  /// request a gatekeeper refuses). The caller notes the window use it
  /// reports in `counts->max_rate`.
  struct query_use {
    bool over = false;
    rules::decision after;  ///< the decision once the use is recorded (throttled: publish DELAY_UNTIL)
    // The identifier's state, limits and counts (valid until the next change to the limiter).
    const rules::state* st = nullptr;
    const rules::limits* lim = nullptr;
    stats* counts = nullptr;
  };
  query_use use(std::size_t domain, std::string_view identifier, std::int64_t now_us);
  /// A use of `cost` units asked of the master directly (Envoy's rate limit
  /// service, master/envoy/), decided as a gatekeeper decides a known cost:
  /// recorded as an accepted use at `now_us` when the units fit under every
  /// rule and quota now (`fits`); else nothing is recorded and it is counted
  /// as refused (`never`: more than a rule's burst or a quota's limit, so it
  /// can never fit). `force` records it with no verdict (`fits` true: the
  /// caller probed first, or the uses already happened); `probe`
  /// records and counts nothing (is the state as it is: pointers null when
  /// the identifier has none). A use of 0 units records nothing. The
  /// pointers as for use().
  struct charge_use {
    bool fits = false;
    bool never = false;
    rules::decision after;  ///< the decision once recorded (or now, when not)
    const rules::state* st = nullptr;
    const rules::limits* lim = nullptr;
    stats* counts = nullptr;
  };
  enum class charge_mode : std::uint8_t { charge, force, probe };
  /// When `cost` units of (domain, identifier), its request naming `tier`,
  /// fit under every rule and quota (rules::fits_at: INT64_MAX never).
  /// Nothing is recorded.
  std::int64_t fits_at(std::size_t domain, std::string_view identifier, std::int64_t cost, std::int64_t now_us,
                       std::string_view tier = {}) const;
  charge_use charge(std::size_t domain, std::string_view identifier, std::int64_t cost, std::int64_t now_us,
                    charge_mode mode = charge_mode::charge);

private:
  // The state lives inside the hash map's node (stable address): one lookup,
  // no separate allocation; the LRU list links those nodes.
  struct entry {
    rules::state st;
    const rules::limits* lim = nullptr;  ///< limits_of(domain, key), looked up once
    std::size_t domain = 0;
    std::string key;  ///< the identifier (set by the index)
    entry* prev = nullptr;
    entry* next = nullptr;
    entry* dirty_prev = nullptr;
    entry* dirty_next = nullptr;
    bool dirty = false;
    stats counts;
  };
  using map = flat_index<entry>;

  /// The entry of (domain, identifier), made most recently used; created
  /// (evicting the least recently used at the cap) when `create`, else null if absent.
  entry* touch(std::size_t domain, std::string_view identifier, bool create);
  rules::decision record(entry* en, rules::event e, std::int64_t now_us);
  /// Moves an entry to other limits: state of another shape starts afresh.
  static void rejudge(entry& en, const rules::limits* next);
  void unlink(entry* e);
  void push_front(entry* e);
  void erase(entry* e);
  void mark(entry* e);
  void unmark(entry* e);
  entry* insert(std::size_t domain, std::string_view identifier);

  std::vector<domain_limits> limits_;
  std::vector<map> maps_;
  std::size_t max_identifiers_;
  std::size_t size_ = 0;
  entry* head_ = nullptr;        ///< most recently used
  entry* tail_ = nullptr;        ///< least recently used
  entry* cursor_ = nullptr;      ///< where the next sweep resumes (walking towards the head)
  entry* dirty_head_ = nullptr;  ///< oldest dirty
  entry* dirty_tail_ = nullptr;
  std::size_t dirty_count_ = 0;
  bool track_dirty_ = false;
  std::uint64_t evictions_ = 0;
  std::uint64_t expirations_ = 0;
};

}  // namespace smockron::master
