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
                            std::int64_t now_us, bool held) {
  if (!any(domain) || units <= 0) return {};
  pool& p = pools_[domain];
  auto it = p.members.find(identifier);
  if (it == p.members.end()) {
    if (size_ >= max_entries_) {
      ++untracked_;  // unshared: its own rules still apply
      return {};
    }
    it = p.members.emplace(std::string(identifier), member{}).first;
    it->second.share_per_s = p.level;
    it->second.first_us = now_us;
    it->second.window_start = now_us / std::max<std::int64_t>(1, p.cfg.window_us / 2);
    ++size_;
  }
  member& m = it->second;
  roll(p, m, now_us);
  m.used[0] += units;
  m.last_us = now_us;
  // GCRA: a use conforms when it comes no earlier than tat - ahead +
  // interval; it is charged either way (every unit is paid back at the share).
  const auto [interval, ahead] = gcra(p, m);
  const std::int64_t allowed = m.tat_us - ahead + interval;
  if (allowed > at_us || (held && allowed >= at_us - interval)) m.wants_more = true;
  m.tat_us = std::min(std::max(m.tat_us, at_us) + units * interval, now_us + rules::k_max_debt_us);
  rules::decision d;
  if (const std::int64_t next = m.tat_us - ahead + interval; next > now_us) d = {true, next, interval};
  return d;
}

void shares::refused(std::size_t domain, std::string_view identifier, std::int64_t at_us) {
  if (!any(domain)) return;
  pool& p = pools_[domain];
  const auto it = p.members.find(identifier);
  if (it == p.members.end()) return;
  member& m = it->second;
  const auto [interval, ahead] = gcra(p, m);
  if (m.tat_us - ahead + interval >= at_us - interval) m.wants_more = true;  // its share held it
}

void shares::split(pool& p, std::int64_t now_us, const shares& self) {
  // Water-filling: those that did not want more take what they used (and
  // are given k_headroom over it); the rest share the remainder equally.
  std::vector<std::pair<double, member*>> wants;
  wants.reserve(p.members.size());
  for (auto& [id, m] : p.members) {
    // A member younger than a window has no full measure of its use yet: it gets the level.
    const bool more = m.wants_more || m.wanted_more || now_us - m.first_us < p.cfg.window_us;
    m.wanted_more = m.wants_more;
    m.wants_more = false;
    wants.emplace_back(more ? std::numeric_limits<double>::infinity() : self.used_per_s(p, m, now_us), &m);
  }
  std::sort(wants.begin(), wants.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double remaining = p.rate_per_s;
  std::size_t i = 0;
  p.level = 0;
  for (; i < wants.size(); ++i) {
    const double level = remaining / static_cast<double>(wants.size() - i);
    if (wants[i].first >= level) {
      p.level = level;
      break;
    }
    wants[i].second->share_per_s = std::min(level, wants[i].first * k_headroom);
    remaining -= wants[i].first;
  }
  for (std::size_t j = i; j < wants.size(); ++j) wants[j].second->share_per_s = p.level;
  // Nobody wants more: a newcomer may use what is left, at least an equal split.
  if (i == wants.size()) p.level = std::max(remaining, p.rate_per_s / static_cast<double>(wants.size() + 1));
}

void shares::rebalance(std::int64_t now_us) {
  for (pool& p : pools_) {
    if (!p.on) continue;
    for (auto it = p.members.begin(); it != p.members.end();) {
      if (now_us - it->second.last_us > p.cfg.window_us) {
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
  return view{m.share_per_s, used_per_s(p, m, now_us), m.wants_more || m.wanted_more};
}

}  // namespace smockron::master
