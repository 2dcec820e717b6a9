// Envoy's rate limit services answered from the engine, under the engine's
// lock (grpc_server.hpp: on gRPC's threads). RLS v3 (ShouldRateLimit):
// each descriptor names an identifier of the request's domain and is charged
// its hits as a gatekeeper charges a known cost: admitted when the units fit
// under every rule and quota now, else OVER_LIMIT with the limit that
// decides. RLQS (StreamRateLimitQuotas): each bucket's usage report is
// charged to the identifier it names, and answered with what Envoy enforces
// locally until its next report: a token bucket of the identifier's rule
// (split among the streams reporting it by what each wants: max_min_split),
// DENY_ALL while it is throttled.
// Both use the state smockron-proxy's accounting uses: one budget whoever asks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "envoy/service/rate_limit_quota/v3/rlqs.pb.h"
#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "master/engine/ingest.hpp"
#include "shared/base/clock.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/string_hash.hpp"
#include "shared/config/config.hpp"

namespace smockron::master {

namespace rls_pb = ::envoy::service::ratelimit::v3;
namespace rlqs_pb = ::envoy::service::rate_limit_quota::v3;

/// The identifier `keys` pick from (key, value) pairs (a descriptor's entries
/// in order, or a BucketId's map by key): the values of those keys, in the
/// order of `keys`, joined by `separator`; every pair's value when `keys` is
/// empty. Nothing when a key is missing or the result is empty or longer
/// than wire::max_identifier_bytes.
std::optional<std::string> identifier_of(const std::vector<std::pair<std::string_view, std::string_view>>& pairs,
                                         const std::vector<std::string>& keys, std::string_view separator);

/// A rate (1 unit every interval_us) in Envoy's RLS terms: the smallest unit
/// (second, minute, hour, day) in which it is a whole number of units within
/// 1% (100/min: 100 per minute, not 2 per second), else per day; at least 1.
struct rls_limit {
  rls_pb::RateLimitResponse::RateLimit::Unit unit = rls_pb::RateLimitResponse::RateLimit::SECOND;
  std::uint32_t requests_per_unit = 1;
};
rls_limit rls_limit_of(std::int64_t interval_us);

/// A token bucket Envoy's RLQS client enforces (whole-second fill interval).
struct token_bucket {
  std::uint32_t max_tokens = 1;
  std::uint32_t tokens_per_fill = 1;
  std::int64_t fill_interval_s = 1;
  friend bool operator==(const token_bucket&, const token_bucket&) = default;
};
/// The bucket for the fraction `share` (0 to 1) of a rule (1 unit every
/// interval_us, `burst`): max_tokens = burst x share (at least 1); the
/// whole-second fill interval (1 s to 1 h) whose tokens per fill come closest
/// to the rate x share (first within 0.5%), never more than max_tokens.
token_bucket token_bucket_of(std::int64_t interval_us, std::int64_t burst, double share);

/// What a light sharer gets beyond what it used: room to grow by a quarter
/// before its next report shows it wants more.
inline constexpr double k_share_headroom = 1.25;
/// The part of the capacity split equally whatever the demand: a sharer
/// asked for nothing still lets a few requests through, which its next
/// report counts as demand (an Envoy the balancer starts sending a key to is
/// not refused for a whole reporting interval).
inline constexpr double k_share_floor = 0.1;
/// `capacity` (units a second) split max-min fairly among `demands` (units a
/// second each; negative: not known yet, wants all it can get), Doorman's
/// FAIR_SHARE over what is left once each has its floor (k_share_floor of the
/// capacity split equally): one that wants less than an equal split of what
/// is left gets what it wants x k_share_headroom, the others split the rest
/// equally (the level); what none of them wants is split equally among all.
/// The shares, in the order given, add up to `capacity`.
std::vector<double> max_min_split(std::span<const double> demands, double capacity);

/// One RLQS stream's memory (under the engine's lock): the buckets it reported and what
/// each was last told.
struct rlqs_stream_state {
  std::uint64_t id = 0;
  struct bucket {
    std::optional<std::size_t> domain;  ///< nothing: not tracked (abandoned)
    std::string identifier;
    std::optional<token_bucket> sent;  ///< the token bucket last assigned
    double share = 0;                  ///< its fraction of the rule, with `sent`
  };
  /// By the BucketId's pairs, sorted by key, each "key\0value\0".
  std::map<std::string, bucket, std::less<>> buckets;
};

class envoy_decider {
public:
  using publish_fn = std::function<void(const wire::delay_until&)>;
  /// Descriptors one RLS request may carry (more: INVALID_ARGUMENT).
  static constexpr int k_max_descriptors = 64;
  /// A stream reporting an identifier within this long (or 1.5 of its
  /// reporting interval, when longer) shares its rate.
  static constexpr std::int64_t k_share_window_us = 3'000'000;
  /// A stream's share that moved by less than this fraction keeps the bucket
  /// sent: Envoy starts a replaced bucket full, so every change is a burst.
  static constexpr double k_share_hysteresis = 0.1;

