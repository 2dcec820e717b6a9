// Golden bytes and errors of LIMIT (wire_limit.hpp): which limit set a
// DELAY_UNTIL.
#include "shared/protocol/wire_limit.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace smockron::wire;
using namespace std::string_literals;

namespace {
std::vector<std::string_view> views(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

std::vector<std::string> frames_of(const encoded& e) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < e.count; ++i) out.emplace_back(e.frame[i]);
  return out;
}

delay_until throttled(limit_ref limit) {
  delay_until d{"api", "key", 1'700'000'000'250, 100, {}};
  d.limit = limit;
  return d;
}

limit_notice decoded(const std::string& which) {
  static std::vector<std::string> f;
  f = {"api\0"s, "LIMIT", "key", "1700000000250", which};
  const auto m = decode_limit(views(f));
  EXPECT_TRUE(m) << which;
  return m ? m.value() : limit_notice{};
}

decode_error error_of(const std::vector<std::string>& f) {
  const auto m = decode_limit(views(f));
  EXPECT_FALSE(m);
  return m ? decode_error::frame_count : m.error();
}
}  // namespace

TEST(WireLimit, GoldenBytes) {
  scratch s;
  using kind = limit_ref::kind;
  auto e = encode_limit(throttled({kind::rule, 1, 0, 0}), s);
  ASSERT_TRUE(e);
  EXPECT_EQ(frames_of(*e), (std::vector<std::string>{"api\0"s, "LIMIT", "key", "1700000000250", "rule:1"}));
  e = encode_limit(throttled({kind::quota, 0, 0, 0}), s);
  ASSERT_TRUE(e);
  EXPECT_EQ(frames_of(*e), (std::vector<std::string>{"api\0"s, "LIMIT", "key", "1700000000250", "quota:0"}));
  e = encode_limit(throttled({kind::share, 0, 250'000, 12}), s);
  ASSERT_TRUE(e);
  EXPECT_EQ(frames_of(*e), (std::vector<std::string>{"api\0"s, "LIMIT", "key", "1700000000250", "share:250000/12"}));
}

TEST(WireLimit, RoundTrips) {
  using kind = limit_ref::kind;
  const auto rule = decoded("rule:3");
  EXPECT_EQ(rule.domain, "api");
  EXPECT_EQ(rule.identifier, "key");
  EXPECT_EQ(rule.next_ms, 1'700'000'000'250);
  EXPECT_EQ(rule.limit.by, kind::rule);
  EXPECT_EQ(rule.limit.index, 3);
  const auto quota = decoded("quota:2");
  EXPECT_EQ(quota.limit.by, kind::quota);
  EXPECT_EQ(quota.limit.index, 2);
  const auto share = decoded("share:16667/1000000");
  EXPECT_EQ(share.limit.by, kind::share);
  EXPECT_EQ(share.limit.share_interval_us, 16'667);
  EXPECT_EQ(share.limit.share_burst, 1'000'000);
}

TEST(WireLimit, NothingToSayIsNotEncoded) {
  scratch s;
  using kind = limit_ref::kind;
  EXPECT_FALSE(encode_limit(throttled({}), s)) << "kind none";
  EXPECT_FALSE(encode_limit(throttled({kind::rule, max_policy_rules, 0, 0}), s));
  EXPECT_FALSE(encode_limit(throttled({kind::quota, max_quota_items, 0, 0}), s));
  EXPECT_FALSE(encode_limit(throttled({kind::share, 0, 0, 12}), s)) << "POLICY's bounds";
  EXPECT_FALSE(encode_limit(throttled({kind::share, 0, 1000, max_policy_burst + 1}), s));
  auto d = throttled({kind::rule, 0, 0, 0});
  d.identifier = "";
  EXPECT_FALSE(encode_limit(d, s));
}

TEST(WireLimit, MalformedIsRefused) {
  const auto with = [](std::string which) {
    return std::vector<std::string>{"api\0"s, "LIMIT", "key", "1700000000250", std::move(which)};
  };
  for (const std::string& bad :
       {""s, "rule:"s, "rule:4"s, "rule:01"s, "rule:-1"s, "rule:1 "s, "quota:4"s, "quota:x"s, "share:"s, "share:0/1"s,
        "share:100/0"s, "share:100/1 200/2"s, "share:1/1000001"s, "fair:1"s, "RULE:1"s, "rule:100"s})
    EXPECT_EQ(error_of(with(bad)), decode_error::limit_invalid) << bad;
  EXPECT_EQ(error_of({"api\0"s, "LIMIT", "key", "1700000000250"}), decode_error::frame_count);
  EXPECT_EQ(error_of({"api\0"s, "LIMIT", "", "1700000000250", "rule:0"}), decode_error::identifier_empty);
  EXPECT_EQ(error_of({"api\0"s, "LIMIT", "key", "x", "rule:0"}), decode_error::timestamp_not_numeric);
  EXPECT_EQ(error_of({"api"s, "LIMIT", "key", "1", "rule:0"}), decode_error::domain_not_terminated);
  EXPECT_EQ(error_of({"api\0"s, "DELAY_UNTIL", "key", "1"}), decode_error::unknown_command);
  EXPECT_EQ(to_string(decode_error::limit_invalid), "limit_invalid");
}
