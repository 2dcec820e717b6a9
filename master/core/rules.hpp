// The rate-limiting logic: a pure function of (limits, state, event, now).
// Two algorithms: the spec's sliding log (default) and GCRA, both counting
// cost units (a request may cost more than one use); beside them, quotas over
// calendar windows (day, week, month). Time is in microseconds since the
// epoch; the wire's milliseconds are converted at the edge.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "shared/base/calendar.hpp"

namespace smockron::rules {

enum class algorithm : std::uint8_t { sliding_log, gcra };

/// One rule: `burst` units may be used before `1/rate` spacing applies.
struct rule {
  std::int64_t interval_us = 0;  ///< 1/rate (one unit)
  std::int64_t burst = 1;
  /// The spec's "past (burst / rate)".
  std::int64_t window_us() const { return interval_us * burst; }
};

/// Sliding-log rules with a burst up to this are kept exactly: their history
/// (burst + k_reorder_slack unit timestamps, at most 1 KiB) is the spec's.
/// A rule with a larger burst is a sliding-window counter instead (four
/// numbers, any burst; the fourth a GCRA arrival time that keeps its debt): the uses of the previous fixed window of
/// burst/rate, weighted by how much of it the sliding window still covers, plus those of the current one, as
/// Cloudflare's. It assumes the previous window's uses were spread evenly; its error is measured in
/// tests/master/rules_cost_test.cpp and docs/architecture.md.
inline constexpr std::int64_t k_exact_burst = 120;

/// A calendar window of a quota (UTC, or shifted by a fixed offset), or a
/// fixed one of any length (`length_us`, aligned to the epoch).
using period = calendar::period;

/// A quota: at most `limit` units per calendar `per` (weeks start on Monday).
/// Windows are fixed: the count starts again at each window's start, and an
/// exhausted quota allows nothing until then (no debt carries over).
struct quota {
  std::int64_t limit = 1;
  period per = period::month;
  std::int64_t offset_us = 0;  ///< local time = UTC + offset (the `tz` of the configuration)
  std::int64_t length_us = 0;  ///< period::fixed: the window's length
  calendar::window_spec window() const { return {per, offset_us, length_us}; }
};

/// Start of the window of `q` that holds `t_us`, and the start of the next one.
inline std::int64_t window_start_us(const quota& q, std::int64_t t_us) {
  return calendar::window_start_us(q.window(), t_us);
}
inline std::int64_t window_end_us(const quota& q, std::int64_t t_us) {
  return calendar::window_end_us(q.window(), t_us);
}

/// The compiled, immutable limits of one domain.
struct limits {
  algorithm algo = algorithm::sliding_log;
  std::vector<rule> rules;
  std::vector<quota> quotas;
  /// At most this many requests of one identifier in flight (leased to the
  /// gatekeepers, master/engine/leases.hpp); 0: no such rule.
  std::int64_t concurrency = 0;
  /// The domain's shared concurrency (all identifiers together; the same in
  /// an override's limits as in the domain's); 0: none.
  std::int64_t shared_concurrency = 0;
  /// The identifier's weight in the domain's shared limits (an override's or
  /// a tier's `weight`): its max-min share is this many even ones.
  std::int64_t weight = 1;
  /// The domain's shared rate (all identifiers together, master/engine/shares.hpp),
  /// the same in every identifier's limits; interval 0: none. Published with the
  /// rules in POLICY: no identifier may use more, so it bounds a gatekeeper's
  /// first round trip without holding anyone its share allows.
  rule shared_rate{0, 0};
  /// Timestamps further than this ahead of the master's clock are clamped
  /// (a gatekeeper with a fast clock must not lock a client out for hours).
  std::int64_t max_future_us = 60'000'000;

