// Wire codec: golden bytes for both message kinds and every decode error.
#include "shared/protocol/wire.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace smockron::wire;
using namespace std::string_literals;

namespace {
std::vector<std::string_view> views(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

decode_error accounting_error(const std::vector<std::string>& frames) {
  auto v = views(frames);
  auto r = decode_accounting(v);
  EXPECT_FALSE(r);
  return r.error();
}
}  // namespace

TEST(Wire, EncodesAcceptedGoldenBytes) {
  scratch s;
  auto e = encode(accounting{"api", status::accepted, "1.2.3.4", 1700000000123, 0, {}}, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 5u);
  EXPECT_EQ(e->frame[0], "api\0"s);
  EXPECT_EQ(e->frame[1], "ACCEPTED");
  EXPECT_EQ(e->frame[2], "1.2.3.4");
  EXPECT_EQ(e->frame[3], "1700000000123");
  EXPECT_EQ(e->frame[4], "");
}

TEST(Wire, EncodesDelayedWithLoginfo) {
  scratch s;
  auto e = encode(accounting{"api", status::delayed, "k", 1000, 1250, "curl/8"}, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 6u);
  EXPECT_EQ(e->frame[1], "DELAYED");
  EXPECT_EQ(e->frame[3], "1000");
  EXPECT_EQ(e->frame[4], "1250");
  EXPECT_EQ(e->frame[5], "curl/8");
}

TEST(Wire, RejectedHasEmptyDelayedFrame) {
  scratch s;
  auto e = encode(accounting{"api", status::rejected, "k", 5, 99, {}}, s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->frame[1], "REJECTED");
  EXPECT_EQ(e->frame[4], "");
}

TEST(Wire, EncodesDelayUntilGoldenBytes) {
  scratch s;
  auto e = encode(delay_until{"api", "user-7", 1700000000500, 0}, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 4u);
  EXPECT_EQ(e->frame[0], "api\0"s);
  EXPECT_EQ(e->frame[1], "DELAY_UNTIL");
  EXPECT_EQ(e->frame[2], "user-7");
  EXPECT_EQ(e->frame[3], "1700000000500");
  auto with_interval = encode(delay_until{"api", "user-7", 10, 100}, s);
  ASSERT_TRUE(with_interval);
  ASSERT_EQ(with_interval->count, 5u);
  EXPECT_EQ(with_interval->frame[4], "100");
}

TEST(Wire, EncodeRefusesWhatCannotBeDecoded) {
  scratch s;
  EXPECT_FALSE(encode(accounting{"", status::accepted, "k", 1, 0, {}}, s));
  EXPECT_FALSE(encode(accounting{std::string_view("a\0b", 3), status::accepted, "k", 1, 0, {}}, s));
  EXPECT_FALSE(encode(accounting{"api", status::accepted, "", 1, 0, {}}, s));
  EXPECT_FALSE(encode(accounting{"api", status::accepted, std::string(max_identifier_bytes + 1, 'x'), 1, 0, {}}, s));
  EXPECT_FALSE(encode(accounting{std::string(max_domain_bytes + 1, 'd'), status::accepted, "k", 1, 0, {}}, s));
  EXPECT_FALSE(encode(accounting{"api", status::accepted, "k", -1, 0, {}}, s));
  EXPECT_FALSE(encode(accounting{"api", status::delayed, "k", 1, max_timestamp_ms + 1, {}}, s));
  EXPECT_FALSE(encode(delay_until{"api", "k", -5, 0}, s));
}

TEST(Wire, RoundTripsAccounting) {
  scratch s;
  const accounting in{"api", status::delayed, "id", 1700000000000, 1700000000100, "ua"};
  auto e = encode(in, s);
  ASSERT_TRUE(e);
  auto out = decode_accounting(e->view());
  ASSERT_TRUE(out);
  EXPECT_EQ(out->domain, "api");
  EXPECT_EQ(out->state, status::delayed);
  EXPECT_EQ(out->identifier, "id");
  EXPECT_EQ(out->received_ms, in.received_ms);
  EXPECT_EQ(out->delayed_ms, in.delayed_ms);
  EXPECT_EQ(out->loginfo, "ua");
}

TEST(Wire, RoundTripsDelayUntil) {
  scratch s;
  auto e = encode(delay_until{"d", "id", 123456, 40}, s);
  ASSERT_TRUE(e);
  auto out = decode_delay_until(e->view());
  ASSERT_TRUE(out);
  EXPECT_EQ(out->domain, "d");
  EXPECT_EQ(out->next_ms, 123456);
  EXPECT_EQ(out->interval_ms, 40);
}

TEST(Wire, DecodesOriginalGatekeeperMessage) {
  // Exactly the bytes the original Node/nginx gatekeepers send.
  auto r = decode_accounting(views({"api\0"s, "ACCEPTED", "10.0.0.1", "1400000000000", ""}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->loginfo, "");
  auto d = decode_delay_until(views({"api\0"s, "DELAY_UNTIL", "10.0.0.1", "1400000000100"}));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->interval_ms, 0);
}

TEST(Wire, AccountingErrors) {
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1"}), decode_error::frame_count);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "x", "y"}), decode_error::frame_count);
  EXPECT_EQ(accounting_error({}), decode_error::frame_count);
  EXPECT_EQ(accounting_error({"api", "ACCEPTED", "k", "1", ""}), decode_error::domain_not_terminated);
  EXPECT_EQ(accounting_error({"", "ACCEPTED", "k", "1", ""}), decode_error::domain_not_terminated);
  EXPECT_EQ(accounting_error({"\0"s, "ACCEPTED", "k", "1", ""}), decode_error::domain_empty);
  EXPECT_EQ(accounting_error({"a\0b\0"s, "ACCEPTED", "k", "1", ""}), decode_error::domain_contains_null);
  EXPECT_EQ(accounting_error({std::string(300, 'd') + "\0"s, "ACCEPTED", "k", "1", ""}), decode_error::frame_too_large);
  EXPECT_EQ(accounting_error({"api\0"s, "accepted", "k", "1", ""}), decode_error::unknown_status);
  EXPECT_EQ(accounting_error({"api\0"s, "", "k", "1", ""}), decode_error::unknown_status);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "", "1", ""}), decode_error::identifier_empty);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", std::string(1025, 'i'), "1", ""}), decode_error::frame_too_large);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "", ""}), decode_error::timestamp_empty);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "12a", ""}), decode_error::timestamp_not_numeric);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "-1", ""}), decode_error::timestamp_not_numeric);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "+1", ""}), decode_error::timestamp_not_numeric);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", " 1", ""}), decode_error::timestamp_not_numeric);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "99999999999999999999999", ""}),
            decode_error::timestamp_out_of_range);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "999999999999999", ""}), decode_error::timestamp_out_of_range);
  EXPECT_EQ(accounting_error({"api\0"s, "DELAYED", "k", "1", ""}), decode_error::delayed_missing);
  EXPECT_EQ(accounting_error({"api\0"s, "DELAYED", "k", "1", "x"}), decode_error::timestamp_not_numeric);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "2"}), decode_error::delayed_unexpected);
  EXPECT_EQ(accounting_error({"api\0"s, "REJECTED", "k", "1", "2"}), decode_error::delayed_unexpected);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", std::string(4097, 'l')}),
            decode_error::frame_too_large);
}

