// The project's own declarations of Envoy's rate limit messages
// (master/envoy/proto) against the upstream encoding: each expected byte
// string below was written by hand from data-plane-api's field numbers and
// types (envoy/service/ratelimit/v3/rls.proto,
// envoy/extensions/common/ratelimit/v3/ratelimit.proto,
// envoy/service/rate_limit_quota/v3/rlqs.proto, envoy/type/v3/*.proto) and
// the protobuf wire format, not produced by our declarations: a wrong field
// number or type fails here in both directions.
#include <gtest/gtest.h>

#include <string>

#include "envoy/service/rate_limit_quota/v3/rlqs.pb.h"
#include "envoy/service/ratelimit/v3/rls.pb.h"

namespace {

namespace rls = ::envoy::service::ratelimit::v3;
namespace rlqs = ::envoy::service::rate_limit_quota::v3;

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (const int c : b) s.push_back(static_cast<char>(c));
  return s;
}

TEST(EnvoyProto, RateLimitRequest) {
  // domain "api" (1), a descriptor (2) with entry {k: v} (1) and hits_addend
  // UInt64Value 3 (3, Envoy 1.33+), hits_addend 2 (3).
  const std::string wire = bytes({0x0a, 0x03, 'a',  'p', 'i',  0x12, 0x0c, 0x0a, 0x06, 0x0a, 0x01,
                                  'k',  0x12, 0x01, 'v', 0x1a, 0x02, 0x08, 0x03, 0x18, 0x02});
  rls::RateLimitRequest req;
  ASSERT_TRUE(req.ParseFromString(wire));
  EXPECT_EQ(req.domain(), "api");
  ASSERT_EQ(req.descriptors_size(), 1);
  EXPECT_EQ(req.descriptors(0).entries(0).key(), "k");
  EXPECT_EQ(req.descriptors(0).entries(0).value(), "v");
  EXPECT_TRUE(req.descriptors(0).has_hits_addend());
  EXPECT_EQ(req.descriptors(0).hits_addend().value(), 3u);
  EXPECT_EQ(req.hits_addend(), 2u);
  EXPECT_EQ(req.SerializeAsString(), wire);
  // A descriptor's hits_addend of 0 is present (its presence, not its value, says it is set).
  rls::RateLimitRequest zero;
  ASSERT_TRUE(zero.ParseFromString(bytes({0x12, 0x0a, 0x0a, 0x06, 0x0a, 0x01, 'k', 0x12, 0x01, 'v', 0x1a, 0x00})));
  EXPECT_TRUE(zero.descriptors(0).has_hits_addend());
  EXPECT_EQ(zero.descriptors(0).hits_addend().value(), 0u);
}

TEST(EnvoyProto, RateLimitResponse) {
  // overall_code OVER_LIMIT (1); a status (2): code 2 (1), current_limit (2)
  // {requests_per_unit 100 (1), unit MINUTE (2), name "api" (3)},
  // duration_until_reset {seconds 3} (4); response_headers_to_add (3)
  // {key "Retry-After" (1), value "1" (2)}.
  const std::string wire = bytes({0x08, 0x02, 0x12, 0x11, 0x08, 0x02, 0x12, 0x09, 0x08, 0x64, 0x10, 0x02, 0x1a,
                                  0x03, 'a',  'p',  'i',  0x22, 0x02, 0x08, 0x03, 0x1a, 0x10, 0x0a, 0x0b, 'R',
                                  'e',  't',  'r',  'y',  '-',  'A',  'f',  't',  'e',  'r',  0x12, 0x01, '1'});
  rls::RateLimitResponse resp;
  resp.set_overall_code(rls::RateLimitResponse::OVER_LIMIT);
  auto* st = resp.add_statuses();
  st->set_code(rls::RateLimitResponse::OVER_LIMIT);
  st->mutable_current_limit()->set_requests_per_unit(100);
  st->mutable_current_limit()->set_unit(rls::RateLimitResponse::RateLimit::MINUTE);
  st->mutable_current_limit()->set_name("api");
  st->mutable_duration_until_reset()->set_seconds(3);
  auto* h = resp.add_response_headers_to_add();
  h->set_key("Retry-After");
  h->set_value("1");
  EXPECT_EQ(resp.SerializeAsString(), wire);
  rls::RateLimitResponse back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.statuses(0).current_limit().name(), "api");
  // WEEK is 7 (added after YEAR).
  rls::RateLimitResponse::RateLimit week;
  week.set_unit(rls::RateLimitResponse::RateLimit::WEEK);
  EXPECT_EQ(week.SerializeAsString(), bytes({0x10, 0x07}));
}

