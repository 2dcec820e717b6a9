// The master's /status document (see status.hpp).
#include "master/server/status.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <string_view>

namespace smockron::master {
namespace {

constexpr std::string_view period_name(config::quota_period p) {
  switch (p) {
    case config::quota_period::day: return "day";
    case config::quota_period::week: return "week";
    case config::quota_period::month: return "month";
    case config::quota_period::fixed: return "fixed";
  }
  return "month";
}

nlohmann::ordered_json rules_json(const std::vector<config::rule_config>& rules) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& r : rules) {
    if (r.is_quota()) {
      out.push_back({{"quota", r.quota},
                     {"per", period_name(r.per)},
                     {"window_s", static_cast<double>(r.per_length.count()) / 1e6},
                     {"tz_offset_s", r.tz_offset_s}});
    } else {
      out.push_back({{"rate", format_rate(r.r)}, {"burst", r.burst}});
    }
  }
  return out;
}

}  // namespace

std::string status_json(const config::master_config& cfg, const std::optional<store_status>& store,
                        metrics::registry& reg, std::uint16_t rls_port) {
  nlohmann::ordered_json doc;
  doc["store"] = cfg.store == config::store_kind::memory ? "memory" : "redis";
  if (cfg.rls && rls_port != 0) doc["rls"] = host_port{cfg.rls->host, rls_port}.to_string();
  if (store) doc["redis"] = {{"connected", store->connected}, {"unwritten_states", store->unwritten_states}};
  // The links' mechanism, and under CURVE how many keys of its own and of gatekeepers the master holds.
  if (cfg.curve) {
    doc["links"] = {
        {"mechanism", "CURVE"}, {"master_keys", cfg.curve->own.size()}, {"gatekeeper_keys", cfg.curve->allowed.size()}};
  } else {
    doc["links"] = {{"mechanism", "NULL"}};
  }
  doc["max_identifiers"] = cfg.max_identifiers;
  doc["domains"] = nlohmann::ordered_json::array();
  for (const auto& d : cfg.domains) {
    nlohmann::ordered_json overrides = nlohmann::ordered_json::array();
    for (const auto& o : d.overrides) {
      nlohmann::ordered_json one{{"identifier", o.identifier}, {"rules", rules_json(o.rules)}};
      if (o.concurrency > 0) one["concurrency"] = o.concurrency;
      one["source"] = o.from_api ? "api" : "file";
      overrides.push_back(std::move(one));
    }
    const auto& tracked = reg.add_gauge("smockron_master_domain_tracked_identifiers", "Tracked identifiers per domain",
                                        metrics::labels({{"domain", d.name}}));
    doc["domains"].push_back({{"name", d.name},
                              {"algorithm", d.algorithm == config::algorithm_kind::gcra ? "gcra" : "sliding-log"},
                              {"rules", rules_json(d.rules)},
                              {"overrides", std::move(overrides)},
                              {"tracked_identifiers", static_cast<std::uint64_t>(tracked.value())}});
    if (d.concurrency > 0) doc["domains"].back()["concurrency"] = d.concurrency;
    if (!d.tiers.empty()) {
      nlohmann::ordered_json tiers = nlohmann::ordered_json::object();
      for (const auto& t : d.tiers) {
        nlohmann::ordered_json one{{"rules", rules_json(t.rules)}};
        if (t.concurrency > 0) one["concurrency"] = t.concurrency;
        tiers[t.name] = std::move(one);
      }
      doc["domains"].back()["tiers"] = std::move(tiers);
    }
  }
  // Names come from the configuration file: invalid UTF-8 is replaced, never thrown.
  return doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string identifier_status_json(std::string_view domain, std::string_view identifier, const rules::limits& limits,
                                   bool overridden, const rules::state* st, std::int64_t now_us,
                                   const identifier_extras& extras) {
  const auto ms = [](std::int64_t us) { return us / 1000; };
  nlohmann::ordered_json doc;
  doc["domain"] = domain;
  doc["identifier"] = identifier;
  doc["algorithm"] = limits.algo == rules::algorithm::gcra ? "gcra" : "sliding-log";
  doc["rules"] = nlohmann::ordered_json::array();
  // Units used now: in the rule's window (a counted rule's estimate; GCRA,
  // how far the arrival time runs ahead), and in each quota's current window.
  for (std::size_t i = 0; i < limits.rules.size(); ++i) {
    const auto& r = limits.rules[i];
    doc["rules"].push_back({{"interval_ms", static_cast<double>(r.interval_us) / 1000.0},
                            {"burst", r.burst},
                            {"used", st ? rules::window_uses(limits, *st, i, now_us) : 0.0}});
  }
  doc["quotas"] = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < limits.quotas.size(); ++i) {
    const auto& q = limits.quotas[i];
    constexpr std::array<std::string_view, 4> k_names{"day", "week", "month", "fixed"};
    doc["quotas"].push_back({{"quota", q.limit},
                             {"per", k_names[static_cast<std::size_t>(q.per)]},
                             {"used", st ? rules::quota_used(limits, *st, i, now_us) : 0},
                             {"reset_ms", ms(rules::window_end_us(q, now_us))}});
  }
  doc["override"] = overridden;
  if (!extras.tier.empty()) doc["tier"] = extras.tier;
  if (extras.share) {
    // Units per second: its share of the domain's shared rate, what it used over the share window.
    doc["share"] = {{"rate_per_s", extras.share->share_per_s},
                    {"used_per_s", extras.share->used_per_s},
                    {"wants_more", extras.share->wants_more}};
  }
  if (extras.slots_held >= 0) {
    doc["slots"] = {{"held", extras.slots_held}};
    if (extras.slots_limit >= 0) doc["slots"]["limit"] = extras.slots_limit;
  }
  doc["now_ms"] = ms(now_us);
  doc["tracked"] = st != nullptr;
  nlohmann::ordered_json times = nlohmann::ordered_json::array();
  if (st) {
    for (const auto t : st->times) times.push_back(ms(t));
  }
  // Sliding log: when each recorded use happened (or was charged); GCRA: each rule's theoretical arrival time.
  doc[limits.algo == rules::algorithm::gcra ? "tat_ms" : "uses_ms"] = std::move(times);
  const rules::decision d = st ? rules::evaluate(limits, *st, now_us) : rules::decision{};
  doc["throttled"] = d.throttled;
  if (d.throttled) doc["next_allowed_ms"] = ms(d.next_us);
  return doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string top_json(const ingest& in, std::string_view domain, std::size_t n, std::int64_t now_us) {
  nlohmann::ordered_json doc;
  doc["now_ms"] = now_us / 1000;
  doc["window_s"] = 2 * top_limited::k_half_us / 1'000'000;
  doc["domains"] = nlohmann::ordered_json::array();
  const auto one = [&](std::size_t d) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    const auto& states = in.states();
    for (const auto& e : in.top().top(d, std::min(n, in.top().capacity()), now_us)) {
      const rules::state* st = states.find(d, e.identifier);
      const rules::decision dec =
          st ? rules::evaluate(states.current_limits(d, e.identifier), *st, now_us) : rules::decision{};
      const auto [uses, refusals] = states.find_stats(d, e.identifier).last_minute(now_us);
      nlohmann::ordered_json item{
          {"identifier", e.identifier}, {"limited", e.limited}, {"error", e.error}, {"throttled", dec.throttled}};
      if (dec.throttled) item["throttled_until_ms"] = (dec.next_us + 999) / 1000;
      item["uses"] = uses;
      item["refusals"] = refusals;
      if (const auto share = in.shared_rates().find(d, e.identifier, now_us)) {
        item["share_per_s"] = share->share_per_s;
        item["used_per_s"] = share->used_per_s;
      }
      list.push_back(std::move(item));
    }
    doc["domains"].push_back({{"domain", in.domains()[d].name}, {"top", std::move(list)}});
  };
  if (domain.empty()) {
    for (std::size_t d = 0; d < in.domains().size(); ++d) one(d);
  } else if (const auto d = in.find(domain)) {
    one(*d);
  } else {
    return {};
  }
  // Identifiers come from the wire: invalid UTF-8 is replaced, never thrown.
  return doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace smockron::master
