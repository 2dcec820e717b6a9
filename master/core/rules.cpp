// Sliding-log (spec) and GCRA rate logic. See rules.hpp for the contract.
#include "master/core/rules.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace smockron::rules {
namespace {

std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// Number of history entries strictly newer than `since`.
std::int64_t count_after(const std::vector<std::int64_t>& times, std::int64_t since) {
  const auto it = std::upper_bound(times.begin(), times.end(), since);
  return static_cast<std::int64_t>(times.end() - it);
}

bool logged(const limits& l, const rule& r) { return l.algo == algorithm::sliding_log && !l.counted(r); }

// Running sums of units stay far from overflow whatever the costs reported.
std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  constexpr std::int64_t k_most = std::int64_t{1} << 62;
  return a >= k_most - b ? k_most : a + b;
}

// ---- Sliding-window counters (sliding-log rules with a burst over k_exact_burst).

// A counted rule's numbers: the current window's start, the previous and
// current windows' units, and a GCRA arrival time for the same rate and burst.
// The window estimate forgets what lies beyond the next window; the arrival
// time remembers a debt however deep (bounded as GCRA's is), so the master's
// DELAY_UNTIL reaches as far as the uses put the client, and gatekeepers
// whose queues reach max_delay ahead are bound by it. GCRA admits whatever
// the window admits (the gate's guard relies on the same fact), so a client
// under its limit is judged by the window alone.
constexpr std::size_t k_counter_numbers = 4;

// Where rule i's numbers start in state::aux.
std::size_t counter_at(const limits& l, std::size_t i) {
  std::size_t k = 0;
  for (std::size_t j = 0; j < i; ++j) k += l.counted(l.rules[j]) ? k_counter_numbers : 0;
  return k;
}

struct window_counts {
  std::int64_t start = 0;  // the fixed window holding t: [start, start + w)
  std::int64_t prev = 0;   // units of the window before it
  std::int64_t curr = 0;   // units of this one
};

// The counts as seen at `t` (windows that ended roll over).
window_counts counts_at(const limits& l, const state& s, std::size_t i, std::int64_t t) {
  const std::int64_t w = l.rules[i].window_us();
  const std::int64_t start = floor_div(t, w) * w;
  if (s.aux.size() != l.aux_size()) return {start, 0, 0};
  const std::int64_t* a = &s.aux[counter_at(l, i)];
  if (a[0] == start) return {start, a[1], a[2]};
  if (a[0] == start - w) return {start, a[2], 0};
  return {start, 0, 0};
}

// The sliding window's estimate: the previous window's units weighted by the
// part of it the window (t - w, t] still covers, plus the current window's.
double estimate(const rule& r, const window_counts& c, std::int64_t t) {
  const double w = static_cast<double>(r.window_us());
  return static_cast<double>(c.prev) * (w - static_cast<double>(t - c.start)) / w + static_cast<double>(c.curr);
}

// GCRA's arrival time after `cost` units used at `at` (from `tat`): its next
// allowed time, burst - 1 intervals before it, at most one interval past
// `most` (the debt bound).
std::int64_t gcra_after(const rule& r, std::int64_t tat, std::int64_t at, std::int64_t cost, std::int64_t most) {
  const std::int64_t most_tat = most + (r.burst - 1) * r.interval_us;
  const std::int64_t from = std::min(std::max(tat, at), most_tat);
  const std::int64_t room = (most_tat - from) / r.interval_us + 1;  // units until the bound
  return cost <= room ? from + cost * r.interval_us : most_tat + r.interval_us;
}

void charge_counter(const limits& l, state& s, std::size_t i, std::int64_t t, std::int64_t cost, std::int64_t most) {
  const std::int64_t w = l.rules[i].window_us();
  std::int64_t* a = &s.aux[counter_at(l, i)];
  a[3] = gcra_after(l.rules[i], a[3], t, cost, most);
  const std::int64_t start = floor_div(t, w) * w;
  if (start > a[0]) {
    const window_counts c = counts_at(l, s, i, t);
    a[0] = c.start;
    a[1] = c.prev;
    a[2] = c.curr;
  }
  if (start == a[0]) a[2] = saturating_add(a[2], cost);
  else if (start == a[0] - w) a[1] = saturating_add(a[1], cost);  // reported late, from the previous window
  // Older: outside every window that still counts.
}

