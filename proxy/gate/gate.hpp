// The gate: control memory of (domain, identifier) -> next allowed time (and
// pacing interval), fed by DELAY_UNTIL, and the per-request decision: accept,
// hold until a reserved time, or reject. Sharded locks, no global lock;
// bounded memory; delays only move forward; held requests of one identifier
// are released one interval apart.
//
// The first round trip: until the master's first DELAY_UNTIL for a client
// reaches this gatekeeper, only a local bound can stop it. When the master
// publishes a domain's policy (POLICY), the gate runs a GCRA per rule over the
// uses it admits itself (the guard). A client under its limit is never held
// by it: sends that fit the sliding log or GCRA of a rule fit its GCRA, and a
// gatekeeper sees a subset of a client's sends. A hot client is held from its
// first request over the burst, so G gatekeepers admit at most
// G x (burst + rate x round trip) before the master speaks, whatever the
// client's rate; the master charges that and it is paid back. On its own
// authority it holds a client only k_guard_hold_intervals ahead. Without a fresh
// policy (master silent for wire::policy_fresh_ms) there is no guard. An
// identifier the master gives rules of its own (a POLICY naming it) is
// guarded, and described in the rate-limit fields, by those instead; a
// request naming a tier (TIER) by that tier's rules, unless its identifier
// has rules of its own.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "proxy/gate/plan.hpp"
#include "shared/protocol/ratelimit_fields.hpp"
#include "shared/protocol/wire.hpp"

namespace smockron::proxy {

enum class verdict : std::uint8_t { accept, delay, reject };
/// cost_over_limit: the request costs more than a rule's burst or a quota's
/// limit, so no wait would let it through (refused at once, nothing charged).
enum class reject_reason : std::uint8_t { none, delay_too_long, held_full, cost_over_limit };

struct gate_decision {
  verdict v = verdict::accept;
  reject_reason reason = reject_reason::none;
  std::int64_t release_us = 0;     ///< delay: when to forward (wall clock)
  std::int64_t retry_after_s = 0;  ///< reject: whole seconds, rounded up, at least 1
  std::int64_t interval_us = 0;    ///< delay: the pacing interval applied
  /// delay: the slot was given back by a held client that left; the master
  /// already counted a use at release_us, so no DELAYED is sent for it.
  bool prepaid = false;
  /// The units decide() charged for the request (its cost when known, else 0).
  /// Only a slot of one unit is given back when its client leaves, and only
  /// a request of one unit takes a given-back slot: a slot reported for one
  /// cost must not carry another.
  std::int64_t units = 1;
  /// A request of unknown cost (units 0), or any under gate_limits::fit_after,
  /// let through or held: the most units that fit when it goes, after its
  /// own (units_that_fit); -1: no bound known.
  std::int64_t fit_units = -1;
};

struct gate_limits {
  std::int64_t max_delay_us = 5'000'000;
  std::int64_t max_held = 10'000;
  /// Local pacing beyond the master's time applies only while the master keeps
  /// confirming it: without an update for this long, only the master's own
  /// DELAY_UNTIL counts (fail-open when the master is gone).
  std::int64_t pacing_fresh_us = 2'000'000;
  /// A route's own cap on its held requests (beside max_held): its counter,
  /// shared by the workers, and the cap. nullptr: no cap of its own.
  std::atomic<std::int64_t>* route_held = nullptr;
  std::int64_t route_max_held = 0;
  /// The decision also says how many units fit after the request's own
  /// (fit_units), as for a request of unknown cost: a route whose body
  /// without a length reserves an estimate and is cut off past what fits.
  bool fit_after = false;
};

class gate {
public:
  /// Before the master's first word about a client, the guard holds it at most
  /// this many of its rule's intervals (longer waits are refused with 503).
  static constexpr std::int64_t k_guard_hold_intervals = proxy::k_guard_hold_intervals;
  /// Domains (ids) whose policy can be kept; ids beyond it are not guarded.
  static constexpr std::size_t k_policy_domains = 4096;

