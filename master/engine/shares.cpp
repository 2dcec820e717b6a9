// Shared rates split max-min (see shares.hpp).
#include "master/engine/shares.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace smockron::master {

void shares::configure(const std::vector<std::optional<pool_config>>& domains,
                       const std::vector<std::optional<std::size_t>>& old_index) {
  std::vector<pool> next(domains.size());
  std::size_t kept = 0;
  for (std::size_t i = 0; i < domains.size(); ++i) {
    if (!domains[i]) continue;
    pool& p = next[i];
    if (old_index[i] && *old_index[i] < pools_.size() && pools_[*old_index[i]].on) {
      p = std::move(pools_[*old_index[i]]);  // its identifiers and their shares, rebalanced below
    }
    p.on = true;
    p.cfg = *domains[i];
    p.rate_per_s = 1e6 / static_cast<double>(p.cfg.interval_us);
    kept += p.members.size();
  }
  pools_ = std::move(next);
  size_ = kept;
  for (pool& p : pools_) {
    if (p.on && p.level <= 0) p.level = p.rate_per_s;
  }
}

void shares::roll(const pool& p, member& m, std::int64_t now_us) const {
  const std::int64_t half = std::max<std::int64_t>(1, p.cfg.window_us / 2);
  const std::int64_t h = now_us / half;
  if (h == m.window_start) return;
  m.used[1] = h == m.window_start + 1 ? m.used[0] : 0;
  m.used[0] = 0;
  m.window_start = h;
}

double shares::used_per_s(const pool& p, const member& m, std::int64_t now_us) const {
  const std::int64_t half = std::max<std::int64_t>(1, p.cfg.window_us / 2);
  if (now_us / half > m.window_start + 1) return 0;  // nothing in the window
  // The two half windows cover from the start of the last one to now; a
  // member seen later than that, from its first use (at least one half).
  const std::int64_t from = std::max(m.first_us, (m.window_start - 1) * half);
  const std::int64_t span = std::max(now_us - from, half);
  return static_cast<double>(m.used[0] + m.used[1]) * 1e6 / static_cast<double>(span);
}

std::pair<std::int64_t, std::int64_t> shares::gcra(const pool& p, const member& m) {
  // Its share's burst is the domain's scaled by share / rate: the same span of time.
  const double share = std::max(m.share_per_s, p.rate_per_s * 1e-6);
  const auto interval = static_cast<std::int64_t>(std::ceil(1e6 / share));
  return {interval, std::max(interval, p.cfg.interval_us * p.cfg.burst)};
}

rules::decision shares::use(std::size_t domain, std::string_view identifier, std::int64_t units, std::int64_t at_us,
                            std::int64_t now_us, bool held, std::int64_t weight) {
  if (!any(domain) || units <= 0) return {};
  pool& p = pools_[domain];
  auto it = p.members.find(identifier);
  if (it == p.members.end()) {
    if (size_ >= max_entries_) {
      ++untracked_;  // unshared: its own rules still apply
      return {};
    }
    it = p.members.emplace(std::string(identifier), member{}).first;
    it->second.share_per_s = std::min(p.rate_per_s, p.level * static_cast<double>(std::max<std::int64_t>(1, weight)));
    it->second.first_us = now_us;
    it->second.window_start = now_us / std::max<std::int64_t>(1, p.cfg.window_us / 2);
    ++size_;
  }
  member& m = it->second;
  m.weight = std::max<std::int64_t>(1, weight);
  roll(p, m, now_us);
  m.used[0] += units;
  m.last_us = now_us;
  // GCRA: a use conforms when it comes no earlier than tat - ahead +
  // interval; it is charged either way (every unit is paid back at the share).
  const auto [interval, ahead] = gcra(p, m);
  m.charged_share = m.share_per_s;
  const std::int64_t allowed = m.tat_us - ahead + interval;
  // It wants more until the use goes (a held one waits at its gatekeeper until at_us, unreported).
  if (allowed > at_us || (held && allowed >= at_us - interval)) m.wanted_us = std::max({m.wanted_us, now_us, at_us});
  m.tat_us = std::min(std::max(m.tat_us, at_us) + units * interval, now_us + rules::k_max_debt_us);
  rules::decision d;
  if (const std::int64_t next = m.tat_us - ahead + interval; next > now_us) {
    d = {.throttled = true, .next_us = next, .interval_us = interval, .by = rules::limit_kind::share};
    d.burst = std::max<std::int64_t>(1, ahead / interval);
  }
  return d;
}