// When the estimate falls below the burst (the next use is allowed); `now`
// when it already is (the estimate alone: the arrival time beside it keeps a deeper debt).
std::int64_t counter_next(const rule& r, const window_counts& c, std::int64_t now) {
  if (estimate(r, c, now) < static_cast<double>(r.burst)) return now;
  const double w = static_cast<double>(r.window_us());
  const double burst = static_cast<double>(r.burst);
  double t = 0;
  if (c.curr < r.burst) {  // within this window, as the previous one's share fades (prev > 0 here)
    t = static_cast<double>(c.start) + w - w * (burst - static_cast<double>(c.curr)) / static_cast<double>(c.prev);
  } else {  // in the next one, as this window's units fade
    t = static_cast<double>(c.start) + 2 * w - w * burst / static_cast<double>(c.curr);
  }
  return std::max(now + 1, static_cast<std::int64_t>(t) + 1);
}

// ---- Quotas over calendar windows.

std::size_t quota_at(const limits& l, std::size_t i) { return counter_at(l, l.rules.size()) + 2 * i; }

void charge_quota(const limits& l, state& s, std::size_t i, std::int64_t t, std::int64_t cost) {
  std::int64_t* a = &s.aux[quota_at(l, i)];
  const std::int64_t start = window_start_us(l.quotas[i], t);
  if (start > a[0]) {
    a[0] = start;
    a[1] = 0;
  }
  if (start == a[0]) a[1] = saturating_add(a[1], cost);  // a use from a window already over is not counted in the next
}

// ---- The sliding log and GCRA.

void throttle(decision& d, std::int64_t next, std::int64_t interval, limit_kind by, std::size_t index) {
  if (!d.throttled || next > d.next_us) {
    d.throttled = true;
    d.next_us = next;
    d.interval_us = interval;
    // Past what an index holds (more than 255 rules): not named.
    d.by = index <= UINT8_MAX ? by : limit_kind::none;
    d.index = static_cast<std::uint8_t>(index);
  }
}