  /// `max_entries` bounds the control memory (updates beyond it are dropped and counted).
  /// `horizon` in [0, 1): this gatekeeper holds a request at most
  /// max_delay x (1 - horizon x k_horizon_spread) ahead. Gatekeepers with
  /// different horizons do not reserve the same freshly opened slot of a
  /// client that keeps all of them at their limit: the one with the farthest
  /// horizon takes it, the master's next DELAY_UNTIL moves past it, and the
  /// others refuse instead of releasing G requests at one instant. The proxy
  /// draws it at random at start-up; 0 is plain max_delay.
  explicit gate(std::size_t max_entries = 1'000'000, double horizon = 0.0);
  static constexpr double k_horizon_spread = 0.25;

  /// Applies DELAY_UNTIL: the next allowed time only moves forward.
  /// `interval_us` = 0 when the master sent no interval frame.
  void update(std::uint32_t domain, std::string_view identifier, std::int64_t next_us, std::int64_t interval_us,
              std::int64_t now_us);

  /// Applies LIMIT: the limit that set the client's DELAY_UNTIL of `next_us`,
  /// kept while that is its next allowed time (the rate-limit fields name it).
  void name_limit(std::uint32_t domain, std::string_view identifier, std::int64_t next_us,
                  const wire::limit_ref& limit);

  /// Sets a domain's policy (POLICY): at most wire::max_policy_rules rules
  /// (more are ignored: fewer rules bound less, never more). Also refreshes it.
  /// Called from one thread (the control subscriber). False (not kept, the
  /// domain is not guarded) for a domain id of k_policy_domains or more.
  bool set_policy(std::uint32_t domain, std::span<const guard_rule> rules, std::int64_t now_us);

  /// Sets one identifier's own policy (POLICY naming an identifier: a master's
  /// per-identifier override), used instead of the domain's for that client
  /// while it is refreshed within wire::policy_fresh_ms. False (not kept,
  /// counted) when k_max_overrides are already kept or the domain id is too large.
  bool set_override(std::uint32_t domain, std::string_view identifier, std::span<const guard_rule> rules,
                    std::int64_t now_us);
  /// Overrides a gate keeps (a master lists at most config::max_overrides).
  static constexpr std::size_t k_max_overrides = 65'536;

  /// Sets a tier's rules (TIER), used instead of the domain's for a request
  /// naming that tier while refreshed within wire::policy_fresh_ms. Called
  /// from one thread (the control subscriber). False (not kept) when
  /// k_max_tiers are kept already or the domain id is too large.
  bool set_tier(std::uint32_t domain, std::string_view tier, std::span<const guard_rule> rules, std::int64_t now_us);
  /// Tiers a gate keeps, all domains together.
  static constexpr std::size_t k_max_tiers = 4096;

  /// Sets a domain's quotas (QUOTA), described in the rate-limit fields
  /// while refreshed within wire::policy_fresh_ms. Called from one thread
  /// (the control subscriber). False (not kept) for a domain id of
  /// k_policy_domains or more.
  bool set_quotas(std::uint32_t domain, std::span<const wire::quota_policy::item> quotas, std::int64_t now_us);

  /// When a master last published the domain's POLICY (0: never).
  std::int64_t policy_updated_us(std::uint32_t domain) const {
    return domain < k_policy_domains ? policies_[domain].updated_us.load(std::memory_order_relaxed) : 0;
  }

  /// True while a master keeps publishing the domain's POLICY (refreshed
  /// within wire::policy_fresh_ms): a master covers the domain.
  bool covered(std::uint32_t domain, std::int64_t now_us) const;

