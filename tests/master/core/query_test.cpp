// The UDP query protocol: the peer spec's examples, request IDs, what is
// ignored, and the response formats byte for byte.
#include "master/core/query.hpp"

#include <gtest/gtest.h>

using namespace smockron::query;

TEST(Query, TheSpecsExamples) {
  auto r = parse("1173 over_limit ws global");
  ASSERT_TRUE(r.req);
  EXPECT_EQ(r.req->id, 1173u);
  EXPECT_EQ(r.req->cmd, command::over_limit);
  EXPECT_EQ(r.req->domain, "ws");
  EXPECT_EQ(r.req->identifier, "global");
  r = parse("472 over_limit ws ip=74.11.99.155");
  ASSERT_TRUE(r.req);
  EXPECT_EQ(r.req->domain, "ws");
  EXPECT_EQ(r.req->identifier, "ip=74.11.99.155");
  EXPECT_EQ(format(472, over_limit_answer{false, 1.4, 22.0, 20}), "472 ok N 1.4 22.0 20");
  EXPECT_EQ(format(1332, over_limit_answer{true, 28.1, 22.0, 20}), "1332 ok Y 28.1 22.0 20");
  EXPECT_EQ(format(std::nullopt, over_limit_answer{false, 2034.25, 2500, 10}), "ok N 2034.2 2500.0 10");
}

TEST(Query, RequestIdsAreOptionalAndEchoed) {
  auto r = parse("get_stats ws some-key\n");
  ASSERT_TRUE(r.req);
  EXPECT_FALSE(r.req->id);
  EXPECT_EQ(format(r.req->id, stats_answer{2, 1, 1}, r.req->domain, r.req->identifier),
            "n_req=2 n_over=1 last_max_rate=1 key=ws some-key");
  r = parse("78229 get_stats ws some-key\r\n");
  ASSERT_TRUE(r.req);
  EXPECT_EQ(format(r.req->id, stats_answer{2, 1, 1}, r.req->domain, r.req->identifier),
            "78229 n_req=2 n_over=1 last_max_rate=1 key=ws some-key");
  r = parse("0 get_size");
  ASSERT_TRUE(r.req);
  EXPECT_EQ(r.req->id, 0u);
  EXPECT_EQ(r.req->cmd, command::get_size);
  EXPECT_EQ(format_size(r.req->id, 1234, 5), "0 size=1234 keys=5");
  EXPECT_EQ(format_size(std::nullopt, 0, 0), "size=0 keys=0");
  // The largest ID, and an identifier with spaces (the rest of the line).
  r = parse("18446744073709551615 over_limit api user name with spaces");
  ASSERT_TRUE(r.req);
  EXPECT_EQ(r.req->id, 18446744073709551615u);
  EXPECT_EQ(r.req->identifier, "user name with spaces");
}

TEST(Query, WhatIsIgnored) {
  const auto why = [](std::string_view d) {
    const auto r = parse(d);
    EXPECT_FALSE(r.req) << d;
    return r.why;
  };
  EXPECT_EQ(why("frobnicate ws x"), ignored::unknown_command);
  EXPECT_EQ(why("12 OVER_LIMIT ws x"), ignored::unknown_command);
  EXPECT_EQ(why(""), ignored::malformed);
  EXPECT_EQ(why("12"), ignored::malformed);
  EXPECT_EQ(why("12 "), ignored::malformed);
  EXPECT_EQ(why("over_limit"), ignored::malformed);
  EXPECT_EQ(why("over_limit ws"), ignored::malformed);
  EXPECT_EQ(why("over_limit ws "), ignored::malformed);
  EXPECT_EQ(why("over_limit  x"), ignored::malformed);  // empty domain
  EXPECT_EQ(why("get_size now"), ignored::malformed);
  EXPECT_EQ(why("over_limit ws a\nb"), ignored::malformed);
  EXPECT_EQ(why(std::string("over_limit ws a\0b", 17)), ignored::malformed);
  EXPECT_EQ(why("99999999999999999999 get_size"), ignored::malformed);  // 20 digits
  EXPECT_EQ(why("over_limit " + std::string(256, 'd') + " x"), ignored::malformed);
  EXPECT_EQ(why("over_limit ws " + std::string(1025, 'i')), ignored::malformed);
  EXPECT_EQ(why(std::string(max_datagram + 1, 'x')), ignored::too_large);
  EXPECT_EQ(to_string(ignored::unknown_command), "unknown_command");
}

TEST(Query, ResponsesSplitIntoIdAndBody) {
  auto r = split_response("472 ok N 1.4 22.0 20");
  EXPECT_EQ(r.id, 472u);
  EXPECT_EQ(r.body, "ok N 1.4 22.0 20");
  r = split_response("ok Y 1.0 1.0 1\n");
  EXPECT_FALSE(r.id);
  EXPECT_EQ(r.body, "ok Y 1.0 1.0 1");
}