// The spec's evaluation: a rule whose window ending at `now` holds `burst`
// uses allows the next one at max(now, last) + interval. `since_last` (a
// refusal, which records no use) starts from the last use instead of now: the
// time the uses put the client at does not move while it is refused, so a
// Retry-After that named it stays true (waiting clients are not pushed back
// by their own retries).
void evaluate_log(const limits& l, const state& s, std::int64_t now, bool since_last, decision& d) {
  if (s.times.empty()) return;
  const std::int64_t last = s.times.back();
  for (std::size_t i = 0; i < l.rules.size(); ++i) {
    const rule& r = l.rules[i];
    if (!logged(l, r) || count_after(s.times, now - r.window_us()) < r.burst) continue;
    const std::int64_t next = (since_last ? last : std::max(now, last)) + r.interval_us;
    if (next > now) throttle(d, next, r.interval_us, limit_kind::rule, i);
  }
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

// Where a unit used at time `t` is recorded: at `t` when it fits every rule (the
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
std::int64_t free_slot(const limits& l, const state& s, std::int64_t t, std::int64_t now, bool& all_broken) {
  all_broken = false;
  if (s.times.empty()) return t;
  std::int64_t slot = t;
  all_broken = true;
  for (const rule& r : l.rules) {
    if (!logged(l, r)) continue;
    if (fits(l, s, r, t)) all_broken = false;
    else slot = std::max(slot, s.times.back() + r.interval_us);
  }
  // Every unit is paid back, however far ahead that puts the client (up to
  // the representation bound).
  return std::min(slot, std::max(t, now + k_max_debt_us));
}

// False when the unit is too old to be inside any window (it cannot change a
// decision, and neither can the units after it: they would get its slot).
bool insert_unit(const limits& l, state& s, std::int64_t t, std::int64_t now) {
  if (t <= now - l.max_window_us()) return false;
  s.times.insert(std::upper_bound(s.times.begin(), s.times.end(), t), t);
  const std::size_t cap = l.history_cap();
  if (s.times.size() > cap) s.times.erase(s.times.begin(), s.times.end() - static_cast<std::ptrdiff_t>(cap));
  return true;
}

// A use of cost c is c units at its time, each placed as the one before it
// left the history. Once a unit breaks every rule, so do all after it (more
// units never free a window), and each goes one largest interval after the
// last: those are appended in closed form, so a large cost costs no more
// than the history's length.
void record_log(const limits& l, state& s, event e, std::int64_t now) {
  std::int64_t interval = 0;  // the largest interval among the logged rules
  for (const rule& r : l.rules) interval = logged(l, r) ? std::max(interval, r.interval_us) : interval;
  if (interval == 0) return;  // every rule is counted: no log to keep
  // A correction known after its use's time left every window (a response
  // longer than the window) goes in at the oldest time still counted: at its
  // own time the log would drop it. GCRA, counters (their arrival time) and
  // quotas carry it from the use's time and need no such move.
  if (e.kind == event_kind::adjust) e.at_us = std::max(e.at_us, now - l.max_window_us() + 1);
  std::int64_t left = e.cost;
  bool all_broken = false;
  while (left > 0 && !all_broken) {
    if (!insert_unit(l, s, free_slot(l, s, e.at_us, now, all_broken), now)) return;
    --left;
  }
  if (left == 0 || s.times.empty()) return;
  // The remaining units go at last + k x interval (k = 1..left), at most the
  // debt bound; the history keeps the newest history_cap() of all.
  const std::int64_t most = std::max(e.at_us, now + k_max_debt_us);
  const std::int64_t last = s.times.back();
  const auto cap = static_cast<std::int64_t>(l.history_cap());
  const std::int64_t first_k = std::max<std::int64_t>(1, left - cap + 1);
  for (std::int64_t k = first_k; k <= left; ++k) {
    const std::int64_t steps_to_most = (most - last) / interval;  // k beyond this lands on `most`
    s.times.push_back(k > steps_to_most ? std::max(last, most) : last + k * interval);
  }
  if (s.times.size() > static_cast<std::size_t>(cap)) {
    s.times.erase(s.times.begin(), s.times.end() - cap);
  }
}

void evaluate_gcra(const limits& l, const state& s, std::int64_t now, decision& d) {
  for (std::size_t i = 0; i < l.rules.size() && i < s.times.size(); ++i) {
    const rule& r = l.rules[i];
    const std::int64_t next = s.times[i] - (r.burst - 1) * r.interval_us;
    if (next > now) throttle(d, next, r.interval_us, limit_kind::rule, i);
  }
}

void record_gcra(const limits& l, state& s, event e, std::int64_t now) {
  s.times.resize(l.rules.size(), 0);
  // Every unit is charged (up to the representation bound, see free_slot).
  const std::int64_t most = std::max(e.at_us, now + k_max_debt_us);
  for (std::size_t i = 0; i < l.rules.size(); ++i)
    s.times[i] = gcra_after(l.rules[i], s.times[i], e.at_us, e.cost, most);
}

// ---- Giving units back (an adjustment of -n: a reservation that cost less).

// An arrival time n intervals earlier, never before `now` (earlier is the
// same as now to GCRA: nothing is owed).
std::int64_t gcra_refund(const rule& r, std::int64_t tat, std::int64_t n, std::int64_t now) {
  if (tat <= now) return tat;
  const std::int64_t back = (tat - now) / r.interval_us < n ? tat - now : n * r.interval_us;
  return tat - back;
}

void refund_log(const limits& l, state& s, std::int64_t n, std::int64_t now) {
  if (l.algo == algorithm::gcra) {
    for (std::size_t i = 0; i < l.rules.size() && i < s.times.size(); ++i)
      s.times[i] = gcra_refund(l.rules[i], s.times[i], n, now);
    return;
  }
  // The n newest units: the reservation's, or as many later ones (the
  // windows count them alike).
  const std::int64_t keep =
      static_cast<std::int64_t>(s.times.size()) - std::min<std::int64_t>(n, static_cast<std::int64_t>(s.times.size()));
  s.times.resize(static_cast<std::size_t>(keep));
}

void refund_aux(const limits& l, state& s, std::int64_t at, std::int64_t n, std::int64_t now) {
  if (s.aux.size() != l.aux_size()) return;
  for (std::size_t i = 0; i < l.rules.size(); ++i) {
    if (!l.counted(l.rules[i])) continue;
    std::int64_t* a = &s.aux[counter_at(l, i)];
    a[3] = gcra_refund(l.rules[i], a[3], n, now);
    const std::int64_t w = l.rules[i].window_us();
    const std::int64_t start = floor_div(at, w) * w;
    if (start == a[0]) a[2] = std::max<std::int64_t>(0, a[2] - n);
    else if (start == a[0] - w) a[1] = std::max<std::int64_t>(0, a[1] - n);
  }
  for (std::size_t i = 0; i < l.quotas.size(); ++i) {
    std::int64_t* a = &s.aux[quota_at(l, i)];
    if (window_start_us(l.quotas[i], at) == a[0]) a[1] = std::max<std::int64_t>(0, a[1] - n);
  }
}

void evaluate_aux(const limits& l, const state& s, std::int64_t now, decision& d) {
  if (s.aux.empty()) return;
  for (std::size_t i = 0; i < l.rules.size(); ++i) {
    if (!l.counted(l.rules[i])) continue;
    const rule& r = l.rules[i];
    const std::int64_t tat = s.aux.size() == l.aux_size() ? s.aux[counter_at(l, i) + 3] : 0;
    const std::int64_t next =
        std::max(counter_next(r, counts_at(l, s, i, now), now), tat - (r.burst - 1) * r.interval_us);
    if (next > now) throttle(d, next, r.interval_us, limit_kind::rule, i);
  }
  for (std::size_t i = 0; i < l.quotas.size(); ++i) {
    // An exhausted quota allows the next use when its window ends; no pacing
    // interval (nothing is released before then).
    if (quota_used(l, s, i, now) >= l.quotas[i].limit)
      throttle(d, window_end_us(l.quotas[i], now), 0, limit_kind::quota, i);
  }
}

decision evaluate_all(const limits& l, const state& s, std::int64_t now, bool since_last) {
  decision d;
  if (l.algo == algorithm::gcra) evaluate_gcra(l, s, now, d);
  else evaluate_log(l, s, now, since_last, d);
  evaluate_aux(l, s, now, d);
  return d;
}

}  // namespace

