// The gate's decision arithmetic (see plan.hpp).
#include "proxy/gate/plan.hpp"

#include <algorithm>

namespace smockron::proxy {

std::int64_t client_entry::expires_us() const {
  return std::max({next_us, local_next_us, spare_us, *std::max_element(tat.begin(), tat.end())});
}

void refresh(client_entry& e, const guard_policy& guard, std::int64_t now_us) {
  if (guard.count != 0 && e.policy_seq != guard.seq) {
    e.tat.fill(0);  // computed under other rules: start afresh
    e.policy_seq = guard.seq;
  }
  if (e.spare_us != 0 && e.spare_us <= now_us) e.spare_us = 0;  // lapsed
}

namespace {
// The master's interval is this gatekeeper's pace: the binding limit's
// interval times the gatekeepers holding the client (the master's pace
// share, master/engine/pace_share.hpp). A request's own units fit one rule
// interval each after the master's time. `rule`: the interval is the rule's
// that set the time (the one LIMIT named, or the only one when LIMIT named
// none and the interval given is at least its own); otherwise (several rules and none named, a share's or a quota's
// time) the interval as given: later than the rule's under pace share,
// never earlier.
struct unit {
  std::int64_t us;
  bool rule;
  std::int64_t burst = 0;  ///< the rule's (`rule` only)
};
unit unit_interval(const client_entry& e, const guard_policy& guard) {
  if (!guard.own) return {e.interval_us, false};
  if (e.limit == wire::limit_ref::kind::rule && e.limit_index < guard.count)
    return {guard.rules[e.limit_index].interval_us, true, guard.rules[e.limit_index].burst};
  // LIMIT named none: the only rule's, if the interval given can be it (its
  // whole milliseconds, times the gatekeepers); a quota's time comes with another.
  if (e.limit == wire::limit_ref::kind::none && guard.count == 1 && e.interval_us + 999 >= guard.rules[0].interval_us)
    return {guard.rules[0].interval_us, true, guard.rules[0].burst};
  return {e.interval_us, false};
}
}  // namespace

request_plan plan_request(const client_entry& e, const guard_policy& guard, std::int64_t max_delay_us,
                          std::int64_t pacing_fresh_us, std::int64_t now_us, std::int64_t units) {
  request_plan p;
  const std::int64_t u = std::max<std::int64_t>(units, 1);
  const bool master_fresh = now_us - e.updated_us <= pacing_fresh_us;
  // The master's next allowed time is when one unit fits; u units fit u - 1
  // of its intervals later (bounded as its times are).
  std::int64_t master_us = e.next_us;
  const unit by = e.interval_us > 0 ? unit_interval(e, guard) : unit{0, false};
  const std::int64_t unit_us = by.us;
  if (u > 1 && e.next_us != 0 && unit_us > 0)
    master_us += std::min(u - 1, wire::max_policy_span_us / unit_us) * unit_us;
  p.release_us = master_us;
  p.pace_us = e.interval_us;
  // The guard: the earliest time every rule's GCRA conforms for u units.
  for (std::size_t i = 0; i < guard.count; ++i) {
    const guard_rule& r = guard.rules[i];
    if (u > r.burst) {
      p.never = true;  // no wait makes room for more than a burst
      return p;
    }
    const std::int64_t conform = e.tat[i] - (r.burst - u) * r.interval_us;
    if (conform > p.release_us) {
      p.release_us = conform;
      p.pace_us = r.interval_us;
    } else if (p.pace_us == 0) {
      p.pace_us = r.interval_us;  // the master never gave one: held requests go at the rule's rate
    }
  }
  // This gatekeeper's own queue: after the last held request, its u units
  // take u paces (the first of them counted in local_next_us). Under pace
  // share (the pace a share of the rule's interval) they are paced after
  // it instead: the next held request waits them (record_hold). Paced
  // before it at the share's pace, a request of many units went well past
  // the master's theoretical arrival time (next allowed + burst - 1
  // intervals), and a use there leaves the time between unused for good
  // (GCRA starts again from the later use): near the master, ten
  // gatekeepers let through 7% less than the limit. The master's time
  // still counts them before it (master_us above).
  // (The master's interval, whole milliseconds rounded, more than one of
  // them over the rule's: a share, not the rule's own rounded, nor a guard
  // rule binding, which counts the units itself.)
  const bool shared = by.rule && e.interval_us > by.us + 999;
  p.units_after = shared && p.pace_us == e.interval_us;
  if ((master_fresh || guard.count != 0) && e.local_next_us != 0) {
    const std::int64_t pace = std::max<std::int64_t>(p.pace_us, 0);
    const std::int64_t more = pace == 0 || p.units_after ? 0 : std::min(u - 1, wire::max_policy_span_us / pace) * pace;
    std::int64_t paced = e.local_next_us + more;
    // A share's slot is no later than the master's theoretical arrival time
    // for the rule as last told (its next allowed time, burst - 1 of the
    // rule's intervals on): the time that rule's bucket is whole again. A
    // use after it leaves the time between unused for good, which is what
    // a share costs when the other gatekeepers leave theirs unused (one
    // gone, idle, or refusing at its max_delay); here the units go at the
    // rule's pace instead. While every gatekeeper takes its share, the
    // master's time runs ahead of each one's slots and this changes
    // nothing. The master's time and the guard still bound the release
    // (above), also when the guard is the later and for any other rule.
    if (shared && e.next_us != 0) paced = std::min(paced, std::max(master_us, e.next_us + (by.burst - 1) * by.us));
    p.release_us = std::max(p.release_us, paced);
  }
  if (p.release_us <= now_us) {
    p.accept = true;
    return p;
  }
  if (e.spare_us != 0 && e.spare_us < p.release_us) p.spare_us = e.spare_us;
  // Until the master has spoken about this client, the gate holds it only a
  // little on its own authority (its guard, its own queue): every gatekeeper
  // would fill its own queue of paced slots up to max_delay within the first
  // round trip, and those G queues released together are G times the rate.
  std::int64_t max_delay = max_delay_us;
  if (!master_fresh && p.release_us > master_us && p.pace_us > 0)
    max_delay = std::min(max_delay, k_guard_hold_intervals * p.pace_us);
  p.too_long = p.release_us - now_us > max_delay;
  return p;
}

std::int64_t units_that_fit(const client_entry& e, const guard_policy& guard, std::int64_t at_us, std::int64_t own) {
  std::int64_t most = -1;
  const auto bound = [&most](std::int64_t n) {
    n = std::max<std::int64_t>(n, 0);
    most = most < 0 ? n : std::min(most, n);
  };
  for (std::size_t i = 0; i < guard.count; ++i) {
    const guard_rule& r = guard.rules[i];
    const std::int64_t owed = std::max<std::int64_t>(e.tat[i] - at_us, 0);
    bound(r.burst - (owed + r.interval_us - 1) / r.interval_us);  // a unit partly paid back is not free
  }
  const std::int64_t unit_us = e.interval_us > 0 ? unit_interval(e, guard).us : 0;
  // (The master's time does not count the request's own units yet; the rules' times do.)
  if (e.next_us != 0 && unit_us > 0) bound(e.next_us > at_us ? 0 : (at_us - e.next_us) / unit_us + 1 - own);
  return most;
}

void charge(client_entry& e, const guard_policy& guard, std::int64_t at, std::int64_t units) {
  if (units <= 0) return;
  for (std::size_t i = 0; i < guard.count; ++i) {
    const guard_rule& r = guard.rules[i];
    const std::int64_t window = r.burst * r.interval_us;  // at most 2^47 (POLICY's bound)
    // Every unit (the arrival time at most the representation bound ahead).
    const std::int64_t most = at + wire::max_policy_span_us + window;
    const std::int64_t from = std::max(e.tat[i], at);
    const std::int64_t room = std::max<std::int64_t>(0, most - from) / r.interval_us;
    e.tat[i] = units <= room ? from + units * r.interval_us : std::max(from, most);
  }
}

namespace {
// `t` moved back `units` of `interval`, never before `now`.
void move_back(std::int64_t& t, std::int64_t interval, std::int64_t units, std::int64_t now) {
  if (t <= now) return;  // nothing owed: earlier is the same
  t -= (t - now) / interval < units ? t - now : units * interval;
}
}  // namespace

void refund(client_entry& e, const guard_policy& guard, std::int64_t now_us, std::int64_t units) {
  if (units <= 0) return;
  // (Several rules and none named: a rule's when the interval given is one of them, unshared.)
  const unit by = unit_interval(e, guard);
  bool rate_bound = by.rule;
  for (std::size_t i = 0; i < guard.count; ++i) {
    move_back(e.tat[i], guard.rules[i].interval_us, units, now_us);
    rate_bound = rate_bound || (e.limit == wire::limit_ref::kind::none && guard.rules[i].interval_us == e.interval_us);
  }
  // The master's next allowed time charged the units too, and it gives
  // them back when the correction reaches it; until its next DELAY_UNTIL
  // (which only moves the time forward here) this gatekeeper does the same.
  // Only a time one of the rules set (a quota's window end is not paid back,
  // and a share's moves back with the share, at the master).
  if (rate_bound && e.interval_us > 0) move_back(e.next_us, by.us, units, now_us);
  // This gatekeeper's own queue was planned at the units reserved, a pace
  // each: requests planned from now go as much earlier (those held keep
  // their times; the guard and the master still bound them all). Without
  // this, a queue planned at generous estimates stays that slow.
  const std::int64_t pace = e.interval_us > 0 ? e.interval_us : guard.count > 0 ? guard.rules[0].interval_us : 0;
  if (pace > 0 && e.local_next_us != 0) move_back(e.local_next_us, pace, units, now_us);
}

void record_accept(client_entry& e, const guard_policy& guard, std::int64_t now_us, std::int64_t units) {
  charge(e, guard, now_us, units);
}

void record_hold(client_entry& e, const guard_policy& guard, const request_plan& p, std::int64_t units,
                 std::int64_t pace_units) {
  charge(e, guard, p.release_us, units);
  // Pace: the next held request of this identifier leaves once this one's
  // cost is paid back (one interval per unit; at most a policy's span).
  const std::int64_t pace = std::max<std::int64_t>(p.pace_us, 0);
  const std::int64_t paced = p.units_after ? std::max(pace_units, units) : pace_units;
  const std::int64_t n =
      pace == 0 ? 1 : std::clamp<std::int64_t>(paced, 1, std::max<std::int64_t>(1, wire::max_policy_span_us / pace));
  e.local_next_us = p.release_us + n * pace;
}

void record_spare(client_entry& e) { e.spare_us = 0; }

void give_back(client_entry& e, std::int64_t release_us, std::int64_t now_us) {
  if (e.spare_us == 0 || e.spare_us <= now_us || release_us < e.spare_us) e.spare_us = release_us;
}

}  // namespace smockron::proxy
