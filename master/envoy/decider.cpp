// Envoy's rate limit services answered from the engine (see decider.hpp).
#include "master/envoy/decider.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace smockron::master {
namespace {

using rate_limit = rls_pb::RateLimitResponse::RateLimit;
using strategy = ::envoy::type::v3::RateLimitStrategy;

std::int64_t ceil_s(std::int64_t us) { return (us + 999'999) / 1'000'000; }

// A count from the wire as units: at most what a cost can be.
std::int64_t units(std::uint64_t n) {
  return static_cast<std::int64_t>(std::min<std::uint64_t>(n, std::uint64_t{1} << 40));
}

std::int64_t duration_us(const google::protobuf::Duration& d) {
  return std::max<std::int64_t>(0, d.seconds()) * 1'000'000 + std::max<std::int32_t>(0, d.nanos()) / 1000;
}

// The current_limit of a quota (its whole limit per its calendar window).
rls_limit quota_limit(const rules::quota& q) {
  rls_limit l;
  l.requests_per_unit = static_cast<std::uint32_t>(std::min<std::int64_t>(q.limit, UINT32_MAX));
  switch (q.per) {
    case rules::period::day: l.unit = rate_limit::DAY; break;
    case rules::period::week: l.unit = rate_limit::WEEK; break;
    case rules::period::month: l.unit = rate_limit::MONTH; break;
    case rules::period::fixed: {
      // A fixed window as a rate over the nearest unit.
      const std::int64_t interval = std::max<std::int64_t>(1, q.length_us / std::max<std::int64_t>(1, q.limit));
      return rls_limit_of(interval);
    }
  }
  return l;
}

// "Name: value\r\n" lines (ratelimit_fields.hpp) as headers to add.
void add_header_lines(std::string_view lines,
                      google::protobuf::RepeatedPtrField<::envoy::config::core::v3::HeaderValue>& out) {
  while (!lines.empty()) {
    const auto end = lines.find("\r\n");
    const std::string_view line = lines.substr(0, end);
    lines = end == std::string_view::npos ? std::string_view() : lines.substr(end + 2);
    const auto colon = line.find(": ");
    if (colon == std::string_view::npos) continue;
    auto* h = out.Add();
    h->set_key(std::string(line.substr(0, colon)));
    h->set_value(std::string(line.substr(colon + 2)));
  }
}

}  // namespace

std::optional<std::string> identifier_of(const std::vector<std::pair<std::string_view, std::string_view>>& pairs,
                                         const std::vector<std::string>& keys, std::string_view separator) {
  std::string id;
  if (keys.empty()) {
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      if (i > 0) id.append(separator);
      id.append(pairs[i].second);
    }
  } else {
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const auto it = std::find_if(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first == keys[k]; });
      if (it == pairs.end()) return std::nullopt;
      if (k > 0) id.append(separator);
      id.append(it->second);
    }
  }
  if (id.empty() || id.size() > wire::max_identifier_bytes) return std::nullopt;
  return id;
}

rls_limit rls_limit_of(std::int64_t interval_us) {
  static constexpr std::pair<rate_limit::Unit, std::int64_t> k_units[] = {
      {rate_limit::SECOND, 1}, {rate_limit::MINUTE, 60}, {rate_limit::HOUR, 3'600}, {rate_limit::DAY, 86'400}};
  rls_limit l;
  for (const auto& [unit, s] : k_units) {
    const double per = static_cast<double>(s) * 1e6 / static_cast<double>(std::max<std::int64_t>(1, interval_us));
    const long long whole = std::clamp(std::llround(per), 1LL, static_cast<long long>(UINT32_MAX));
    l.unit = unit;
    l.requests_per_unit = static_cast<std::uint32_t>(whole);
    if (std::abs(static_cast<double>(whole) - per) <= 0.01 * per) break;  // whole within 1%: the smallest such unit
  }
  return l;
}