std::size_t limits::max_burst() const {
  std::int64_t m = 1;
  for (const rule& r : rules) m = logged(*this, r) ? std::max(m, r.burst) : m;
  return static_cast<std::size_t>(m);
}

std::int64_t limits::max_window_us() const {
  std::int64_t m = 0;
  for (const rule& r : rules) m = std::max(m, r.window_us());
  return m;
}

std::size_t limits::aux_size() const { return counter_at(*this, rules.size()) + 2 * quotas.size(); }

decision evaluate(const limits& l, const state& s, std::int64_t now_us) { return evaluate_all(l, s, now_us, false); }

decision apply(const limits& l, state& s, event e, std::int64_t now_us) {
  // A refusal records no use, and the next allowed time stays where the uses
  // put it (GCRA's does not depend on now; the sliding log's starts from the
  // last use). A use of no units (its cost is charged later) is the same.
  e.at_us = std::min(e.at_us, now_us + l.max_future_us);
  if (e.kind == event_kind::adjust && e.cost < 0) {
    const std::int64_t n = -e.cost;
    if (!l.rules.empty()) refund_log(l, s, n, now_us);
    refund_aux(l, s, std::min(e.at_us, now_us), n, now_us);
    return evaluate(l, s, now_us);
  }
  if (e.kind == event_kind::rejected || e.cost <= 0) return evaluate_all(l, s, now_us, true);
  if (!l.rules.empty()) {
    if (l.algo == algorithm::gcra) record_gcra(l, s, e, now_us);
    else record_log(l, s, e, now_us);
  }
  if (l.aux_size() > 0) {
    if (s.aux.size() != l.aux_size()) s.aux.assign(l.aux_size(), 0);
    // Counters and quotas count a use when it is reported if it is timed
    // later (a held request's release time, a gatekeeper's fast clock): a
    // window ahead of now would hide the current one's units until it came.
    const std::int64_t at = std::min(e.at_us, now_us);
    const std::int64_t most = std::max(at, now_us + k_max_debt_us);
    for (std::size_t i = 0; i < l.rules.size(); ++i) {
      if (l.counted(l.rules[i])) charge_counter(l, s, i, at, e.cost, most);
    }
    for (std::size_t i = 0; i < l.quotas.size(); ++i) charge_quota(l, s, i, at, e.cost);
  }
  return evaluate(l, s, now_us);
}

