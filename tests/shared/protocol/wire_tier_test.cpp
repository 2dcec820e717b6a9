// Golden bytes and errors of the tier additions: "tier=NAME" in an
// accounting message's loginfo, LEASE's tier frame, and TIER (wire_tier.hpp).
#include "shared/protocol/wire_tier.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shared/protocol/wire_lease.hpp"

using namespace smockron::wire;
using namespace std::string_literals;

namespace {
std::vector<std::string_view> views(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

// The loginfo frame an accounting message is sent with ("" when there is none).
std::string loginfo_of(const accounting& m) {
  scratch s;
  auto e = encode(m, s);
  EXPECT_TRUE(e);
  if (!e) return "<refused>";
  return e->count == 6 ? std::string(e->frame[5]) : std::string();
}

// The message decoded from frames kept until the next call (the views point into them).
accounting decoded(const std::string& loginfo, std::string_view state = "ACCEPTED") {
  static std::vector<std::string> f;
  f = std::vector<std::string>{
      "api\0"s, std::string(state), "key", "1700000000000", state == "DELAYED" ? "1700000000500" : "", loginfo};
  auto m = decode_accounting(views(f));
  EXPECT_TRUE(m) << loginfo;
  return m ? m.value() : accounting{};
}
}  // namespace

TEST(WireTier, TierNames) {
  EXPECT_TRUE(valid_tier_name("pro"));
  EXPECT_TRUE(valid_tier_name("Gold-2026.v1_a"));
  EXPECT_TRUE(valid_tier_name(std::string(max_tier_bytes, 'x')));
  EXPECT_FALSE(valid_tier_name(""));
  EXPECT_FALSE(valid_tier_name(std::string(max_tier_bytes + 1, 'x')));
  for (const std::string& bad : {"a b"s, "a/b"s, "a=b"s, "é"s, "a\0b"s, "a,b"s})
    EXPECT_FALSE(valid_tier_name(bad)) << bad;
}

TEST(WireTier, AccountingCarriesTheTierAfterTheCost) {
  accounting m{"api", status::accepted, "key", 1'700'000'000'000, 0, {}};
  m.tier = "pro";
  EXPECT_EQ(loginfo_of(m), "tier=pro");  // cost 1: no cost prefix
  m.cost = 5;
  EXPECT_EQ(loginfo_of(m), "cost=5 tier=pro");
  m.reserve = true;
  m.loginfo = "GET /v1";
  EXPECT_EQ(loginfo_of(m), "reserve=5 tier=pro GET /v1");
  auto back = decoded("reserve=5 tier=pro GET /v1");
  EXPECT_EQ(back.cost, 5);
  EXPECT_TRUE(back.reserve);
  EXPECT_EQ(back.tier, "pro");
  EXPECT_EQ(back.loginfo, "GET /v1");
  back = decoded("tier=pro", "DELAYED");
  EXPECT_EQ(back.cost, 1);
  EXPECT_EQ(back.tier, "pro");
  EXPECT_EQ(back.loginfo, "");
}

TEST(WireTier, AFreeTextThatReadsAsATierIsSentBehindAnEmptyOne) {
  accounting m{"api", status::accepted, "key", 1'700'000'000'000, 0, {}};
  m.loginfo = "tier=gold is what the client claims";
  EXPECT_EQ(loginfo_of(m), "tier= tier=gold is what the client claims");
  const auto back = decoded("tier= tier=gold is what the client claims");
  EXPECT_EQ(back.tier, "");
  EXPECT_EQ(back.loginfo, "tier=gold is what the client claims");
  // Plain text stays the spec's bytes.
  m.loginfo = "GET /";
  EXPECT_EQ(loginfo_of(m), "GET /");
}

TEST(WireTier, RejectedMessagesCarryNoTier) {
  accounting m{"api", status::rejected, "key", 1'700'000'000'000, 0, {}};
  m.tier = "pro";
  scratch s;
  EXPECT_FALSE(encode(m, s));
  // A REJECTED message's loginfo that says "tier=" is only text.
  const auto back = decoded("tier=pro", "REJECTED");
  EXPECT_EQ(back.tier, "");
  EXPECT_EQ(back.loginfo, "tier=pro");
}

TEST(WireTier, MalformedTiersAreRefused) {
  for (const std::string& bad :
       std::vector<std::string>{"tier=a/b", "cost=3 tier=" + std::string(max_tier_bytes + 1, 'x'), "tier=é x"}) {
    const std::vector<std::string> f{"api\0"s, "ACCEPTED", "key", "1700000000000", "", bad};
    EXPECT_EQ(decode_accounting(views(f)).error(), decode_error::tier_invalid) << bad;
  }
  accounting m{"api", status::accepted, "key", 1'700'000'000'000, 0, {}};
  m.tier = "a b";
  scratch s;
  EXPECT_FALSE(encode(m, s));
}

TEST(WireTier, LeaseNamesItsTierInAFifthFrame) {
  scratch s;
  lease m{"api", "key-1", 0xdeadbeefULL, 2, 0, 0};
  m.tier = "pro";
  auto e = encode(m, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 5u);
  EXPECT_EQ(e->frame[3], "00000000deadbeef 2 0 0");
  EXPECT_EQ(e->frame[4], "pro");
  auto back = decode_lease(e->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->tier, "pro");
  EXPECT_EQ(back->want, 2);
  const std::vector<std::string> bad{"api\0"s, "LEASE", "key-1", "00000000deadbeef 2 0 0", "a b"};
  EXPECT_EQ(decode_lease(views(bad)).error(), decode_error::tier_invalid);
  const std::vector<std::string> six{"api\0"s, "LEASE", "key-1", "00000000deadbeef 2 0 0", "pro", "x"};
  EXPECT_EQ(decode_lease(views(six)).error(), decode_error::frame_count);
}

TEST(WireTier, TierGoldenBytes) {
  scratch s;
  tier_policy m{"api", "pro"};
  m.rules[0] = {100'000, 20};
  m.rules[1] = {3'600'000, 1000};
  m.count = 2;
  m.concurrency = 8;
  auto e = encode(m, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 5u);
  EXPECT_EQ(e->frame[0], "api\0"s);
  EXPECT_EQ(e->frame[1], "TIER");
  EXPECT_EQ(e->frame[2], "pro");
  EXPECT_EQ(e->frame[3], "100000/20 3600000/1000");
  EXPECT_EQ(e->frame[4], "8");
  auto back = decode_tier(e->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->domain, "api");
  EXPECT_EQ(back->name, "pro");
  ASSERT_EQ(back->count, 2u);
  EXPECT_EQ(back->rules[1].interval_us, 3'600'000);
  EXPECT_EQ(back->rules[1].burst, 1000);
  EXPECT_EQ(back->concurrency, 8);
  // A tier with no rules and no concurrency limit: unlimited.
  auto none = encode(tier_policy{"api", "free"}, s);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->frame[3], "");
  EXPECT_EQ(none->frame[4], "0");
}

TEST(WireTier, MalformedTierMessages) {
  const auto error = [](std::vector<std::string> f) { return decode_tier(views(f)).error(); };
  EXPECT_EQ(error({"api\0"s, "TIER", "pro", "100/2"}), decode_error::frame_count);
  EXPECT_EQ(error({"api\0"s, "TIER", "", "100/2", "0"}), decode_error::tier_invalid);
  EXPECT_EQ(error({"api\0"s, "TIER", "a b", "100/2", "0"}), decode_error::tier_invalid);
  EXPECT_EQ(error({"api\0"s, "TIER", std::string(65, 'x'), "", "0"}), decode_error::frame_too_large);
  EXPECT_EQ(error({"api\0"s, "TIER", "pro", "100", "0"}), decode_error::policy_invalid);
  EXPECT_EQ(error({"api\0"s, "TIER", "pro", "100/2", "x"}), decode_error::lease_invalid);
  EXPECT_EQ(error({"api\0"s, "TIER", "pro", "100/2", "1000001"}), decode_error::lease_invalid);
  EXPECT_EQ(error({"api\0"s, "POLICY", "pro", "100/2", "0"}), decode_error::unknown_command);
  EXPECT_EQ(error({"api"s, "TIER", "pro", "100/2", "0"}), decode_error::domain_not_terminated);
  scratch s;
  EXPECT_FALSE(encode(tier_policy{"api", "a b"}, s));
  tier_policy over{"api", "pro"};
  over.concurrency = max_concurrency + 1;
  EXPECT_FALSE(encode(over, s));
}
