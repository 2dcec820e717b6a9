// Golden bytes and errors of the exact admission messages (wire_lease.hpp: ASK, ANSWER, EXACT).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shared/protocol/wire_lease.hpp"

using namespace smockron::wire;
using namespace std::string_literals;

namespace {
std::vector<std::string_view> views(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }
}  // namespace

TEST(WireAsk, AskGoldenBytes) {
  scratch s;
  auto e = encode(ask{"api", "key-1", 0xdeadbeefULL, 7, 1200, 1'700'000'002'000, "pro"}, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 5u);
  EXPECT_EQ(e->frame[0], "api\0"s);
  EXPECT_EQ(e->frame[1], "ASK");
  EXPECT_EQ(e->frame[2], "key-1");
  EXPECT_EQ(e->frame[3], "00000000deadbeef 7 1200 1700000002000");
  EXPECT_EQ(e->frame[4], "pro");
  auto back = decode_ask(e->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->domain, "api");
  EXPECT_EQ(back->identifier, "key-1");
  EXPECT_EQ(back->holder, 0xdeadbeefULL);
  EXPECT_EQ(back->seq, 7);
  EXPECT_EQ(back->cost, 1200);
  EXPECT_EQ(back->latest_ms, 1'700'000'002'000);
  EXPECT_EQ(back->tier, "pro");
  // Without a tier: four frames. A spec master's decoder never reads it as a use.
  auto plain = encode(ask{"api", "k", 1, 0, 0, 0}, s);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->count, 4u);
  EXPECT_EQ(plain->frame[3], "0000000000000001 0 0 0");
  EXPECT_FALSE(decode_accounting(plain->view()));
}

TEST(WireAsk, AnswerAndExactGoldenBytes) {
  scratch s;
  auto go = encode(answer{"api", "key-1", ~0ULL, 7, verdict_kind::go, 0}, s);
  ASSERT_TRUE(go);
  EXPECT_EQ(go->frame[1], "ANSWER");
  EXPECT_EQ(go->frame[3], "ffffffffffffffff 7 0 0");
  // A GO for later names its time.
  auto later = encode(answer{"api", "key-1", 1, 8, verdict_kind::go, 1'700'000'000'050}, s);
  ASSERT_TRUE(later);
  EXPECT_EQ(later->frame[3], "0000000000000001 8 0 1700000000050");
  EXPECT_EQ(decode_answer(later->view())->at_ms, 1'700'000'000'050);
  auto wait = encode(answer{"api", "key-1", 2, 8, verdict_kind::wait, 1'700'000'000'123}, s);
  ASSERT_TRUE(wait);
  EXPECT_EQ(wait->frame[3], "0000000000000002 8 1 1700000000123");
  auto wb = decode_answer(wait->view());
  ASSERT_TRUE(wb);
  EXPECT_EQ(wb->holder, 2u);
  EXPECT_EQ(wb->seq, 8);
  EXPECT_EQ(wb->verdict, verdict_kind::wait);
  EXPECT_EQ(wb->at_ms, 1'700'000'000'123);
  auto never = encode(answer{"api", "key-1", 2, 9, verdict_kind::never, 0}, s);
  ASSERT_TRUE(never);
  EXPECT_EQ(never->frame[3], "0000000000000002 9 2 0");
  EXPECT_EQ(decode_answer(never->view())->verdict, verdict_kind::never);
  auto x = encode(exact_policy{"api"}, s);
  ASSERT_TRUE(x);
  ASSERT_EQ(x->count, 2u);
  EXPECT_EQ(x->frame[0], "api\0"s);
  EXPECT_EQ(x->frame[1], "EXACT");
  EXPECT_EQ(decode_exact(x->view())->domain, "api");
}

TEST(WireAsk, OutOfBoundsIsNotEncoded) {
  scratch s;
  EXPECT_FALSE(encode(ask{"api", "", 1, 0, 1, 0}, s));
  EXPECT_FALSE(encode(ask{"api", "k", 1, -1, 1, 0}, s));
  EXPECT_FALSE(encode(ask{"api", "k", 1, 0, max_cost + 1, 0}, s));
  EXPECT_FALSE(encode(ask{"api", "k", 1, max_sequence + 1, 1, 0}, s));
  EXPECT_FALSE(encode(ask{"api", "k", 1, 0, 1, -1}, s));
  EXPECT_FALSE(encode(ask{"api", "k", 1, 0, 1, max_timestamp_ms + 1}, s));
  EXPECT_FALSE(encode(ask{"api", "k", 1, 0, 1, 0, "no tier"}, s));
  EXPECT_FALSE(encode(answer{"api", "k", 1, 0, verdict_kind::wait, 0}, s));
  EXPECT_FALSE(encode(answer{"api", "k", 1, 0, verdict_kind::never, 5}, s));
  EXPECT_FALSE(encode(answer{"api", "k", 1, 0, static_cast<verdict_kind>(3), 0}, s));
  EXPECT_FALSE(encode(exact_policy{"a\0b"s}, s));
  EXPECT_TRUE(encode(ask{"api", "k", 1, max_sequence, max_cost, max_timestamp_ms}, s));
}