TEST(Wire, TimestampBounds) {
  EXPECT_TRUE(parse_timestamp("0"));
  EXPECT_EQ(parse_timestamp("253402300799999").value(), max_timestamp_ms);
  EXPECT_EQ(parse_timestamp("253402300800000").error(), decode_error::timestamp_out_of_range);
  EXPECT_EQ(parse_timestamp("0001").value(), 1);
}

TEST(Wire, ControlErrors) {
  const auto err = [](const std::vector<std::string>& f) {
    auto v = views(f);
    auto r = decode_delay_until(v);
    EXPECT_FALSE(r);
    return r.error();
  };
  EXPECT_EQ(err({"api\0"s, "DELAY_UNTIL"}), decode_error::frame_count);
  EXPECT_EQ(err({"api\0"s, "DELAY_UNTIL", "k"}), decode_error::frame_count);
  EXPECT_EQ(err({"api\0"s, "DELAY_UNTIL", "k", "1", "2", "3"}), decode_error::frame_count);
  EXPECT_EQ(err({"api\0"s, "ALLOW", "k", "1"}), decode_error::unknown_command);
  EXPECT_EQ(err({"api"s, "DELAY_UNTIL", "k", "1"}), decode_error::domain_not_terminated);
  EXPECT_EQ(err({"api\0"s, "DELAY_UNTIL", "", "1"}), decode_error::identifier_empty);
  EXPECT_EQ(err({"api\0"s, "DELAY_UNTIL", "k", "soon"}), decode_error::timestamp_not_numeric);
  EXPECT_EQ(err({"api\0"s, "DELAY_UNTIL", "k", "1", "0"}), decode_error::interval_invalid);
  EXPECT_EQ(err({"api\0"s, "DELAY_UNTIL", "k", "1", "x"}), decode_error::interval_invalid);
}