  /// Decides a request. A delay reserves a slot (the next held request of
  /// this identifier goes one interval later) and counts as held until
  /// release_held() is called.
  /// `units`: what the request costs (its known cost, or the estimate
  /// reserved for it), charged before it is admitted: it goes when all of
  /// them fit (see plan_request). More than a rule's burst or a fresh
  /// quota's limit is refused at once (cost_over_limit) and charges nothing.
  /// 0: the request only checks the limit. `pace_units`: the paces the next
  /// held request of the client waits after this one before its own units
  /// (0: 1; more for a cost charged only when the request is done).
  /// `tier`: the tier the request names (empty: none), whose rules guard it.
  /// `names_tier`: its route has a tier source; only such a request changes
  /// the client's tier (and drops what the master said under the old one).
  gate_decision decide(std::uint32_t domain, std::string_view identifier, std::int64_t now_us,
                       const gate_limits& limits, std::int64_t units = 1, std::int64_t pace_units = 0,
                       std::string_view tier = {}, bool names_tier = false);

  /// A request admitted earlier turned out to cost `units` (known once it
  /// was done): the guard charges them now. `tier`: as decide() was told.
  void charge(std::uint32_t domain, std::string_view identifier, std::int64_t units, std::int64_t now_us,
              std::string_view tier = {});
  /// A request reserved at an estimate cost `units` fewer: the guard gives them back.
  void refund(std::uint32_t domain, std::string_view identifier, std::int64_t units, std::int64_t now_us,
              std::string_view tier = {});

  /// The client's standing under the rules that apply to it (its own, its
  /// tier's, the domain's), after any use decide() charged.
  quota_state quota(std::uint32_t domain, std::string_view identifier, std::int64_t now_us, std::string_view tier = {});

  /// A held request finished (forwarded or dropped); `limits`: those it was decided with.
  void release_held(const gate_limits& limits) {
    held_.fetch_sub(1, std::memory_order_relaxed);
    if (limits.route_held != nullptr) limits.route_held->fetch_sub(1, std::memory_order_relaxed);
  }

  /// A held request was dropped before its time (client went away). Its slot
  /// was already reported to the master, so it is kept as a spare: the next
  /// request of this identifier on this gatekeeper takes it (prepaid) instead
  /// of queueing one interval behind it. A spare not taken by its time lapses.
  void cancel(std::uint32_t domain, std::string_view identifier, const gate_decision& d, std::int64_t now_us);

  /// Drops expired entries from one shard (round-robin); returns how many.
  std::size_t sweep(std::int64_t now_us);

