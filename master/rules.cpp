// Sliding-log (spec) and GCRA rate logic. See rules.hpp for the contract.
#include "master/rules.hpp"

#include <algorithm>

namespace smockron::rules {
namespace {

// Number of history entries strictly newer than `since`.
std::int64_t count_after(const std::vector<std::int64_t>& times, std::int64_t since) {
  const auto it = std::upper_bound(times.begin(), times.end(), since);
  return static_cast<std::int64_t>(times.end() - it);
}

// The spec's evaluation: a rule whose window ending at `now` holds `burst`
// uses allows the next one at max(now, last) + interval. `since_last` (a
// refusal, which records no use) starts from the last use instead of now: the
// time the uses put the client at does not move while it is refused, so a
// Retry-After that named it stays true (waiting clients are not pushed back
// by their own retries).
decision evaluate_log(const limits& l, const state& s, std::int64_t now, bool since_last) {
  decision d;
  if (s.times.empty()) return d;
  const std::int64_t last = s.times.back();
  for (const rule& r : l.rules) {
    if (count_after(s.times, now - r.window_us()) < r.burst) continue;
    const std::int64_t next = (since_last ? last : std::max(now, last)) + r.interval_us;
    if (next <= now) continue;
    if (!d.throttled || next > d.next_us) {
      d.throttled = true;
      d.next_us = next;
      d.interval_us = r.interval_us;
    }
  }
  return d;
}

// True when a use at `t` keeps every window of rule `r` that contains it
// within the burst: the window ending at `t`, and those ending at the later
// uses already recorded (held requests reported out of order, uses charged
// ahead of time: this is what catches a use that arrives while the debt of
// earlier ones is still being paid). One pass over the entries involved.
bool fits(const limits& l, const state& s, const rule& r, std::int64_t t) {
  const auto& times = s.times;
  // Older than everything a full history remembers: whether its slot was used
  // is unknown, so it is taken as used (never admit more than the rate).
  // Otherwise the entries still remembered are counted: a use reported late
  // by a client under its limit (gatekeepers at different distances) keeps
  // its own time.
  if (times.size() >= l.history_cap() && t < times.front()) return false;
  const std::int64_t w = r.window_us();
  auto lo = std::upper_bound(times.begin(), times.end(), t - w);  // first entry inside (t - w, t]
  auto it = std::upper_bound(lo, times.end(), t);                 // first entry after t
  if (it - lo >= r.burst) return false;
  for (; it != times.end() && *it < t + w; ++it) {
    while (*lo <= *it - w) ++lo;
    if (it - lo + 1 >= r.burst) return false;  // (*it - w, *it] holds these and the new use
  }
  return true;
}

// Where a use at time `t` is recorded: at `t` when it fits every rule (the
// spec's case: a client under its limit is recorded at its own time),
// otherwise one interval after the last use (of the rule it breaks; the
// largest such). Every use is charged, never forgotten:
//  - several gatekeepers that released held requests at the same DELAY_UNTIL
//    instant report several DELAYED with one timestamp; each takes a slot;
//  - a gatekeeper far from the master keeps accepting until its DELAY_UNTIL
//    arrives; those ACCEPTED uses over the limit are recorded in the future,
//    one interval apart, so the next allowed time moves out by what was
//    over-used and the excess is paid back. (The spec records them at their
//    own time, which the history cap then forgets: at a one-way delay near
//    1/rate, every DELAY_UNTIL arrived in the past and nothing was limited.)
// Messages of one identifier may arrive out of order (one accounting socket
// per proxy worker, several gatekeepers): a use whose own slot is still free
// takes it.
std::int64_t free_slot(const limits& l, const state& s, std::int64_t t, std::int64_t now) {
  if (s.times.empty()) return t;
  std::int64_t slot = t;
  for (const rule& r : l.rules) {
    if (!fits(l, s, r, t)) slot = std::max(slot, s.times.back() + r.interval_us);
  }
  // The debt is bounded: a gatekeeper that keeps accepting (failing open, an
  // older version, lost DELAY_UNTILs) cannot lock a client out for longer
  // than one window or max_future_us, whichever is longer.
  return std::min(slot, std::max(t, now + l.max_debt_us()));
}

void record_log(const limits& l, state& s, event e, std::int64_t now) {
  const std::int64_t t = free_slot(l, s, e.at_us, now);
  // Too old to be inside any window: it cannot change a decision.
  if (t <= now - l.max_window_us()) return;
  s.times.insert(std::upper_bound(s.times.begin(), s.times.end(), t), t);
  const std::size_t cap = l.history_cap();
  if (s.times.size() > cap) s.times.erase(s.times.begin(), s.times.end() - static_cast<std::ptrdiff_t>(cap));
}

decision evaluate_gcra(const limits& l, const state& s, std::int64_t now) {
  decision d;
  for (std::size_t i = 0; i < l.rules.size() && i < s.times.size(); ++i) {
    const rule& r = l.rules[i];
    const std::int64_t next = s.times[i] - (r.burst - 1) * r.interval_us;
    if (next > now && (!d.throttled || next > d.next_us)) {
      d.throttled = true;
      d.next_us = next;
      d.interval_us = r.interval_us;
    }
  }
  return d;
}

void record_gcra(const limits& l, state& s, event e, std::int64_t now) {
  s.times.resize(l.rules.size(), 0);
  // The debt is bounded as for the sliding log (see free_slot).
  const std::int64_t most = std::max(e.at_us, now + l.max_debt_us());
  for (std::size_t i = 0; i < l.rules.size(); ++i) {
    s.times[i] = std::min(std::max(s.times[i], e.at_us), most) + l.rules[i].interval_us;
  }
}

}  // namespace

std::size_t limits::max_burst() const {
  std::int64_t m = 1;
  for (const rule& r : rules) m = std::max(m, r.burst);
  return static_cast<std::size_t>(m);
}

std::int64_t limits::max_window_us() const {
  std::int64_t m = 0;
  for (const rule& r : rules) m = std::max(m, r.window_us());
  return m;
}

decision evaluate(const limits& l, const state& s, std::int64_t now_us) {
  return l.algo == algorithm::gcra ? evaluate_gcra(l, s, now_us) : evaluate_log(l, s, now_us, false);
}

decision apply(const limits& l, state& s, event e, std::int64_t now_us) {
  if (e.kind == event_kind::rejected) {
    // No use recorded, and the next allowed time stays where the uses put it
    // (GCRA's does not depend on now; the sliding log's starts from the last use).
    return l.algo == algorithm::gcra ? evaluate_gcra(l, s, now_us) : evaluate_log(l, s, now_us, true);
  }
  if (!l.rules.empty()) {
    e.at_us = std::min(e.at_us, now_us + l.max_future_us);
    if (l.algo == algorithm::gcra) record_gcra(l, s, e, now_us);
    else record_log(l, s, e, now_us);
  }
  return evaluate(l, s, now_us);
}

bool expired(const limits& l, const state& s, std::int64_t now_us) {
  if (s.times.empty()) return true;
  if (l.algo == algorithm::gcra) {
    return std::all_of(s.times.begin(), s.times.end(), [&](std::int64_t tat) { return tat <= now_us; });
  }
  return s.times.back() <= now_us - l.max_window_us();
}

std::int64_t expires_at_us(const limits& l, const state& s) {
  if (s.times.empty()) return 0;
  if (l.algo == algorithm::gcra) return *std::max_element(s.times.begin(), s.times.end());
  return s.times.back() + l.max_window_us();
}

double window_uses(const limits& l, const state& s, std::size_t i, std::int64_t now_us) {
  const rule& r = l.rules[i];
  if (l.algo == algorithm::gcra) {
    if (i >= s.times.size()) return 0;
    return static_cast<double>(std::max<std::int64_t>(0, s.times[i] - now_us)) / static_cast<double>(r.interval_us);
  }
  return static_cast<double>(count_after(s.times, now_us - r.window_us()));
}

bool compatible(const limits& l, const state& s) {
  if (l.algo == algorithm::gcra) return s.times.size() == l.rules.size();
  return std::is_sorted(s.times.begin(), s.times.end());
}

void merge(const limits& l, state& into, const state& older) {
  if (!compatible(l, older) || older.times.empty()) return;
  if (l.algo == algorithm::gcra) {
    if (into.times.size() != l.rules.size()) {
      into.times = older.times;
      return;
    }
    for (std::size_t i = 0; i < into.times.size(); ++i) into.times[i] = std::max(into.times[i], older.times[i]);
    return;
  }
  const auto end = into.times.empty() ? older.times.end()
                                      : std::lower_bound(older.times.begin(), older.times.end(), into.times.front());
  into.times.insert(into.times.begin(), older.times.begin(), end);
  const std::size_t cap = l.history_cap();
  if (into.times.size() > cap)
    into.times.erase(into.times.begin(), into.times.end() - static_cast<std::ptrdiff_t>(cap));
}

}  // namespace smockron::rules