token_bucket token_bucket_of(std::int64_t interval_us, std::int64_t burst, double share) {
  // Not nothing: an idle stream's bucket still fills, if only once an hour.
  share = std::clamp(share, 1e-9, 1.0);
  token_bucket tb;
  tb.max_tokens = static_cast<std::uint32_t>(
      std::clamp<double>(std::floor(static_cast<double>(burst) * share + 1e-9), 1, UINT32_MAX));
  // Units per second of this share.
  const double rate = 1e6 / static_cast<double>(std::max<std::int64_t>(1, interval_us)) * share;
  double best_error = std::numeric_limits<double>::infinity();
  for (std::int64_t s = 1; s <= 3'600; ++s) {
    const double exact = rate * static_cast<double>(s);
    const auto tokens = std::max<long long>(1, std::llround(exact));
    if (tokens > static_cast<long long>(tb.max_tokens)) {
      // A fill never adds more than the bucket holds: a rate faster than
      // max_tokens a second is a full bucket every second.
      if (s == 1) tb.tokens_per_fill = tb.max_tokens;
      break;
    }
    const double error = std::abs(static_cast<double>(tokens) - exact) / exact;
    if (error < best_error) {
      best_error = error;
      tb.fill_interval_s = s;
      tb.tokens_per_fill = static_cast<std::uint32_t>(tokens);
    }
    if (error <= 0.005) break;
  }
  return tb;
}

std::vector<double> max_min_split(std::span<const double> demands, double capacity) {
  if (demands.empty()) return {};
  // Everyone's floor first, an equal part of k_share_floor of the capacity.
  const double floor = capacity * k_share_floor / static_cast<double>(demands.size());
  std::vector<double> out(demands.size(), floor);
  // What each wants beyond it (unknown: all it can get), lightest first.
  std::vector<std::pair<double, std::size_t>> wants;
  wants.reserve(demands.size());
  for (std::size_t i = 0; i < demands.size(); ++i) {
    wants.emplace_back(demands[i] < 0 ? capacity : std::max(0.0, demands[i] * k_share_headroom - floor), i);
  }
  std::sort(wants.begin(), wants.end());
  double remaining = capacity - floor * static_cast<double>(demands.size());
  for (std::size_t k = 0; k < wants.size(); ++k) {
    const double level = remaining / static_cast<double>(wants.size() - k);
    if (wants[k].first >= level) {
      // This one and every heavier one get the level.
      for (std::size_t j = k; j < wants.size(); ++j) out[wants[j].second] += level;
      return out;
    }
    out[wants[k].second] += wants[k].first;
    remaining -= wants[k].first;
  }
  // Every want met: what is left goes to all alike.
  for (double& share : out) share += remaining / static_cast<double>(out.size());
  return out;
}

envoy_decider::envoy_decider(const config::master_config& cfg, ingest& engine, const clock& clk, metrics::registry& reg,
                             publish_fn publish)
    : engine_(engine),
      clock_(clk),
      publish_(std::move(publish)),
      rls_ok_(reg.add_counter("smockron_master_rls_requests_total", "RLS ShouldRateLimit calls answered, by code",
                              metrics::labels({{"code", "ok"}}))),
      rls_over_(reg.add_counter("smockron_master_rls_requests_total", "RLS ShouldRateLimit calls answered, by code",
                                metrics::labels({{"code", "over_limit"}}))),
      rls_shadow_over_(reg.add_counter("smockron_master_rls_requests_total",
                                       "RLS ShouldRateLimit calls answered, by code",
                                       metrics::labels({{"code", "shadow_over_limit"}}))),
      rls_unknown_(reg.add_counter("smockron_master_rls_requests_total", "RLS ShouldRateLimit calls answered, by code",
                                   metrics::labels({{"code", "unknown_domain"}}))),
      rls_invalid_(reg.add_counter("smockron_master_rls_requests_total", "RLS ShouldRateLimit calls answered, by code",
                                   metrics::labels({{"code", "invalid_argument"}}))),
      rls_unidentified_(reg.add_counter("smockron_master_rls_unidentified_descriptors_total",
                                        "RLS descriptors that name no identifier (a key missing): not limited")),
      rlqs_reports_(reg.add_counter("smockron_master_rlqs_reports_total", "RLQS usage reports received")),
      rlqs_token_bucket_(reg.add_counter("smockron_master_rlqs_actions_total", "RLQS bucket actions sent, by kind",
                                         metrics::labels({{"action", "token_bucket"}}))),
      rlqs_deny_(reg.add_counter("smockron_master_rlqs_actions_total", "RLQS bucket actions sent, by kind",
                                 metrics::labels({{"action", "deny_all"}}))),
      rlqs_allow_(reg.add_counter("smockron_master_rlqs_actions_total", "RLQS bucket actions sent, by kind",
                                  metrics::labels({{"action", "allow_all"}}))),
      rlqs_abandon_(reg.add_counter("smockron_master_rlqs_actions_total", "RLQS bucket actions sent, by kind",
                                    metrics::labels({{"action", "abandon"}}))),
      rlqs_buckets_(reg.add_gauge("smockron_master_rlqs_buckets", "RLQS buckets tracked over all open streams")) {
  reconfigure(cfg);
}