TEST(Wire, EveryErrorHasADistinctName) {
  std::vector<std::string_view> names;
  for (std::size_t i = 0; i < decode_error_count; ++i) {
    auto n = to_string(static_cast<decode_error>(i));
    EXPECT_NE(n, "unknown");
    for (auto other : names) EXPECT_NE(n, other);
    names.push_back(n);
  }
}

TEST(Wire, PolicyGoldenBytesAndRoundTrip) {
  scratch s;
  policy p;
  p.domain = "api";
  p.rules[0] = {50'000, 10};   // 20/s burst 10
  p.rules[1] = {100'000, 40};  // 600/min burst 40
  p.count = 2;
  auto e = encode(p, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 4u);
  EXPECT_EQ(e->frame[0], "api\0"s);
  EXPECT_EQ(e->frame[1], "POLICY");
  EXPECT_EQ(e->frame[2], "");
  EXPECT_EQ(e->frame[3], "50000/10 100000/40");
  EXPECT_EQ(control_command(e->view()), "POLICY");
  auto d = decode_policy(e->view());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->domain, "api");
  ASSERT_EQ(d->count, 2u);
  EXPECT_EQ(d->rules[1].interval_us, 100'000);
  EXPECT_EQ(d->rules[1].burst, 40);
  // The largest values still fit the scratch space.
  for (auto& r : p.rules) r = {max_policy_span_us, 1};
  p.rules[3] = {max_policy_span_us / max_policy_burst, max_policy_burst};
  p.count = max_policy_rules;
  auto big = encode(p, s);
  ASSERT_TRUE(big);
  auto back = decode_policy(big->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rules[3].burst, max_policy_burst);
  EXPECT_EQ(back->rules[0].interval_us, max_policy_span_us);
}

TEST(Wire, PolicyEncodeRefusesWhatCannotBeDecoded) {
  scratch s;
  policy p;
  p.domain = "api";
  p.rules[0] = {0, 1};
  p.count = 1;
  EXPECT_FALSE(encode(p, s));  // interval 0
  p.rules[0] = {1, 0};
  EXPECT_FALSE(encode(p, s));  // burst 0
  p.rules[0] = {1, max_policy_burst + 1};
  EXPECT_FALSE(encode(p, s));  // burst over the bound
  p.rules[0] = {max_policy_span_us / 2 + 1, 2};
  EXPECT_FALSE(encode(p, s));  // window over the bound
  p.rules[0] = {1, 1};
  p.count = max_policy_rules + 1;
  EXPECT_FALSE(encode(p, s));
}

TEST(Wire, PolicyErrors) {
  const auto err = [](const std::vector<std::string>& f) {
    auto v = views(f);
    auto r = decode_policy(v);
    EXPECT_FALSE(r);
    return r.error();
  };
  EXPECT_EQ(err({"api\0"s}), decode_error::frame_count);
  EXPECT_EQ(err({"api\0"s, "POLICY", ""}), decode_error::frame_count);
  EXPECT_EQ(err({"api\0"s, "POLICY", "", "1/1", "x"}), decode_error::frame_count);
  EXPECT_EQ(err({"api\0"s, "DELAY_UNTIL", "", "1/1"}), decode_error::unknown_command);
  EXPECT_EQ(err({"api"s, "POLICY", "", "1/1"}), decode_error::domain_not_terminated);
  EXPECT_EQ(err({"api\0"s, "POLICY", std::string(max_identifier_bytes + 1, 'k'), "1/1"}),
            decode_error::frame_too_large);
  for (const char* bad :
       {" ", "1", "1/", "/1", "0/1", "1/0", "1/1 ", " 1/1", "1/1  2/2", "1//1", "a/1", "1/1 2/2 3/3 4/4 5/5", "1/1,2/2",
        "9999999999999999/1", "1/1000001", "140737488355329/1", "70368744177665/2"}) {
    EXPECT_EQ(err({"api\0"s, "POLICY", "", bad}), decode_error::policy_invalid) << '"' << bad << '"';
  }
}

TEST(Wire, PolicyForOneIdentifier) {
  // A per-identifier override: the identifier frame names the client.
  scratch s;
  policy p;
  p.domain = "api";
  p.identifier = "sha256:0123456789abcdef0123456789abcdef";
  p.rules[0] = {10'000, 200};  // 100/s burst 200
  p.count = 1;
  auto e = encode(p, s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->frame[2], "sha256:0123456789abcdef0123456789abcdef");
  EXPECT_EQ(e->frame[3], "10000/200");
  auto d = decode_policy(e->view());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->identifier, "sha256:0123456789abcdef0123456789abcdef");
  ASSERT_EQ(d->count, 1u);
  EXPECT_EQ(d->rules[0].burst, 200);
  // An override without rules: that client is not limited.
  p.count = 0;
  auto open = encode(p, s);
  ASSERT_TRUE(open);
  auto back = decode_policy(open->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->identifier, p.identifier);
  EXPECT_EQ(back->count, 0u);
  const std::string too_long(max_identifier_bytes + 1, 'k');
  p.identifier = too_long;
  EXPECT_FALSE(encode(p, s));
}

TEST(Wire, PolicyWithoutRules) {
  // A domain the master owns with no rules: an empty rules frame.
  scratch s;
  policy p;
  p.domain = "open";
  auto e = encode(p, s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->frame[3], "");
  auto d = decode_policy(e->view());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->domain, "open");
  EXPECT_EQ(d->count, 0u);
}

TEST(Wire, CostGoldenBytesAndRoundTrip) {
  scratch s;
  // Cost 1 is the spec's message: no loginfo frame.
  auto one = encode(accounting{"api", status::accepted, "k", 1000, 0, {}, 1}, s);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->count, 5u);
  auto e = encode(accounting{"api", status::accepted, "k", 1000, 0, {}, 1234}, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 6u);
  EXPECT_EQ(e->frame[5], "cost=1234");
  auto back = decode_accounting(e->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->cost, 1234);
  EXPECT_EQ(back->loginfo, "");
  // With loginfo: "cost=N " before it; decoded, the loginfo is what follows.
  auto d = encode(accounting{"api", status::delayed, "k", 1000, 1100, "curl/8", 0}, s);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->frame[5], "cost=0 curl/8");
  back = decode_accounting(d->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->cost, 0);
  EXPECT_EQ(back->loginfo, "curl/8");
  // A loginfo of cost 1 that starts with "cost=" is not mistaken for a cost.
  auto tricky = encode(accounting{"api", status::accepted, "k", 1000, 0, "cost=5", 1}, s);
  ASSERT_TRUE(tricky);
  EXPECT_EQ(tricky->frame[5], "cost=1 cost=5");
  back = decode_accounting(tricky->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->cost, 1);
  EXPECT_EQ(back->loginfo, "cost=5");
  // The largest cost; beyond it, and below 0, nothing is encoded.
  auto big = encode(accounting{"api", status::accepted, "k", 1000, 0, {}, max_cost}, s);
  ASSERT_TRUE(big);
  EXPECT_EQ(big->frame[5], "cost=1000000000000");
  EXPECT_FALSE(encode(accounting{"api", status::accepted, "k", 1000, 0, {}, max_cost + 1}, s));
  EXPECT_FALSE(encode(accounting{"api", status::accepted, "k", 1000, 0, {}, -1}, s));
  EXPECT_FALSE(encode(accounting{"api", status::accepted, "k", 1000, 0, std::string(4090, 'l'), 7}, s));
}