  std::int64_t held() const { return held_.load(std::memory_order_relaxed); }
  std::size_t entries() const { return entries_.load(std::memory_order_relaxed); }
  std::uint64_t dropped_updates() const { return dropped_updates_.load(std::memory_order_relaxed); }
  /// Requests of identifiers the guard could not track (half the control memory in use).
  std::uint64_t unguarded() const { return unguarded_.load(std::memory_order_relaxed); }
  /// Per-identifier policies kept now.
  std::size_t overrides() const { return override_count_.load(std::memory_order_relaxed); }
  /// Tier policies kept now.
  std::size_t tiers() const;

private:
  // A place among the held: within max_held and the route's own cap, or none taken.
  bool take_held(const gate_limits& limits);
  struct key_view {
    std::uint32_t domain;
    std::string_view id;
  };
  struct key {
    std::uint32_t domain;
    std::string id;
  };
  struct key_hash {
    using is_transparent = void;
    std::size_t operator()(const key_view& k) const;
    std::size_t operator()(const key& k) const { return (*this)(key_view{k.domain, k.id}); }
  };
  struct key_eq {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      return a.domain == b.domain && std::string_view(a.id) == std::string_view(b.id);
    }
  };
  using entry = client_entry;
  using policy = guard_policy;
  // Written by one thread, read by every worker: a sequence lock over atomics.
  struct policy_slot {
    std::atomic<std::uint32_t> seq{0};
    std::atomic<std::int64_t> updated_us{0};
    std::atomic<std::int64_t> override_updated_us{0};  ///< last override of this domain set (0: none ever)
    std::atomic<std::size_t> count{0};
    std::array<std::atomic<std::int64_t>, k_guard_rules> interval{};
    std::array<std::atomic<std::int64_t>, k_guard_rules> burst{};
  };
  /// True when `units` exceed one of the domain's fresh quotas (a cost no window holds).
  bool over_quota(std::uint32_t domain, std::int64_t units, std::int64_t now_us) const;
  /// charge() (delta > 0) or refund() (delta < 0) under the client's lock.
  void correct(std::uint32_t domain, std::string_view identifier, std::int64_t delta, std::int64_t now_us,
               std::string_view tier);
  /// Marks in `q` (its quotas added, its `rules` rate rules not yet) the limit
  /// the master named for the client in `named`.
  static void name_in(quota_state& q, const entry& named, std::size_t rules);
  /// Appends the domain's fresh quotas to `q` (none for an overridden identifier).
  void add_quotas(quota_state& q, std::uint32_t domain, bool overridden, std::int64_t next_us,
                  std::int64_t now_us) const;
  /// The domain's policy if it is fresh at `now_us`.
  policy read_policy(std::uint32_t domain, std::int64_t now_us) const;
  /// The policy of a request naming `tier`: the tier's when fresh (`tiered`
  /// set), else the domain's (read_policy).
  policy read_policy(std::uint32_t domain, std::int64_t now_us, std::string_view tier, bool& tiered) const;
  /// Sets an override's or a tier's policy to `rules` (control thread):
  /// true when they changed (a new odd sequence, so guard state under the old ones starts afresh).
  bool assign(policy& p, std::span<const guard_rule> rules);
  /// One identifier's own policy (written by the control thread under the shard's lock).
  struct override_policy {
    policy rules;
    std::int64_t updated_us = 0;
  };
  struct shard;
  /// `domain_policy`, or the identifier's fresh override of it (the shard's lock held).
  policy policy_for(const shard& s, const key_view& k, const policy& domain_policy, std::int64_t now_us) const;
  static constexpr std::size_t k_shards = 64;
  std::array<policy_slot, k_policy_domains> policies_;
  struct alignas(64) shard {
    std::mutex mutex;
    std::unordered_map<key, entry, key_hash, key_eq> map;
    std::unordered_map<key, override_policy, key_hash, key_eq> overrides;
  };
  shard& shard_for(const key_view& k);

  std::array<shard, k_shards> shards_;
  std::size_t max_per_shard_;
  double horizon_cut_;  ///< horizon x k_horizon_spread
  std::atomic<std::int64_t> held_{0};
  std::atomic<std::size_t> entries_{0};
  std::atomic<std::uint64_t> dropped_updates_{0};
  std::atomic<std::uint64_t> unguarded_{0};
  std::atomic<std::size_t> override_count_{0};
  std::uint32_t override_seq_ = 1;  ///< odd, so never a domain policy's (even) sequence; control thread only
  std::atomic<std::size_t> sweep_cursor_{0};
  // Tiers are read by requests that name one: a reader lock, taken only once some tier is kept.
  struct tier_slot {
    policy rules;
    std::int64_t updated_us = 0;
  };
  mutable std::shared_mutex tiers_mutex_;
  std::unordered_map<key, tier_slot, key_hash, key_eq> tiers_;
  std::atomic<bool> any_tiers_{false};
  // Quotas are read only for the rate-limit fields: one lock, taken only
  // once some domain has quotas.
  struct quota_slot {
    std::array<wire::quota_policy::item, wire::max_quota_items> items{};
    std::size_t count = 0;
    std::int64_t updated_us = 0;
  };
  mutable std::mutex quotas_mutex_;
  std::unordered_map<std::uint32_t, quota_slot> quotas_;
  std::atomic<bool> any_quotas_{false};
};

}  // namespace smockron::proxy