  /// `publish`: how a DELAY_UNTIL reaches the gatekeepers (what leaves an identifier throttled).
  envoy_decider(const config::master_config& cfg, ingest& engine, const clock& clk, metrics::registry& reg,
                publish_fn publish);
  /// Wall time now (the loop's clock).
  std::int64_t now_us() const { return clock_.wall_us(); }
  /// The domains' descriptor keys and modes, and the unknown-domain answer, from `cfg`.
  void reconfigure(const config::master_config& cfg);

  /// Answers one ShouldRateLimit call at wall time `now_us`.
  /// Not OK: INVALID_ARGUMENT (no descriptor, too many).
  struct status {
    bool ok = true;
    std::string message;
  };
  status should_rate_limit(const rls_pb::RateLimitRequest& req, rls_pb::RateLimitResponse& resp, std::int64_t now_us);

  /// Charges one usage report of an RLQS stream and appends an action for
  /// each of its buckets to `resp`.
  void report(rlqs_stream_state& stream, const rlqs_pb::RateLimitQuotaUsageReports& reports,
              rlqs_pb::RateLimitQuotaResponse& resp, std::int64_t now_us);
  /// A stream ended: it no longer shares its identifiers' rates.
  void stream_closed(const rlqs_stream_state& stream);

  /// Buckets tracked over all streams now.
  std::size_t buckets() const { return buckets_; }
  /// DELAY_UNTIL messages handed to `publish` so far.
  std::uint64_t published() const { return published_; }

private:
  struct domain_view {
    std::size_t index = 0;
    const config::domain_config* cfg = nullptr;
  };
  const domain_view* find(std::string_view domain) const;
  /// `demand_per_s`: the requests the stream's report counted (allowed and
  /// denied) a second; negative when its time_elapsed was 0.
  void answer_bucket(rlqs_stream_state& stream, rlqs_stream_state::bucket& b, double demand_per_s,
                     std::int64_t elapsed_us, rlqs_pb::RateLimitQuotaResponse::BucketAction& action,
                     std::int64_t now_us);
  /// `stream`'s fraction of (domain, identifier)'s rate, max_min_split among
  /// the streams that reported it lately (see sharer), `stream` noted now as
  /// wanting `demand_per_s` out of `rate_per_s`, its report covering `elapsed_us`.
  double share_of(std::size_t domain, std::string_view identifier, std::uint64_t stream, double demand_per_s,
                  std::int64_t elapsed_us, double rate_per_s, std::int64_t now_us);

  ingest& engine_;
  const clock& clock_;
  publish_fn publish_;
  config::master_config cfg_;  ///< the domains' descriptor keys (views point into it)
  string_map<domain_view> domains_;
  std::uint64_t max_buckets_ = 0;
  std::size_t buckets_ = 0;
  std::uint64_t published_ = 0;
  /// A stream reporting an identifier: it shares until it misses a report
  /// (within k_share_window_us of its last, or 1.5 of its own reporting
  /// interval when that is longer).
  struct sharer {
    std::uint64_t stream = 0;
    std::int64_t reported_us = 0;
    std::int64_t interval_us = 0;  ///< the time its last report covered
    double demand_per_s = -1;      ///< negative: not known yet
  };
  /// Per "domain index\0identifier": the streams reporting it.
  string_map<std::vector<sharer>> sharing_;

  metrics::counter& rls_ok_;
  metrics::counter& rls_over_;
  metrics::counter& rls_shadow_over_;
  metrics::counter& rls_unknown_;
  metrics::counter& rls_invalid_;
  metrics::counter& rls_unidentified_;
  metrics::counter& rlqs_reports_;
  metrics::counter& rlqs_token_bucket_;
  metrics::counter& rlqs_deny_;
  metrics::counter& rlqs_allow_;
  metrics::counter& rlqs_abandon_;
  metrics::gauge& rlqs_buckets_;
};

}  // namespace smockron::master
