// The rules of a name that stands for masters, without DNS: a good answer
// replaces the list and is used for its TTL within the bounds; a failed or
// empty one keeps the list and is asked again soon.
#include <gtest/gtest.h>

#include <chrono>

#include "proxy/cluster/master_discovery.hpp"

using namespace smockron;
using namespace std::chrono_literals;
using proxy::discovered_name;
using proxy::lookup_result;

namespace {
discovered_name name(std::size_t max_masters = 64) {
  return discovered_name("srv+tcp://_acc._tcp.masters", *parse_dns_endpoint("srv+tcp://_acc._tcp.masters"),
                         {.min_ttl = 1s, .max_ttl = 60s, .max_masters = max_masters});
}
lookup_result good(std::vector<std::string> endpoints, std::chrono::seconds ttl) {
  return {.ok = true, .endpoints = std::move(endpoints), .ttl = ttl, .error = {}};
}
}  // namespace

TEST(DiscoveredName, AGoodAnswerIsUsedForItsTtlWithinTheBounds) {
  auto n = name();
  const auto t0 = std::chrono::steady_clock::time_point{} + 1000s;
  EXPECT_TRUE(n.answered(good({"tcp://10.0.0.2:1", "tcp://10.0.0.1:1", "tcp://10.0.0.2:1"}, 30s), t0));
  EXPECT_EQ(n.masters(), (std::vector<std::string>{"tcp://10.0.0.1:1", "tcp://10.0.0.2:1"})) << "sorted, once each";
  EXPECT_EQ(n.due(), t0 + 30s);
  EXPECT_FALSE(n.answered(good({"tcp://10.0.0.1:1", "tcp://10.0.0.2:1"}, 0s), t0)) << "the same masters";
  EXPECT_EQ(n.due(), t0 + 1s) << "a TTL of 0 is asked again after dns_min_ttl";
  EXPECT_FALSE(n.answered(good({"tcp://10.0.0.2:1", "tcp://10.0.0.1:1"}, 86400s), t0));
  EXPECT_EQ(n.due(), t0 + 60s) << "a day's TTL is used for dns_max_ttl";
  EXPECT_TRUE(n.answered(good({"tcp://10.0.0.3:1"}, 5s), t0)) << "masters gone and added";
  EXPECT_EQ(n.masters(), (std::vector<std::string>{"tcp://10.0.0.3:1"}));
}

TEST(DiscoveredName, AFailedOrEmptyAnswerKeepsTheLastGoodList) {
  auto n = name();
  const auto t0 = std::chrono::steady_clock::time_point{} + 1000s;
  EXPECT_FALSE(n.answered({.ok = false, .endpoints = {}, .ttl = 0s, .error = "timeout"}, t0));
  EXPECT_TRUE(n.masters().empty()) << "nothing known yet";
  EXPECT_EQ(n.due(), t0 + 1s);
  ASSERT_TRUE(n.answered(good({"tcp://10.0.0.1:1"}, 30s), t0));
  EXPECT_FALSE(n.answered({.ok = false, .endpoints = {}, .ttl = 0s, .error = "server failure"}, t0 + 30s));
  EXPECT_FALSE(n.answered(good({}, 30s), t0 + 31s)) << "an empty answer (the name gone, or no records)";
  EXPECT_EQ(n.masters(), std::vector<std::string>{"tcp://10.0.0.1:1"});
  EXPECT_EQ(n.due(), t0 + 32s) << "asked again after dns_min_ttl, not the empty answer's TTL";
}

TEST(DiscoveredName, AtMostMaxMastersAreUsed) {
  auto n = name(2);
  const auto t0 = std::chrono::steady_clock::time_point{} + 1000s;
  EXPECT_TRUE(n.answered(good({"tcp://10.0.0.3:1", "tcp://10.0.0.1:1", "tcp://10.0.0.2:1"}, 30s), t0));
  EXPECT_EQ(n.masters(), (std::vector<std::string>{"tcp://10.0.0.1:1", "tcp://10.0.0.2:1"}))
      << "the first in order: every proxy picks the same ones";
  EXPECT_EQ(n.truncated(), 1u);
}
