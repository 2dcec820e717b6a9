// Golden bytes and errors of the concurrency lease messages (wire_lease.hpp).
#include "shared/protocol/wire_lease.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace smockron::wire;
using namespace std::string_literals;

namespace {
std::vector<std::string_view> views(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }
}  // namespace

TEST(WireLease, LeaseGoldenBytes) {
  scratch s;
  const lease m{"api", "key-1", 0xdeadbeefULL, 5, 4, 12};
  auto e = encode(m, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 4u);
  EXPECT_EQ(e->frame[0], "api\0"s);
  EXPECT_EQ(e->frame[1], "LEASE");
  EXPECT_EQ(e->frame[2], "key-1");
  EXPECT_EQ(e->frame[3], "00000000deadbeef 5 4 12");
  auto back = decode_lease(e->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->domain, "api");
  EXPECT_EQ(back->identifier, "key-1");
  EXPECT_EQ(back->holder, 0xdeadbeefULL);
  EXPECT_EQ(back->want, 5);
  EXPECT_EQ(back->held, 4);
  EXPECT_EQ(back->returned, 12);
  // A spec master's accounting decoder refuses it (an unknown status), never reads it as a use.
  EXPECT_EQ(decode_accounting(e->view()).error(), decode_error::frame_count);
}

TEST(WireLease, GrantAndConcurrencyGoldenBytes) {
  scratch s;
  auto g = encode(grant{"api", "key-1", ~0ULL, 4, 3, 0}, s);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->frame[1], "GRANT");
  EXPECT_EQ(g->frame[3], "ffffffffffffffff 4 3 0");
  auto gb = decode_grant(g->view());
  ASSERT_TRUE(gb);
  EXPECT_EQ(gb->holder, ~0ULL);
  EXPECT_EQ(gb->held, 4);
  EXPECT_EQ(gb->cap, 3);
  EXPECT_EQ(gb->seen, 0);
  auto c = encode(concurrency_policy{"api", "", 16}, s);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->frame[0], "api\0"s);
  EXPECT_EQ(c->frame[1], "CONCURRENCY");
  EXPECT_EQ(c->frame[2], "");
  EXPECT_EQ(c->frame[3], "16");
  auto cb = decode_concurrency(c->view());
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->limit, 16);
  EXPECT_EQ(cb->identifier, "");
  // An override without a concurrency rule: 0.
  EXPECT_EQ(decode_concurrency(encode(concurrency_policy{"api", "vip", 0}, s)->view())->limit, 0);
}

TEST(WireLease, EncodeRefusesWhatCannotBeRead) {
  scratch s;
  EXPECT_FALSE(encode(lease{"api", "", 1, 1, 0, 0}, s));  // no identifier
  EXPECT_FALSE(encode(lease{"api", "k", 1, -1, 0, 0}, s));
  EXPECT_FALSE(encode(lease{"api", "k", 1, max_concurrency + 1, 0, 0}, s));
  EXPECT_FALSE(encode(lease{"api", "k", 1, 1, 0, max_returned + 1}, s));
  EXPECT_FALSE(encode(lease{"a\0b"s, "k", 1, 1, 0, 0}, s));
  EXPECT_FALSE(encode(grant{"api", "k", 1, 2, 3, 0}, s));  // a cap over what is held
  EXPECT_FALSE(encode(concurrency_policy{"api", "", -1}, s));
  // The largest values go through.
  auto big = encode(lease{"api", "k", ~0ULL, max_concurrency, max_concurrency, max_returned}, s);
  ASSERT_TRUE(big);
  EXPECT_EQ(decode_lease(big->view())->returned, max_returned);
}

TEST(WireLease, DecodeErrors) {
  const auto lease_error = [](const std::string& numbers) {
    const std::vector<std::string> f{"api\0"s, "LEASE", "k", numbers};
    auto r = decode_lease(views(f));
    EXPECT_FALSE(r) << numbers;
    return r ? decode_error::frame_count : r.error();
  };
  for (const char* bad :
       {"", "00000000deadbeef", "00000000deadbeef 1 1", "00000000deadbeef 1 1 1 1", "00000000DEADBEEF 1 1 1",
        "deadbeef 1 1 1", "00000000deadbeef 1  1 1", "00000000deadbeef 1 1 1 ", "00000000deadbeef -1 1 1",
        "00000000deadbeef 1000001 1 1", "00000000deadbeef 1 1 1000000000000000", "00000000deadbeef x 1 1",
        "0x000000deadbeef 1 1 1"}) {
    EXPECT_EQ(lease_error(bad), decode_error::lease_invalid) << bad;
  }
  const auto grant_error = [](const std::string& numbers) {
    const std::vector<std::string> f{"api\0"s, "GRANT", "k", numbers};
    auto r = decode_grant(views(f));
    return r ? decode_error::frame_count : r.error();
  };
  EXPECT_EQ(grant_error("00000000deadbeef 2 3 0"), decode_error::lease_invalid);  // cap over held
  EXPECT_EQ(grant_error("00000000deadbeef 2 2 0"), decode_error::frame_count);    // valid: no error
  const std::vector<std::string> no_id{"api\0"s, "GRANT", "", "00000000deadbeef 2 2 0"};
  EXPECT_EQ(decode_grant(views(no_id)).error(), decode_error::identifier_empty);
  const std::vector<std::string> three{"api\0"s, "LEASE", "k"};
  EXPECT_EQ(decode_lease(views(three)).error(), decode_error::frame_count);
  const std::vector<std::string> other{"api\0"s, "POLICY", "", ""};
  EXPECT_EQ(decode_concurrency(views(other)).error(), decode_error::unknown_command);
  EXPECT_EQ(decode_lease(views(other)).error(), decode_error::unknown_status);
  const std::vector<std::string> neg{"api\0"s, "CONCURRENCY", "", "-1"};
  EXPECT_EQ(decode_concurrency(views(neg)).error(), decode_error::lease_invalid);
  const std::vector<std::string> long_frame{"api\0"s, "CONCURRENCY", "", std::string(81, '1')};
  EXPECT_EQ(decode_concurrency(views(long_frame)).error(), decode_error::frame_too_large);
}