void envoy_decider::reconfigure(const config::master_config& cfg) {
  cfg_ = cfg;
  domains_.clear();
  for (const auto& d : cfg_.domains) {
    if (const auto i = engine_.find(d.name)) domains_.emplace(d.name, domain_view{*i, &d});
  }
  max_buckets_ = cfg_.rlqs_max_buckets;
}

const envoy_decider::domain_view* envoy_decider::find(std::string_view domain) const {
  const auto it = domains_.find(domain);
  return it == domains_.end() ? nullptr : &it->second;
}

envoy_decider::status envoy_decider::should_rate_limit(const rls_pb::RateLimitRequest& req,
                                                       rls_pb::RateLimitResponse& resp, std::int64_t now_us) {
  const int n = req.descriptors_size();
  if (n == 0 || n > k_max_descriptors) {
    rls_invalid_.inc();
    return {false, n == 0 ? "no descriptors" : "more than 64 descriptors"};
  }
  const domain_view* dv = find(req.domain());
  if (dv == nullptr) {
    rls_unknown_.inc();
    const auto code = cfg_.rls_deny_unknown ? rls_pb::RateLimitResponse::OVER_LIMIT : rls_pb::RateLimitResponse::OK;
    resp.set_overall_code(code);
    for (int i = 0; i < n; ++i) resp.add_statuses()->set_code(code);
    return {};
  }
  const config::domain_config& dc = *dv->cfg;
  // A request's hits apply to each descriptor without its own (absent or 0: 1).
  const std::int64_t request_hits = req.hits_addend() == 0 ? 1 : req.hits_addend();
  struct item {
    std::optional<std::string> identifier;
    std::int64_t cost = 1;
    bool fits = true;
  };
  std::vector<item> items(static_cast<std::size_t>(n));
  std::vector<std::pair<std::string_view, std::string_view>> pairs;
  bool all_fit = true;
  for (int i = 0; i < n; ++i) {
    const auto& desc = req.descriptors(i);
    pairs.clear();
    for (const auto& e : desc.entries()) pairs.emplace_back(e.key(), e.value());
    item& it = items[static_cast<std::size_t>(i)];
    it.identifier = identifier_of(pairs, dc.descriptor_keys, dc.descriptor_separator);
    it.cost = desc.has_hits_addend() ? units(desc.hits_addend().value()) : request_hits;
    if (!it.identifier) {
      rls_unidentified_.inc();
      continue;
    }
    it.fits = engine_.fits(dv->index, *it.identifier, it.cost, now_us);
    all_fit = all_fit && it.fits;
  }
  // All or nothing: the units are charged when every descriptor's fit (a
  // shadow domain charges them whatever); otherwise only the refusals count.
  const bool charge = all_fit || dc.envoy_shadow;
  bool over = false;
  bool shadow_over = false;  // a shadow domain's request that would have been refused
  // The descriptor whose standing the RateLimit fields describe: the first
  // refused, else the one with the fewest units left.
  std::optional<ingest::check_result> shown;
  std::int64_t shown_remaining = std::numeric_limits<std::int64_t>::max();
  for (int i = 0; i < n; ++i) {
    auto* st = resp.add_statuses();
    const item& it = items[static_cast<std::size_t>(i)];
    if (!it.identifier) {
      st->set_code(rls_pb::RateLimitResponse::OK);
      continue;
    }
    const auto mode = charge    ? limiter::charge_mode::force
                      : it.fits ? limiter::charge_mode::probe
                                : limiter::charge_mode::charge;
    auto res = engine_.check(dv->index, *it.identifier, it.cost, now_us, mode);
    if (res.publish) {
      publish_(*res.publish);
      ++published_;
    }
    const bool refused = !it.fits && !dc.envoy_shadow;
    st->set_code(refused ? rls_pb::RateLimitResponse::OVER_LIMIT : rls_pb::RateLimitResponse::OK);
    shadow_over = shadow_over || (!it.fits && dc.envoy_shadow);
    if (res.standing.count > 0) {
      const auto& b = res.standing.items[res.binding];
      const rules::limits& l = engine_.limits_now(dv->index, *it.identifier);
      const rls_limit rl = res.binding < l.rules.size() ? rls_limit_of(l.rules[res.binding].interval_us)
                                                        : quota_limit(l.quotas[res.binding - l.rules.size()]);
      auto* cl = st->mutable_current_limit();
      cl->set_name(policy_name(req.domain(), res.standing, res.binding));
      cl->set_requests_per_unit(rl.requests_per_unit);
      cl->set_unit(rl.unit);
      st->set_limit_remaining(static_cast<std::uint32_t>(std::clamp<std::int64_t>(b.remaining, 0, UINT32_MAX)));
      st->mutable_duration_until_reset()->set_seconds(b.reset_s);
      const bool first_refused = refused && !over;
      if (first_refused || (!over && b.remaining < shown_remaining)) {
        shown_remaining = b.remaining;
        shown = std::move(res);
      }
    }
    over = over || refused;
  }
  resp.set_overall_code(over ? rls_pb::RateLimitResponse::OVER_LIMIT : rls_pb::RateLimitResponse::OK);
  (over ? rls_over_ : rls_ok_).inc();
  if (shadow_over) rls_shadow_over_.inc();
  if (shown) {
    // As smockron-proxy writes them: refused, nothing remains until the units fit.
    const std::int64_t retry_s = over && shown->retry_us > now_us ? ceil_s(shown->retry_us - now_us) : 0;
    std::string lines;
    append_ratelimit_fields(lines, req.domain(), shown->standing, retry_s);
    if (retry_s > 0) lines.append("Retry-After: ").append(std::to_string(retry_s)).append("\r\n");
    add_header_lines(lines, *resp.mutable_response_headers_to_add());
  }
  return {};
}