void shares::refused(std::size_t domain, std::string_view identifier, std::int64_t at_us) {
  if (!any(domain)) return;
  pool& p = pools_[domain];
  const auto it = p.members.find(identifier);
  if (it == p.members.end()) return;
  member& m = it->second;
  const auto [interval, ahead] = gcra(p, m);
  if (m.tat_us - ahead + interval >= at_us - interval) m.wanted_us = std::max(m.wanted_us, at_us);  // its share held it
}

void shares::split(pool& p, std::int64_t now_us, const shares& self) {
  // Water-filling, weighted: those that did not want more take what they
  // used (and are given k_headroom over it); the rest share the remainder,
  // each in proportion to its weight. Ascending want per weight.
  struct want {
    double per_weight;
    double units;
    member* m;
  };
  std::vector<want> wants;
  wants.reserve(p.members.size());
  double weights = 0;
  for (auto& [id, m] : p.members) {
    // One idle for a window is kept only for what it still owes (rebalance):
    // it takes no part in the split, and its share and the pace of its debt
    // stay as they were until it comes back (a share of what it used
    // lately, nothing, would make that debt endless).
    if (now_us - m.last_us > p.cfg.window_us) continue;
    // A member younger than a window has no full measure of its use yet, and
    // one its share holds now (its uses wait at a gatekeeper, unreported
    // until they go) wants more than it has: they get the level.
    const auto [interval, ahead] = gcra(p, m);
    const bool held_now = m.tat_us - ahead + interval > now_us;
    const bool more = now_us - m.wanted_us < k_want_us || held_now || now_us - m.first_us < p.cfg.window_us;
    const double used = more ? std::numeric_limits<double>::infinity() : self.used_per_s(p, m, now_us);
    wants.push_back({used / static_cast<double>(m.weight), used, &m});
    weights += static_cast<double>(m.weight);
  }
  std::sort(wants.begin(), wants.end(), [](const want& a, const want& b) { return a.per_weight < b.per_weight; });
  double remaining = p.rate_per_s;
  std::size_t i = 0;
  p.level = 0;
  for (; i < wants.size(); ++i) {
    const double level = remaining / weights;  // per weight
    const auto w = static_cast<double>(wants[i].m->weight);
    if (wants[i].per_weight >= level) {
      p.level = level;
      break;
    }
    wants[i].m->share_per_s = std::min(level * w, wants[i].units * k_headroom);
    remaining -= wants[i].units;
    weights -= w;
  }
  for (std::size_t j = i; j < wants.size(); ++j) {
    wants[j].m->share_per_s = p.level * static_cast<double>(wants[j].m->weight);
  }
  // What a member owes is units, not time: under its new share they are paid
  // back at the new rate (a debt run up at a small share must not hold it at a larger one).
  for (want& w : wants) {
    member& m = *w.m;
    if (m.tat_us > now_us && m.charged_share > 0 && m.share_per_s != m.charged_share) {
      const double owed = static_cast<double>(m.tat_us - now_us) * m.charged_share;
      m.tat_us = now_us + static_cast<std::int64_t>(owed / std::max(m.share_per_s, p.rate_per_s * 1e-6));
    }
    m.charged_share = m.share_per_s;
  }
  // Nobody wants more: a newcomer may use what is left, at least an even split.
  if (i == wants.size()) p.level = std::max(remaining, p.rate_per_s / static_cast<double>(wants.size() + 1));
}

void shares::rebalance(std::int64_t now_us) {
  for (pool& p : pools_) {
    if (!p.on) continue;
    for (auto it = p.members.begin(); it != p.members.end();) {
      // Idle for a window and owing nothing (one that owes is quiet because it is held).
      if (now_us - it->second.last_us > p.cfg.window_us && it->second.tat_us <= now_us) {
        it = p.members.erase(it);
        --size_;
        continue;
      }
      roll(p, it->second, now_us);
      ++it;
    }
    split(p, now_us, *this);
  }
}

std::optional<shares::view> shares::find(std::size_t domain, std::string_view identifier, std::int64_t now_us) const {
  if (!any(domain)) return std::nullopt;
  const pool& p = pools_[domain];
  const auto it = p.members.find(identifier);
  if (it == p.members.end()) return std::nullopt;
  member m = it->second;
  roll(p, m, now_us);
  return view{m.share_per_s, used_per_s(p, m, now_us), now_us - m.wanted_us < k_want_us};
}

}  // namespace smockron::master