TEST(Wire, CostErrorsAndPlainLoginfo) {
  // A loginfo without the prefix is the spec's free text: one unit.
  const std::vector<std::string> frames{"api\0"s, "ACCEPTED", "k", "1", "", "Mozilla/5.0 cost=9"};
  auto v = views(frames);
  auto plain = decode_accounting(v);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->cost, 1);
  EXPECT_EQ(plain->loginfo, "Mozilla/5.0 cost=9");
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "cost="}), decode_error::cost_invalid);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "cost=x"}), decode_error::cost_invalid);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "cost=-3"}), decode_error::cost_invalid);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "cost=3x"}), decode_error::cost_invalid);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "cost=1000000000001"}), decode_error::cost_invalid);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "cost= 3"}), decode_error::cost_invalid);
}

TEST(Wire, AdjustGoldenBytesAndRoundTrip) {
  scratch s;
  accounting m{"llm", status::rejected, "key-1", 1'795'514'400'123, 0, {}, 1};
  m.adjust = -180;
  auto e = encode(m, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 6u);
  const std::vector<std::string> golden{"llm\0"s, "REJECTED", "key-1", "1795514400123", "", "adjust=-180"};
  for (std::size_t i = 0; i < golden.size(); ++i) EXPECT_EQ(e->frame[i], golden[i]) << i;
  auto back = decode_accounting(e->view());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->state, status::rejected);
  EXPECT_EQ(back->adjust, -180);
  EXPECT_EQ(back->loginfo, "");
  // Encoded with this loginfo frame, and decoded back.
  const auto through = [&](const accounting& x, std::string_view frame) {
    const auto enc = encode(x, s);
    EXPECT_TRUE(enc && enc->count == 6 && enc->frame[5] == frame) << frame;
    const auto dec = enc ? decode_accounting(enc->view()) : result<accounting>(decode_error::frame_count);
    EXPECT_TRUE(dec) << frame;
    return dec ? dec.value() : accounting{};
  };
  m.adjust = 25;
  m.loginfo = "curl/8";
  back = through(m, "adjust=25 curl/8");
  EXPECT_EQ(back->adjust, 25);
  EXPECT_EQ(back->loginfo, "curl/8");
  // The bounds; only a REJECTED message carries one; a REJECTED loginfo that
  // would read as one gets a cost prefix.
  m.loginfo = {};
  m.adjust = -max_cost;
  EXPECT_TRUE(encode(m, s));
  m.adjust = max_cost + 1;
  EXPECT_FALSE(encode(m, s));
  m.adjust = 5;
  m.state = status::accepted;
  EXPECT_FALSE(encode(m, s));
  const accounting tricky = through(accounting{"llm", status::rejected, "k", 1, 0, "adjust=5", 1}, "cost=1 adjust=5");
  EXPECT_FALSE(tricky.adjust);
  EXPECT_EQ(tricky.loginfo, "adjust=5");
  // 0 closes a reservation as reserved.
  m.state = status::rejected;
  m.adjust = 0;
  EXPECT_EQ(through(m, "adjust=0").adjust, 0);
  through(accounting{"llm", status::accepted, "k", 1, 0, "adjust=5", 1}, "adjust=5");
}