double envoy_decider::share_of(std::size_t domain, std::string_view identifier, std::uint64_t stream,
                               double demand_per_s, std::int64_t elapsed_us, double rate_per_s, std::int64_t now_us) {
  std::string key = std::to_string(domain);
  key.push_back('\0');
  key.append(identifier);
  auto& v = sharing_[key];
  // A stream is a sharer until it misses a report: k_share_window_us, or one
  // and a half of its own reporting interval when that is longer.
  std::erase_if(v, [&](const sharer& s) {
    return s.stream != stream &&
           now_us - s.reported_us > std::max<std::int64_t>(k_share_window_us, s.interval_us + s.interval_us / 2);
  });
  auto it = std::find_if(v.begin(), v.end(), [&](const sharer& s) { return s.stream == stream; });
  if (it == v.end()) it = v.insert(v.end(), sharer{stream, now_us, 0, demand_per_s});
  it->reported_us = now_us;
  if (elapsed_us > 0) it->interval_us = elapsed_us;
  // A report covering no time says nothing of demand: the last known stands.
  if (demand_per_s >= 0 || it->demand_per_s < 0) it->demand_per_s = demand_per_s;
  if (v.size() == 1 || rate_per_s <= 0) return 1.0;
  std::vector<double> demands;
  demands.reserve(v.size());
  for (const sharer& s : v) demands.push_back(s.demand_per_s);
  return max_min_split(demands, rate_per_s)[static_cast<std::size_t>(it - v.begin())] / rate_per_s;
}