std::int64_t expires_at_us(const limits& l, const state& s) {
  std::int64_t at = 0;
  if (!s.times.empty()) {
    at = l.algo == algorithm::gcra ? *std::max_element(s.times.begin(), s.times.end())
                                   : s.times.back() + l.max_window_us();
  }
  if (s.aux.size() == l.aux_size()) {
    for (std::size_t i = 0; i < l.rules.size(); ++i) {
      if (l.counted(l.rules[i])) {
        at = std::max({at, s.aux[counter_at(l, i)] + 2 * l.rules[i].window_us(), s.aux[counter_at(l, i) + 3]});
      }
    }
    for (std::size_t i = 0; i < l.quotas.size(); ++i) {
      const std::int64_t start = s.aux[quota_at(l, i)];
      if (start != 0) at = std::max(at, window_end_us(l.quotas[i], start));
    }
  }
  return at;
}

bool expired(const limits& l, const state& s, std::int64_t now_us) {
  return s.empty() || expires_at_us(l, s) <= now_us;
}

double window_uses(const limits& l, const state& s, std::size_t i, std::int64_t now_us) {
  const rule& r = l.rules[i];
  if (l.algo == algorithm::gcra) {
    if (i >= s.times.size()) return 0;
    return static_cast<double>(std::max<std::int64_t>(0, s.times[i] - now_us)) / static_cast<double>(r.interval_us);
  }
  if (l.counted(r)) return estimate(r, counts_at(l, s, i, now_us), now_us);
  return static_cast<double>(count_after(s.times, now_us - r.window_us()));
}

namespace {

// True when a use of `cost` units at `t` fits: not throttled as the
// gatekeepers are told (a refusal's decision), and, recorded on a copy, no
// unit placed after `t` (sliding log), no arrival time past the burst (GCRA),
// counters and quotas within their limits.
bool fits_now(const limits& l, const state& s, std::int64_t cost, std::int64_t t) {
  state after = s;
  if (apply(l, after, {event_kind::rejected, t, 0}, t).throttled) return false;
  if (cost <= 0) return true;
  apply(l, after, {event_kind::accepted, t, cost}, t);
  for (std::size_t i = 0; i < l.rules.size(); ++i) {
    const rule& r = l.rules[i];
    if (l.algo == algorithm::gcra) {
      if (i < after.times.size() && after.times[i] - r.window_us() > t) return false;
    } else if (l.counted(r)) {
      if (window_uses(l, after, i, t) > static_cast<double>(r.burst) + 1e-9) return false;
    } else if (!after.times.empty() && after.times.back() > t) {
      return false;
    }
  }
  for (std::size_t i = 0; i < l.quotas.size(); ++i) {
    if (quota_used(l, after, i, t) > l.quotas[i].limit) return false;
  }
  return true;
}

}  // namespace