TEST(Wire, AdjustErrorsAndPlainLoginfo) {
  // Only a REJECTED message's loginfo is read for it: elsewhere it is free text.
  const std::vector<std::string> frames{"api\0"s, "ACCEPTED", "k", "1", "", "adjust=-5"};
  auto v = views(frames);
  auto plain = decode_accounting(v);
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->adjust);
  EXPECT_EQ(plain->loginfo, "adjust=-5");
  for (const char* bad : {"adjust=", "adjust=-", "adjust=+5", "adjust=--5", "adjust=5x", "adjust=1000000000001",
                          "adjust=-1000000000001", "adjust= 5"}) {
    EXPECT_EQ(accounting_error({"api\0"s, "REJECTED", "k", "1", "", bad}), decode_error::adjust_invalid) << bad;
  }
  EXPECT_EQ(to_string(decode_error::adjust_invalid), "adjust_invalid");
}

TEST(Wire, ReserveGoldenBytesAndRoundTrip) {
  scratch s;
  accounting m{"llm", status::delayed, "key-1", 1'795'514'400'123, 1'795'514'400'500, {}, 50};
  m.reserve = true;
  auto e = encode(m, s);
  ASSERT_TRUE(e);
  const std::vector<std::string> golden{"llm\0"s, "DELAYED", "key-1", "1795514400123", "1795514400500", "reserve=50"};
  ASSERT_EQ(e->count, golden.size());
  for (std::size_t i = 0; i < golden.size(); ++i) EXPECT_EQ(e->frame[i], golden[i]) << i;
  auto back = decode_accounting(e->view());
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->reserve);
  EXPECT_EQ(back->cost, 50);
  // Even an estimate of 1 says so; a REJECTED message reserves nothing.
  m.cost = 1;
  e = encode(m, s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->frame[5], "reserve=1");
  m.state = status::rejected;
  EXPECT_FALSE(encode(m, s));
  // A plain loginfo that reads as a reservation gets the cost prefix; a
  // REJECTED one is free text.
  auto tricky = encode(accounting{"llm", status::accepted, "k", 1, 0, "reserve=5", 1}, s);
  ASSERT_TRUE(tricky);
  EXPECT_EQ(tricky->frame[5], "cost=1 reserve=5");
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "reserve=x"}), decode_error::reserve_invalid);
  EXPECT_EQ(accounting_error({"api\0"s, "ACCEPTED", "k", "1", "", "reserve=-1"}), decode_error::reserve_invalid);
  const std::vector<std::string> frames{"api\0"s, "REJECTED", "k", "1", "", "reserve=x"};
  auto v = views(frames);
  auto free_text = decode_accounting(v);
  ASSERT_TRUE(free_text);
  EXPECT_FALSE(free_text->reserve);
}