void envoy_decider::report(rlqs_stream_state& stream, const rlqs_pb::RateLimitQuotaUsageReports& reports,
                           rlqs_pb::RateLimitQuotaResponse& resp, std::int64_t now_us) {
  rlqs_reports_.inc();
  const domain_view* dv = find(reports.domain());
  std::vector<std::pair<std::string_view, std::string_view>> pairs;
  std::string key;
  for (const auto& usage : reports.bucket_quota_usages()) {
    pairs.assign(usage.bucket_id().bucket().begin(), usage.bucket_id().bucket().end());
    std::sort(pairs.begin(), pairs.end());  // a map: its order means nothing
    key.assign(reports.domain());
    key.push_back('\0');
    for (const auto& [k, v] : pairs) key.append(k).append(1, '\0').append(v).append(1, '\0');
    auto* action = resp.add_bucket_action();
    *action->mutable_bucket_id() = usage.bucket_id();
    auto it = stream.buckets.find(key);
    if (it == stream.buckets.end()) {
      if (stream.buckets.size() >= max_buckets_) {
        action->mutable_abandon_action();
        rlqs_abandon_.inc();
        continue;
      }
      rlqs_stream_state::bucket b;
      if (dv) {
        if (auto id = identifier_of(pairs, dv->cfg->descriptor_keys, dv->cfg->descriptor_separator)) {
          b.domain = dv->index;
          b.identifier = std::move(*id);
        }
      }
      it = stream.buckets.emplace(key, std::move(b)).first;
      ++buckets_;
      rlqs_buckets_.set(static_cast<double>(buckets_));
    }
    auto& b = it->second;
    if (b.domain && dv) b.domain = dv->index;  // the same name (in the key); a reload may renumber domains
    if (!b.domain || !dv) {
      action->mutable_abandon_action();  // not a domain or identifier of ours: Envoy's own default applies
      rlqs_abandon_.inc();
      continue;
    }
    // What Envoy let through happened: charged whatever the limit says.
    if (usage.num_requests_allowed() > 0) {
      const auto res = engine_.check(*b.domain, b.identifier, units(usage.num_requests_allowed()), now_us,
                                     limiter::charge_mode::force);
      if (res.publish) {
        publish_(*res.publish);
        ++published_;
      }
    }
    if (usage.num_requests_denied() > 0) engine_.refused_elsewhere(*b.domain, b.identifier, now_us);
    const std::int64_t elapsed_us = duration_us(usage.time_elapsed());
    const double demand_per_s =
        elapsed_us > 0 ? static_cast<double>(units(usage.num_requests_allowed()) + units(usage.num_requests_denied())) *
                             1e6 / static_cast<double>(elapsed_us)
                       : -1.0;
    answer_bucket(stream, b, demand_per_s, elapsed_us, *action, now_us);
  }
}

