// The rate-limiting logic: a pure function of (limits, state, event, now).
// Two algorithms: the spec's sliding log (default) and GCRA. Time is in
// microseconds since the epoch; the wire's milliseconds are converted at the edge.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace smockron::rules {

enum class algorithm : std::uint8_t { sliding_log, gcra };

/// One rule: `burst` requests may be made before `1/rate` spacing applies.
struct rule {
  std::int64_t interval_us = 0;  ///< 1/rate
  std::int64_t burst = 1;
  /// The spec's "past (burst / rate)".
  std::int64_t window_us() const { return interval_us * burst; }
};

/// The compiled, immutable limits of one domain.
struct limits {
  algorithm algo = algorithm::sliding_log;
  std::vector<rule> rules;
  /// Timestamps further than this ahead of the master's clock are clamped
  /// (a gatekeeper with a fast clock must not lock a client out for hours).
  std::int64_t max_future_us = 60'000'000;

  std::size_t max_burst() const;
  /// Sliding-log history length: the spec's max_burst() plus k_reorder_slack
  /// entries, so that DELAYED messages reported out of order (up to that many
  /// places) are charged at their own free slot. Decisions are unchanged: the
  /// extra entries are older than every window that counts.
  std::size_t history_cap() const { return max_burst() + k_reorder_slack; }
  static constexpr std::size_t k_reorder_slack = 4;
  std::int64_t max_window_us() const;
  /// How far past now uses over the limit may be charged (the longest window,
  /// or max_future_us if longer): a gatekeeper that keeps accepting a client
  /// (failing open, an older version) cannot lock it out for hours.
  std::int64_t max_debt_us() const { return std::max(max_future_us, max_window_us()); }
};

/// Kind of accounting event.
enum class event_kind : std::uint8_t { accepted, delayed, rejected };

/// An accounting event: `at_us` is the receive time for accepted requests and
/// the delayed time for delayed ones (rejected events do not enter the history).
struct event {
  event_kind kind = event_kind::accepted;
  std::int64_t at_us = 0;
};

/// Per (domain, identifier) state. Sliding log: ascending timestamps, at most
/// history_cap() of them. GCRA: one theoretical arrival time per rule.
struct state {
  std::vector<std::int64_t> times;
};

/// Outcome of an evaluation.
struct decision {
  bool throttled = false;        ///< next request is not allowed at `now`
  std::int64_t next_us = 0;      ///< when the next request is allowed (valid if throttled)
  std::int64_t interval_us = 0;  ///< 1/rate of the rule that set next_us (pacing hint)
};

/// Records `e` in `s` and evaluates when the next request is allowed.
///
/// Every ACCEPTED or DELAYED event is a use, and every use is charged.
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

/// How much of rule `i` is used at `now_us`, in uses: those recorded in its
/// window, charged-ahead ones included (sliding log), or how far its arrival
/// time runs ahead, in intervals (GCRA). At most `burst` means the rule
/// admits another use now.
double window_uses(const limits& l, const state& s, std::size_t i, std::int64_t now_us);

/// True when `s` has the shape `l` expects (GCRA: one time per rule; log: ascending).
bool compatible(const limits& l, const state& s);

}  // namespace smockron::rules