  /// Largest burst among the rules kept in the log (sliding log, burst up to k_exact_burst).
  std::size_t max_burst() const;
  /// Sliding-log history length: the spec's max_burst() plus k_reorder_slack
  /// entries, so that DELAYED messages reported out of order (up to that many
  /// places) are charged at their own free slot. Decisions are unchanged: the
  /// extra entries are older than every window that counts.
  std::size_t history_cap() const { return max_burst() + k_reorder_slack; }
  /// True when rule `r` is a sliding-window counter (sliding log, burst over k_exact_burst).
  bool counted(const rule& r) const { return algo == algorithm::sliding_log && r.burst > k_exact_burst; }
  /// Numbers of state::aux: four per counted rule, then two per quota.
  std::size_t aux_size() const;
  static constexpr std::size_t k_reorder_slack = 4;
  std::int64_t max_window_us() const;
};

/// How far past now the uses of a client may put its next allowed time: a
/// bound of representation only (~4.5 years, the longest span a POLICY
/// carries, so that a gatekeeper's arithmetic cannot overflow). Every unit
/// charged is paid back at the rule's rate, however many: a request of a
/// million units costs what a million requests of one do.
inline constexpr std::int64_t k_max_debt_us = std::int64_t{1} << 47;

/// Kind of accounting event. `adjust` corrects the cost of a use reported
/// before (a reservation at an estimate, corrected once the real cost is known).
enum class event_kind : std::uint8_t { accepted, delayed, rejected, adjust };

/// An accounting event: `at_us` is the receive time for accepted requests and
/// the delayed time for delayed ones (rejected events do not enter the history).
/// `cost`: the units the request used (0: none, the event only asks for a decision).
/// An adjustment: `cost` more units used at `at_us` (the time of the use it
/// corrects), or, when negative, that many of the units charged then given back.
struct event {
  event_kind kind = event_kind::accepted;
  std::int64_t at_us = 0;
  std::int64_t cost = 1;
};

/// Per (domain, identifier) state. `times`: sliding log, ascending unit
/// timestamps (a use of cost c is c of them), at most history_cap(); GCRA,
/// one theoretical arrival time per rule. `aux`: per counted rule [window
/// start, previous window's units, current window's units, GCRA arrival
/// time], then per quota [window start, units used]; empty until the first use.
struct state {
  std::vector<std::int64_t> times{};
  std::vector<std::int64_t> aux{};
  bool empty() const { return times.empty() && aux.empty(); }
};

/// Outcome of an evaluation.
/// What kind of limit set a decision's next allowed time.
enum class limit_kind : std::uint8_t { none, rule, quota, share };

struct decision {
  bool throttled = false;        ///< next request is not allowed at `now`
  std::int64_t next_us = 0;      ///< when the next request is allowed (valid if throttled)
  std::int64_t interval_us = 0;  ///< 1/rate of the rule that set next_us (pacing hint)
  /// The limit that set next_us (what a refusal names): a rule or quota by its
  /// place in the limits' rules or quotas; a share (master/engine/shares.*)
  /// with its burst, for the rate-limit fields.
  limit_kind by = limit_kind::none;
  std::uint8_t index = 0;
  std::int64_t burst = 0;  ///< by == share: the share's burst (its rate is 1 / interval_us)
};

/// Records `e` in `s` and evaluates when the next request is allowed.
///
/// Every ACCEPTED or DELAYED event is a use of `cost` units, and every unit
/// is charged (a use of cost c is c uses of one at the same time).
/// Sliding log: a use inside the limit is recorded at its own time (the
/// spec); a use over the limit (a gatekeeper that accepted before it heard
/// from the master, or several gatekeepers that released held requests at the
/// same DELAY_UNTIL instant) is recorded at the next free slot, one interval
/// after the last use, so over-use pushes the next allowed time out by as much
/// and the long-run admitted rate stays at the configured rate at any
/// gatekeeper-to-master distance. GCRA charges every use by construction.
/// A REJECTED event records nothing and never moves the next allowed time:
/// the decision is where the uses put it (sliding log: one interval after the
/// last use, not after now), so a refused client told to come back at that
/// time is admitted then, however often it was refused meanwhile.
/// A quota counts the units of the events in its current window; when they
/// reach its limit, the next request is allowed at the window's end.
/// Every unit is charged in full (up to k_max_debt_us ahead), whatever the cost.
/// An adjustment of +n charges n units at its time as a use would (the
/// sliding log's entries: no earlier than the oldest time its windows still
/// count, so a correction that comes after its window is charged there, not
/// dropped); one of -n
/// gives back n units: GCRA arrival times move back n intervals (never before
/// now), the sliding log drops its n newest entries (a reservation is at most
/// a burst: the gatekeeper refuses a larger one, so its units are in the
/// log), counters and quotas take n from the window the use was counted in.
decision apply(const limits& l, state& s, event e, std::int64_t now_us);

/// Evaluates without recording anything.
decision evaluate(const limits& l, const state& s, std::int64_t now_us);

/// True when `s` can no longer affect any decision at or after `now_us`
/// (dropping it is equivalent to keeping it).
bool expired(const limits& l, const state& s, std::int64_t now_us);

/// The first time at which expired(l, s, t) holds (what a store's key expiry is set to).
std::int64_t expires_at_us(const limits& l, const state& s);

/// Folds `older` (a snapshot written before `into` started, e.g. read back
/// from a store after a restart) into `into`. Sliding log: entries of `older`
/// earlier than the first of `into` are added (later ones are assumed to be
/// the same uses), keeping the newest history_cap(). GCRA: the later arrival
/// time per rule wins. Snapshots of another shape are ignored.
void merge(const limits& l, state& into, const state& older);

/// How much of rule `i` is used at `now_us`, in units: those recorded in its
/// window, charged-ahead ones included (sliding log; a counted rule's
/// estimate), or how far its arrival time runs ahead, in intervals (GCRA).
/// Below `burst` means the rule admits another use now.
double window_uses(const limits& l, const state& s, std::size_t i, std::int64_t now_us);

/// The earliest time at or after `now_us` at which a use of `cost` units
/// fits every rule and quota of `l` as the state is (nothing recorded): no
/// unit of it charged ahead of its time (sliding log: placed at a free slot
/// no later than it; GCRA: its arrival time within the burst; counters and
/// quotas within their limits) and the identifier not throttled. A use that
/// fits now returns `now_us`; one that never can (more than a rule's burst or
/// a quota's limit), INT64_MAX. Found among the times at which what stands
/// in the way goes, each checked on a copy (a history of at most
/// history_cap() entries): the time returned is one at which the use fits
/// if nothing else is used meanwhile. What an external data plane's request
/// is admitted by (master/envoy/), as the gatekeepers admit a known cost.
std::int64_t fits_at(const limits& l, const state& s, std::int64_t cost, std::int64_t now_us);

/// Units of quota `i` used in its window holding `now_us`.
std::int64_t quota_used(const limits& l, const state& s, std::size_t i, std::int64_t now_us);

/// True when a state's aux numbers mean the same under `a` and `b` (the same
/// rules counted, the same number of quotas).
bool same_aux_layout(const limits& a, const limits& b);

/// True when `s` has the shape `l` expects (GCRA: one time per rule; log:
/// ascending; aux: empty or aux_size() numbers).
bool compatible(const limits& l, const state& s);

}  // namespace smockron::rules