std::int64_t fits_at(const limits& l, const state& s, std::int64_t cost, std::int64_t now_us) {
  constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();
  for (const rule& r : l.rules) {
    if (cost > r.burst) return never;
  }
  for (const quota& q : l.quotas) {
    if (cost > q.limit) return never;
  }
  if (fits_now(l, s, cost, now_us)) return now_us;
  // The times at which what stands in the way goes: the next allowed time,
  // each logged use leaving its window, the arrival time that makes room
  // (GCRA), a counter's estimate, a quota's next window. The first at which
  // the use fits is the answer (what is promised holds then).
  std::vector<std::int64_t> at;
  state probe = s;
  if (const decision d = apply(l, probe, {event_kind::rejected, now_us, 0}, now_us); d.throttled)
    at.push_back(d.next_us);
  for (std::size_t i = 0; i < l.rules.size(); ++i) {
    const rule& r = l.rules[i];
    if (l.algo == algorithm::gcra) {
      if (i < s.times.size()) at.push_back(std::max(s.times[i], now_us) + (cost - r.burst) * r.interval_us);
    } else if (l.counted(r)) {
      const double over = window_uses(l, s, i, now_us) + static_cast<double>(cost) - static_cast<double>(r.burst);
      if (over > 0) at.push_back(now_us + static_cast<std::int64_t>(std::ceil(over)) * r.interval_us);
    } else {
      for (const std::int64_t t : s.times) at.push_back(t + r.window_us());
    }
  }
  for (const quota& q : l.quotas) at.push_back(window_end_us(q, now_us));
  std::sort(at.begin(), at.end());
  for (const std::int64_t t : at) {
    if (t > now_us && fits_now(l, s, cost, t)) return t;
  }
  return at.empty() ? now_us : std::max(at.back(), now_us);
}

std::int64_t quota_used(const limits& l, const state& s, std::size_t i, std::int64_t now_us) {
  if (s.aux.size() != l.aux_size()) return 0;
  const std::int64_t* a = &s.aux[quota_at(l, i)];
  return a[0] == window_start_us(l.quotas[i], now_us) ? a[1] : 0;
}

bool same_aux_layout(const limits& a, const limits& b) {
  if (a.quotas.size() != b.quotas.size() || a.rules.size() != b.rules.size()) return false;
  for (std::size_t i = 0; i < a.rules.size(); ++i) {
    if (a.counted(a.rules[i]) != b.counted(b.rules[i])) return false;
    // A counter's numbers belong to windows of its length.
    if (a.counted(a.rules[i]) && a.rules[i].window_us() != b.rules[i].window_us()) return false;
  }
  for (std::size_t i = 0; i < a.quotas.size(); ++i) {
    const quota& x = a.quotas[i];
    const quota& y = b.quotas[i];
    if (x.per != y.per || x.offset_us != y.offset_us || x.length_us != y.length_us) return false;
  }
  return true;
}

bool compatible(const limits& l, const state& s) {
  if (!s.aux.empty() && s.aux.size() != l.aux_size()) return false;
  if (l.algo == algorithm::gcra) return s.times.empty() || s.times.size() == l.rules.size();
  return std::is_sorted(s.times.begin(), s.times.end());
}

void merge(const limits& l, state& into, const state& older) {
  if (!compatible(l, older) || older.empty()) return;
  // Counters and quotas: the later window wins, and in one window the larger
  // count (both are taken to hold the same uses, as log entries are below).
  if (!older.aux.empty()) {
    if (into.aux.size() != older.aux.size()) {
      into.aux = older.aux;
    } else {
      const auto fold = [&](std::size_t at, std::size_t counts) {
        if (older.aux[at] > into.aux[at]) {
          std::copy_n(older.aux.begin() + static_cast<std::ptrdiff_t>(at), counts + 1,
                      into.aux.begin() + static_cast<std::ptrdiff_t>(at));
        } else if (older.aux[at] == into.aux[at]) {
          for (std::size_t k = 1; k <= counts; ++k) into.aux[at + k] = std::max(into.aux[at + k], older.aux[at + k]);
        }
      };
      for (std::size_t i = 0; i < l.rules.size(); ++i) {
        if (!l.counted(l.rules[i])) continue;
        const std::size_t at = counter_at(l, i);
        const std::int64_t tat = std::max(into.aux[at + 3], older.aux[at + 3]);  // the later arrival time
        // A snapshot one window behind: its current window is this one's previous.
        if (older.aux[at] == into.aux[at] - l.rules[i].window_us()) {
          into.aux[at + 1] = std::max(into.aux[at + 1], older.aux[at + 2]);
        } else {
          fold(at, 2);
        }
        into.aux[at + 3] = tat;
      }
      for (std::size_t i = 0; i < l.quotas.size(); ++i) fold(quota_at(l, i), 1);
    }
  }
  if (older.times.empty()) return;
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