void envoy_decider::answer_bucket(rlqs_stream_state& stream, rlqs_stream_state::bucket& b, double demand_per_s,
                                  std::int64_t elapsed_us, rlqs_pb::RateLimitQuotaResponse::BucketAction& action,
                                  std::int64_t now_us) {
  auto* qa = action.mutable_quota_assignment_action();
  auto* strat = qa->mutable_rate_limit_strategy();
  const auto now = engine_.check(*b.domain, b.identifier, 0, now_us, limiter::charge_mode::probe);
  const rules::limits& l = engine_.limits_now(*b.domain, b.identifier);
  // The rule with the lowest rate, split among the streams reporting the
  // identifier; with quotas alone, what is left of the first one over the
  // time until it is whole again is what the split weighs, and the bucket is
  // what is left of them.
  const auto slowest = std::max_element(l.rules.begin(), l.rules.end(),
                                        [](const auto& x, const auto& y) { return x.interval_us < y.interval_us; });
  const bool split = slowest != l.rules.end() || !l.quotas.empty();
  const double rate_per_s =
      slowest != l.rules.end()
          ? 1e6 / static_cast<double>(std::max<std::int64_t>(1, slowest->interval_us))
          : (split ? static_cast<double>(now.standing.items[0].remaining) /
                         static_cast<double>(std::max<std::int64_t>(1, now.standing.items[0].reset_s))
                   : 0.0);
  // Noted before any answer: a throttled stream's denials are its demand when the throttle ends.
  const double fresh =
      split ? share_of(*b.domain, b.identifier, stream.id, demand_per_s, elapsed_us, rate_per_s, now_us) : 1.0;
  // Envoy reads whole seconds: an assignment lives until the report after
  // next (three reporting intervals, 2 s to 60 s), a denial until it ends.
  const std::int64_t report_ttl = std::clamp<std::int64_t>(ceil_s(3 * elapsed_us), 2, 60);
  if (now.throttled_until_us > now_us) {
    strat->set_blanket_rule(strategy::DENY_ALL);
    qa->mutable_assignment_time_to_live()->set_seconds(
        std::max<std::int64_t>(1, ceil_s(now.throttled_until_us - now_us)));
    b.sent.reset();
    rlqs_deny_.inc();
    return;
  }
  qa->mutable_assignment_time_to_live()->set_seconds(report_ttl);
  if (!split) {
    strat->set_blanket_rule(strategy::ALLOW_ALL);
    b.sent.reset();
    rlqs_allow_.inc();
    return;
  }
  const double share = b.sent && std::abs(fresh - b.share) < k_share_hysteresis * b.share ? b.share : fresh;
  token_bucket tb = slowest != l.rules.end() ? token_bucket_of(slowest->interval_us, slowest->burst, share)
                                             : token_bucket{UINT32_MAX, 1, 3'600};
  // A quota with less left than the bucket would hold: the bucket is this
  // stream's part of what is left, filled once an hour (a new one comes with
  // each report), so what the Envoys let through before their next reports
  // stays within the quota, but for what is in flight to this answer. A part
  // under one request: DENY_ALL until the next report.
  // The share kept by hysteresis may be more than this one: the parts of a
  // quota given out at this moment add up to no more than what is left.
  const double quota_share = std::min(share, fresh);
  for (std::size_t i = l.rules.size(); i < now.standing.count; ++i) {
    const auto left = static_cast<std::int64_t>(
        std::floor(static_cast<double>(now.standing.items[i].remaining) * quota_share + 1e-9));
    if (left >= static_cast<std::int64_t>(tb.max_tokens)) continue;
    if (left < 1) {
      strat->set_blanket_rule(strategy::DENY_ALL);
      b.sent.reset();
      rlqs_deny_.inc();
      return;
    }
    tb = token_bucket{static_cast<std::uint32_t>(left), 1, 3'600};
  }
  // Envoy replaces its bucket only when max_tokens or tokens_per_fill change:
  // a new rate with the same two numbers goes out as twice both, if it can.
  if (b.sent && b.sent->max_tokens == tb.max_tokens && b.sent->tokens_per_fill == tb.tokens_per_fill &&
      b.sent->fill_interval_s != tb.fill_interval_s && tb.tokens_per_fill * 2 <= tb.max_tokens) {
    tb.tokens_per_fill *= 2;
    tb.fill_interval_s *= 2;
  }
  auto* bucket = strat->mutable_token_bucket();
  bucket->set_max_tokens(tb.max_tokens);
  bucket->mutable_tokens_per_fill()->set_value(tb.tokens_per_fill);
  bucket->mutable_fill_interval()->set_seconds(tb.fill_interval_s);
  b.sent = tb;
  b.share = share;
  rlqs_token_bucket_.inc();
}

void envoy_decider::stream_closed(const rlqs_stream_state& stream) {
  for (const auto& [key, b] : stream.buckets) {
    if (!b.domain) continue;
    std::string k = std::to_string(*b.domain);
    k.push_back('\0');
    k.append(b.identifier);
    const auto it = sharing_.find(k);
    if (it == sharing_.end()) continue;
    std::erase_if(it->second, [&](const sharer& s) { return s.stream == stream.id; });
    if (it->second.empty()) sharing_.erase(it);
  }
  buckets_ -= std::min(buckets_, stream.buckets.size());
  rlqs_buckets_.set(static_cast<double>(buckets_));
}

}  // namespace smockron::master
