// Shared rates: a domain-wide rate over all its identifiers together (a
// provider's tokens per minute), split max-min fairly among the identifiers
// active in the last share window (Doorman's FAIR_SHARE): one that wants less
// than an equal split gets what it wants, the rest is split equally among the
// others. Single-threaded, like ingest; time in µs since the epoch.
//
// How it is enforced: each identifier has a GCRA at its share, its burst the
// domain's scaled by share / rate (the same span of time), so the shares,
// which add up to the rate, bound the total, and nobody's use counts against
// another's. A use over its share is charged (as the rules charge every use)
// and answered with the time the identifier may go again (a DELAY_UNTIL).
//
// How shares follow demand: every rebalance() (each second) the shares are
// computed again from what each identifier used in the window, and whether
// it wants more: a use came before its share allowed it,
// or one was held or refused by a gatekeeper (DELAYED, REJECTED) while its
// share was what held it (its share used up, within one of its intervals;
// one held by its own rules does not want more of the shared rate), until
// that use went and two seconds more, or its share holds it now. One that wanted more gets the water level; one that
// did not gets what it used, with k_headroom to grow into. Only what it used is taken from the rate, so the others'
// level is the rate less the real use of the light ones. Weighted: an identifier of weight w (an override's or a tier's
// `weight`) counts as w even shares. A newcomer gets the level at once, and keeps it for its first window (its use is
// not measured yet). State is memory only: a restarted master learns the shares again within one window.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "master/core/rules.hpp"
#include "shared/base/string_hash.hpp"

namespace smockron::master {

class shares {
public:
  /// A domain's shared rate: `interval_us` per unit (1/rate), `burst` units,
  /// demand measured over `window_us`.
  struct pool_config {
    std::int64_t interval_us = 0;
    std::int64_t burst = 1;
    std::int64_t window_us = 10'000'000;
  };
  /// A light identifier's share is what it used times this.
  static constexpr double k_headroom = 1.25;
  /// An identifier wants more for this long after it last did (two
  /// rebalances): a live client held by its share sends again within a round
  /// trip of its release; one that stopped leaves the level to the others.
  static constexpr std::int64_t k_want_us = 2'000'000;

  /// `max_entries`: identifiers tracked at most, all domains together (more go unshared: counted).
  explicit shares(std::size_t max_entries) : max_entries_(max_entries) {}

  /// Sets the domains (index i: a shared rate, or none). `old_index[i]`: the
  /// index new domain i had before (its identifiers and shares are kept).
  void configure(const std::vector<std::optional<pool_config>>& domains,
                 const std::vector<std::optional<std::size_t>>& old_index);
  bool any(std::size_t domain) const { return domain < pools_.size() && pools_[domain].on; }

  /// A use of `units` at `at_us` by (domain, identifier), charged to its
  /// share. `held`: a gatekeeper held it first (DELAYED). `weight`: the
  /// identifier's (an override's or a tier's; it counts as that many even
  /// shares). Throttled: when it may go again.
  rules::decision use(std::size_t domain, std::string_view identifier, std::int64_t units, std::int64_t at_us,
                      std::int64_t now_us, bool held = false, std::int64_t weight = 1);
  /// A request of (domain, identifier) refused by a gatekeeper (REJECTED) at `at_us`.
  void refused(std::size_t domain, std::string_view identifier, std::int64_t at_us);
  /// Computes the shares again from the demand seen; forgets identifiers idle for a window.
  void rebalance(std::int64_t now_us);

  /// One identifier's share and use, in units per second (the /status view).
  struct view {
    double share_per_s = 0;
    double used_per_s = 0;
    bool wants_more = false;
  };
  std::optional<view> find(std::size_t domain, std::string_view identifier, std::int64_t now_us) const;
  /// Identifiers with a share, all domains; uses not shared (the book full).
  std::size_t size() const { return size_; }
  std::uint64_t untracked() const { return untracked_; }

private:
  struct member {
    double share_per_s = 0;
    std::int64_t tat_us = 0;        ///< its GCRA at its share
    std::int64_t window_start = 0;  ///< of `used[0]`, the current half window
    std::int64_t used[2] = {0, 0};  ///< units in this half window [0] and the last [1]
    std::int64_t last_us = 0;       ///< its last use
    std::int64_t first_us = 0;      ///< its first use (its demand is measured from then)
    /// Until when it wanted more than its share (its last use over it, or
    /// held by it until then): it wants more while this is within k_want_us.
    std::int64_t wanted_us = 0;
    std::int64_t weight = 1;   ///< as its last use said
    double charged_share = 0;  ///< the share `tat_us` was charged at (its debt is rescaled when it changes)
  };
  struct pool {
    bool on = false;
    pool_config cfg;
    double rate_per_s = 0;  ///< units per second
    double level = 0;       ///< the share of one weight of those that want more (a newcomer's, times its weight)
    string_map<member> members;
  };
  /// Units per second `m` used over the window ending at `now_us`.
  double used_per_s(const pool& p, const member& m, std::int64_t now_us) const;
  void roll(const pool& p, member& m, std::int64_t now_us) const;
  static void split(pool& p, std::int64_t now_us, const shares& self);
  /// A member's GCRA interval and the span its burst covers, in µs.
  static std::pair<std::int64_t, std::int64_t> gcra(const pool& p, const member& m);

  std::vector<pool> pools_;
  std::size_t max_entries_;
  std::size_t size_ = 0;
  std::uint64_t untracked_ = 0;
};

}  // namespace smockron::master