TEST(WireAsk, MalformedIsRefused) {
  const auto ask_error = [](std::vector<std::string> f) { return decode_ask(views(f)).error(); };
  const auto answer_error = [](std::vector<std::string> f) { return decode_answer(views(f)).error(); };
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "k", "00000000000000 1 2 0"}), decode_error::ask_invalid);  // short holder
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "k", "0000000000000001 1 2"}), decode_error::ask_invalid);
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "k", "0000000000000001 1 2 3 4"}), decode_error::ask_invalid);
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "k", "0000000000000001 1 1000000000001 0"}), decode_error::ask_invalid);
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "k", "0000000000000001 -1 2 0"}), decode_error::ask_invalid);
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "k", "0000000000000001 1 2 253402300800000"}), decode_error::ask_invalid);
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "", "0000000000000001 1 2 0"}), decode_error::identifier_empty);
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "k", "0000000000000001 1 2 0", "bad tier"}), decode_error::tier_invalid);
  EXPECT_EQ(ask_error({"api\0"s, "ASKS", "k", "0000000000000001 1 2 0"}), decode_error::unknown_status);
  EXPECT_EQ(ask_error({"api\0"s, "ASK", "k"}), decode_error::frame_count);
  EXPECT_EQ(answer_error({"api\0"s, "ANSWER", "k", "0000000000000001 1 2 5"}), decode_error::ask_invalid);
  EXPECT_EQ(answer_error({"api\0"s, "ANSWER", "k", "0000000000000001 1 1 0"}), decode_error::ask_invalid);
  EXPECT_EQ(answer_error({"api\0"s, "ANSWER", "k", "0000000000000001 1 3 0"}), decode_error::ask_invalid);
  EXPECT_EQ(answer_error({"api\0"s, "ANSWER", "k", "0000000000000001 1 1 253402300800000"}), decode_error::ask_invalid);
  EXPECT_EQ(answer_error({"api\0"s, "ANSWER", "k", "0000000000000001 1 0 0", "x"}), decode_error::frame_count);
  EXPECT_EQ(decode_exact(views({"api\0"s, "EXACT", ""})).error(), decode_error::frame_count);
  EXPECT_EQ(decode_exact(views({"api"s, "EXACT"})).error(), decode_error::domain_not_terminated);
  EXPECT_EQ(to_string(decode_error::ask_invalid), "ask_invalid");
}

// The use that settles a GO names its ASK in the loginfo: after the cost, before the tier.
TEST(WireAsk, AccountingNamesTheAskItSettles) {
  scratch s;
  accounting m;
  m.domain = "api";
  m.identifier = "k";
  m.received_ms = 1'700'000'000'000;
  m.cost = 40;
  m.reserve = true;
  m.ask = 7;
  m.tier = "pro";
  m.loginfo = "note";
  auto e = encode(m, s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->frame[5], "reserve=40 ask=7 tier=pro note");
  auto back = decode_accounting(e->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->ask, 7);
  EXPECT_EQ(back->cost, 40);
  EXPECT_TRUE(back->reserve);
  EXPECT_EQ(back->tier, "pro");
  EXPECT_EQ(back->loginfo, "note");
  // A use of no units settling one; a free text that would read as an ask goes behind "tier= ".
  accounting zero = m;
  zero.cost = 0;
  zero.reserve = false;
  zero.tier = {};
  zero.loginfo = {};
  EXPECT_EQ(encode(zero, s)->frame[5], "cost=0 ask=7");
  accounting text;
  text.domain = "api";
  text.identifier = "k";
  text.loginfo = "ask=9";
  auto t = encode(text, s);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->frame[5], "tier= ask=9");
  auto tb = decode_accounting(t->view());
  ASSERT_TRUE(tb);
  EXPECT_EQ(tb->ask, -1);
  EXPECT_EQ(tb->loginfo, "ask=9");
  // Not on a refusal; not past max_cost; malformed is refused.
  accounting refused = zero;
  refused.state = status::rejected;
  EXPECT_FALSE(encode(refused, s));
  zero.ask = max_cost + 1;
  EXPECT_FALSE(encode(zero, s));
  const std::vector<std::string> bad{"api\0"s, "ACCEPTED", "k", "1", "", "cost=1 ask=x"};
  EXPECT_EQ(decode_accounting(views(bad)).error(), decode_error::ask_invalid);
}