TEST(Wire, QuotaGoldenBytesAndRoundTrip) {
  scratch s;
  quota_policy q;
  q.domain = "llm";
  q.items[q.count++] = {1'000'000, smockron::calendar::period::month, 0, 0};
  q.items[q.count++] = {5'000, smockron::calendar::period::day, 19'800, 0};
  q.items[q.count++] = {50, smockron::calendar::period::fixed, -3'600, 10};
  auto e = encode(q, s);
  ASSERT_TRUE(e);
  ASSERT_EQ(e->count, 4u);
  EXPECT_EQ(e->frame[0], "llm\0"s);
  EXPECT_EQ(e->frame[1], "QUOTA");
  EXPECT_EQ(e->frame[2], "");
  EXPECT_EQ(e->frame[3], "1000000/month/0 5000/day/19800 50/10/-3600");
  auto back = decode_quota(e->view());
  ASSERT_TRUE(back);
  ASSERT_EQ(back->count, 3u);
  EXPECT_EQ(back->items[1].per, smockron::calendar::period::day);
  EXPECT_EQ(back->items[1].offset_s, 19'800);
  EXPECT_EQ(back->items[2].per, smockron::calendar::period::fixed);
  EXPECT_EQ(back->items[2].length_s, 10);
  EXPECT_EQ(back->items[2].offset_s, -3'600);
  // No quotas: an empty frame.
  quota_policy none;
  none.domain = "llm";
  auto empty = encode(none, s);
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->frame[3], "");
  EXPECT_EQ(decode_quota(empty->view())->count, 0u);
  // Outside the bounds: nothing encoded.
  quota_policy bad = q;
  bad.items[0].limit = 0;
  EXPECT_FALSE(encode(bad, s));
  bad = q;
  bad.items[1].offset_s = 15 * 3600;
  EXPECT_FALSE(encode(bad, s));
}

TEST(Wire, QuotaErrors) {
  const auto err = [](const std::string& quotas) {
    const std::vector<std::string> f{"llm\0"s, "QUOTA", "", quotas};
    auto v = views(f);
    auto r = decode_quota(v);
    EXPECT_FALSE(r) << quotas;
    return r ? decode_error::frame_count : r.error();
  };
  for (const char* bad :
       {"10", "10/month", "0/month/0", "10/year/0", "10/0/0", "x/day/0", "10/day/+5", "10/day/-0", "10/day/50401",
        "10/day/0  10/day/0", "10/day/0 ", "1/day/0 1/day/0 1/day/0 1/day/0 1/day/0", "1000000000001/day/0"}) {
    EXPECT_EQ(err(bad), decode_error::quota_invalid) << bad;
  }
  const std::vector<std::string> three{"llm\0"s, "QUOTA", ""};
  auto v = views(three);
  EXPECT_EQ(decode_quota(v).error(), decode_error::frame_count);
}