TEST(EnvoyProto, RateLimitQuotaUsageReports) {
  // domain "api" (1); a usage (2): bucket_id (1) {bucket map (1) {k: v}},
  // time_elapsed {seconds 1} (2), num_requests_allowed 5 (3), num_requests_denied 1 (4).
  const std::string wire = bytes({0x0a, 0x03, 'a',  'p', 'i',  0x12, 0x12, 0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01,
                                  'k',  0x12, 0x01, 'v', 0x12, 0x02, 0x08, 0x01, 0x18, 0x05, 0x20, 0x01});
  rlqs::RateLimitQuotaUsageReports r;
  ASSERT_TRUE(r.ParseFromString(wire));
  EXPECT_EQ(r.domain(), "api");
  const auto& u = r.bucket_quota_usages(0);
  EXPECT_EQ(u.bucket_id().bucket().at("k"), "v");
  EXPECT_EQ(u.time_elapsed().seconds(), 1);
  EXPECT_EQ(u.num_requests_allowed(), 5u);
  EXPECT_EQ(u.num_requests_denied(), 1u);
  EXPECT_EQ(r.SerializeAsString(), wire);
}

TEST(EnvoyProto, RateLimitQuotaResponse) {
  // bucket_action (1): bucket_id (1) {k: v}; quota_assignment_action (2):
  // assignment_time_to_live {seconds 2} (2), rate_limit_strategy (3) with
  // token_bucket (3) {max_tokens 10 (1), tokens_per_fill UInt32Value 1 (2),
  // fill_interval {seconds 1} (3)}.
  const std::string wire =
      bytes({0x0a, 0x1e, 0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01, 'k',  0x12, 0x01, 'v',  0x12, 0x12, 0x12, 0x02,
             0x08, 0x02, 0x1a, 0x0c, 0x1a, 0x0a, 0x08, 0x0a, 0x12, 0x02, 0x08, 0x01, 0x1a, 0x02, 0x08, 0x01});
  rlqs::RateLimitQuotaResponse resp;
  auto* a = resp.add_bucket_action();
  (*a->mutable_bucket_id()->mutable_bucket())["k"] = "v";
  auto* qa = a->mutable_quota_assignment_action();
  qa->mutable_assignment_time_to_live()->set_seconds(2);
  auto* tb = qa->mutable_rate_limit_strategy()->mutable_token_bucket();
  tb->set_max_tokens(10);
  tb->mutable_tokens_per_fill()->set_value(1);
  tb->mutable_fill_interval()->set_seconds(1);
  EXPECT_EQ(resp.SerializeAsString(), wire);
  // DENY_ALL is blanket_rule (1) = 1; abandon_action is field 3.
  ::envoy::type::v3::RateLimitStrategy deny;
  deny.set_blanket_rule(::envoy::type::v3::RateLimitStrategy::DENY_ALL);
  EXPECT_EQ(deny.SerializeAsString(), bytes({0x08, 0x01}));
  rlqs::RateLimitQuotaResponse::BucketAction abandon;
  abandon.mutable_abandon_action();
  EXPECT_EQ(abandon.SerializeAsString(), bytes({0x1a, 0x00}));
}

}  // namespace
