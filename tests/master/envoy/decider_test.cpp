// Envoy's rate limit services decided on the engine, with no sockets and an
// injected clock: identifiers from descriptors, costs, the all-or-nothing
// charge, the limit that decides, the RateLimit fields, RLQS assignments.
#include <gtest/gtest.h>

#include "master/envoy/decider.hpp"

using namespace smockron;
using namespace smockron::master;

namespace {

using rate_limit = rls_pb::RateLimitResponse::RateLimit;
constexpr auto OK = rls_pb::RateLimitResponse::OK;
constexpr auto OVER = rls_pb::RateLimitResponse::OVER_LIMIT;

config::master_config load(const char* text) {
  auto r = config::load_string(text, "test");
  EXPECT_TRUE(r.cfg) << (r.errors.empty() ? "" : r.errors.front().message);
  return *r.cfg->master;
}

class Decider : public ::testing::Test {
protected:
  explicit Decider(const char* text = R"(
[master]
rls = "127.0.0.1:0"
[master.domains.api]
rules = [ { rate = "60/min", burst = 5 } ]
descriptor_keys = ["api_key"]
[master.domains.q]
rules = [ { rate = "60/min", burst = 5 }, { quota = 7, per = "day" } ]
)")
      : cfg_(load(text)),
        engine_(cfg_, clock_, registry_),
        decider_(cfg_, engine_, clock_, registry_,
                 [this](const wire::delay_until& d) { published_.push_back(std::string(d.identifier)); }) {}

  rls_pb::RateLimitResponse ask(const std::string& domain,
                                std::vector<std::vector<std::pair<std::string, std::string>>> descs,
                                std::uint32_t hits = 0, std::optional<std::uint64_t> own = std::nullopt) {
    rls_pb::RateLimitRequest req;
    req.set_domain(domain);
    req.set_hits_addend(hits);
    for (const auto& d : descs) {
      auto* desc = req.add_descriptors();
      for (const auto& [k, v] : d) {
        auto* e = desc->add_entries();
        e->set_key(k);
        e->set_value(v);
      }
      if (own) desc->mutable_hits_addend()->set_value(*own);
    }
    rls_pb::RateLimitResponse resp;
    last_status_ = decider_.should_rate_limit(req, resp, clock_.wall_us());
    return resp;
  }
  int code(const std::string& key, std::uint32_t hits = 0) {
    return ask("api", {{{"api_key", key}}}, hits).overall_code();
  }
  static std::map<std::string, std::string> headers(const rls_pb::RateLimitResponse& r) {
    std::map<std::string, std::string> out;
    for (const auto& h : r.response_headers_to_add()) out[h.key()] = h.value();
    return out;
  }

  manual_clock clock_;
  metrics::registry registry_;
  config::master_config cfg_;
  ingest engine_;
  envoy_decider decider_;
  std::vector<std::string> published_;
  envoy_decider::status last_status_;
};

TEST(EnvoyIdentifier, KeysPickValuesInOrderAndAMissingKeyNamesNobody) {
  const std::vector<std::pair<std::string_view, std::string_view>> pairs = {
      {"path", "/x"}, {"api_key", "k"}, {"user", "u"}};
  EXPECT_EQ(identifier_of(pairs, {"api_key"}, "|"), "k");
  EXPECT_EQ(identifier_of(pairs, {"user", "api_key"}, ":"), "u:k");
  EXPECT_EQ(identifier_of(pairs, {}, "|"), "/x|k|u");
  EXPECT_EQ(identifier_of(pairs, {"remote_address"}, "|"), std::nullopt);
  EXPECT_EQ(identifier_of({{"a", ""}}, {}, "|"), std::nullopt) << "empty";
  const std::string long_value(1025, 'x');
  EXPECT_EQ(identifier_of({{"a", long_value}}, {}, "|"), std::nullopt) << "longer than an identifier may be";
}

TEST(EnvoyLimit, TheSmallestUnitInWhichTheRateIsWhole) {
  EXPECT_EQ(rls_limit_of(100'000).unit, rate_limit::SECOND);  // 10/s
  EXPECT_EQ(rls_limit_of(100'000).requests_per_unit, 10u);
  EXPECT_EQ(rls_limit_of(600'000).unit, rate_limit::MINUTE);  // 100/min, not 2/s
  EXPECT_EQ(rls_limit_of(600'000).requests_per_unit, 100u);
  EXPECT_EQ(rls_limit_of(90'000'000).unit, rate_limit::HOUR);  // one per 90 s: 40/h
  EXPECT_EQ(rls_limit_of(90'000'000).requests_per_unit, 40u);
  EXPECT_EQ(rls_limit_of(7 * 86'400'000'000LL).unit, rate_limit::DAY);  // one a week: at least 1 a day
  EXPECT_EQ(rls_limit_of(7 * 86'400'000'000LL).requests_per_unit, 1u);
}

TEST(EnvoyTokenBucket, WholeSecondFillsCloseToTheRateAndSplitAmongStreams) {
  EXPECT_EQ(token_bucket_of(1'000'000, 10, 1), (token_bucket{10, 1, 1}));   // 60/min
  EXPECT_EQ(token_bucket_of(600'000, 100, 1), (token_bucket{100, 5, 3}));   // 100/min: 5 every 3 s
  EXPECT_EQ(token_bucket_of(1'000'000, 10, 0.5), (token_bucket{5, 1, 2}));  // half each
  EXPECT_EQ(token_bucket_of(1'000'000, 10, 0.0), (token_bucket{1, 1, 3600})) << "nothing: a token an hour";
  EXPECT_EQ(token_bucket_of(60'000'000, 1, 1), (token_bucket{1, 1, 60}));  // 1/min
  EXPECT_EQ(token_bucket_of(1'000, 5, 1).tokens_per_fill, 5u) << "never more per fill than the bucket holds";
}

TEST(EnvoyShares, TheLightGetWhatTheyWantAndTheOthersTheLevel) {
  const auto split = [](std::vector<double> d, double capacity) { return max_min_split(d, capacity); };
  EXPECT_EQ(split({30}, 10), std::vector<double>({10}));
  EXPECT_EQ(split({0, 30}, 10), std::vector<double>({0.5, 9.5})) << "an idle sharer keeps its floor, no more";
  auto s = split({20, 2, 50}, 10);  // the light one wants 2 x 1.25
  EXPECT_DOUBLE_EQ(s[0], 3.75);
  EXPECT_DOUBLE_EQ(s[1], 2.5);
  EXPECT_DOUBLE_EQ(s[2], 3.75);
  s = split({1, 3}, 10);  // 1.25 and 3.75 wanted: the 5 left, half each
  EXPECT_DOUBLE_EQ(s[0], 3.75);
  EXPECT_DOUBLE_EQ(s[1], 6.25);
  s = split({-1, 30}, 10);  // not known yet: wants the level
  EXPECT_DOUBLE_EQ(s[0], 5);
  EXPECT_DOUBLE_EQ(s[1], 5);
  s = split({-1, 2}, 10);
  EXPECT_DOUBLE_EQ(s[0], 7.5);
  EXPECT_DOUBLE_EQ(s[1], 2.5);
  EXPECT_TRUE(split({}, 10).empty());
}

TEST(EnvoyShares, RandomSplitsAddUpAndAreMaxMinFair) {
  std::uint64_t x = 88172645463325252ULL;  // xorshift: the same demands every run
  const auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int round = 0; round < 2'000; ++round) {
    std::vector<double> demands(1 + next() % 8);
    for (double& d : demands) d = next() % 5 == 0 ? -1.0 : static_cast<double>(next() % 1000) / 10.0;
    const double capacity = 1.0 + static_cast<double>(next() % 2000) / 10.0;
    const auto shares = max_min_split(demands, capacity);
    ASSERT_EQ(shares.size(), demands.size());
    double sum = 0;
    for (std::size_t i = 0; i < shares.size(); ++i) {
      EXPECT_GE(shares[i], 0.0);
      sum += shares[i];
      EXPECT_GE(shares[i], capacity * k_share_floor / static_cast<double>(shares.size()) - 1e-9) << "the floor";
      const double want = demands[i] < 0 ? capacity : demands[i] * k_share_headroom;
      // Max-min: one that got less than it wants got at least as much as anyone.
      if (shares[i] < want - 1e-9) {
        for (const double other : shares) EXPECT_GE(shares[i], other - 1e-9) << "round " << round;
      }
    }
    EXPECT_NEAR(sum, capacity, 1e-9 * capacity) << "round " << round;
  }
}

TEST_F(Decider, UnitsAreChargedWhileTheyFitThenOverLimitWithTheLimitThatDecides) {
  for (int i = 0; i < 5; ++i) EXPECT_EQ(code("k"), OK) << i;
  const auto r = ask("api", {{{"api_key", "k"}}});
  EXPECT_EQ(r.overall_code(), OVER);
  const auto& st = r.statuses(0);
  EXPECT_EQ(st.current_limit().name(), "api");
  EXPECT_EQ(st.current_limit().requests_per_unit(), 1u) << "60/min is 1/s";
  EXPECT_EQ(st.current_limit().unit(), rate_limit::SECOND);
  EXPECT_EQ(st.limit_remaining(), 0u);
  EXPECT_EQ(st.duration_until_reset().seconds(), 5);
  const auto h = headers(r);
  EXPECT_EQ(h.at("RateLimit-Policy"), "\"api\";q=5;w=5");
  EXPECT_EQ(h.at("RateLimit"), "\"api\";r=0;t=5");
  EXPECT_EQ(h.at("Retry-After"), "1");
  EXPECT_EQ(published_, std::vector<std::string>({"k"})) << "the gatekeepers hear it once it is throttled";
  clock_.advance(std::chrono::seconds(1));
  EXPECT_EQ(code("k"), OK) << "a unit back a second later";
}

TEST_F(Decider, HitsAddendIsTheCostAndACostOverTheBurstNeverFits) {
  EXPECT_EQ(code("a", 3), OK);
  EXPECT_EQ(code("a", 3), OVER) << "3 + 3 > 5: refused, not charged";
  EXPECT_EQ(code("a", 2), OK);
  const auto big = ask("api", {{{"api_key", "b"}}}, 6);
  EXPECT_EQ(big.overall_code(), OVER);
  EXPECT_EQ(headers(big).count("Retry-After"), 0u) << "no time at which it fits";
  EXPECT_EQ(code("b", 5), OK) << "the refusal left nothing charged";
  // A descriptor's own hits_addend, even 0, wins over the request's.
  EXPECT_EQ(ask("api", {{{"api_key", "c"}}}, 4, 0).overall_code(), OK);
  EXPECT_EQ(engine_.states().find(engine_.find("api").value(), "c"), nullptr) << "0 units: a look only";
}

TEST_F(Decider, AllOrNothingAcrossDescriptors) {
  for (int i = 0; i < 5; ++i) code("full");
  const auto r = ask("api", {{{"api_key", "free"}}, {{"api_key", "full"}}});
  EXPECT_EQ(r.overall_code(), OVER);
  EXPECT_EQ(r.statuses(0).code(), OK);
  EXPECT_EQ(r.statuses(1).code(), OVER);
  EXPECT_EQ(engine_.states().find(engine_.find("api").value(), "free"), nullptr) << "not charged";
  const auto none = ask("api", {{{"path", "/"}}});
  EXPECT_EQ(none.overall_code(), OK) << "a descriptor naming nobody is not limited";
  EXPECT_FALSE(none.statuses(0).has_current_limit());
}

TEST_F(Decider, QuotasDecideWhenTheyHaveFewerUnitsLeft) {
  const auto first = ask("q", {{{"id", "x"}}}, 4);
  EXPECT_EQ(first.statuses(0).current_limit().name(), "q-1") << "burst 1 left, quota 3: the burst";
  clock_.advance(std::chrono::seconds(10));
  const auto second = ask("q", {{{"id", "x"}}}, 3);
  EXPECT_EQ(second.overall_code(), OK);
  EXPECT_EQ(second.statuses(0).current_limit().name(), "q-2") << "the quota has 0 left";
  EXPECT_EQ(second.statuses(0).current_limit().unit(), rate_limit::DAY);
  EXPECT_EQ(second.statuses(0).current_limit().requests_per_unit(), 7u);
  clock_.advance(std::chrono::seconds(10));
  const auto third = ask("q", {{{"id", "x"}}});
  EXPECT_EQ(third.overall_code(), OVER);
  EXPECT_GT(std::stoll(headers(third).at("Retry-After")), 60) << "until the day's window ends";
}

TEST_F(Decider, UnknownDomainsAreAllowedAndBadRequestsInvalid) {
  const auto r = ask("elsewhere", {{{"a", "b"}}, {{"c", "d"}}});
  EXPECT_EQ(r.overall_code(), OK);
  EXPECT_EQ(r.statuses_size(), 2);
  ask("api", {});
  EXPECT_FALSE(last_status_.ok);
}

class ShadowDecider : public Decider {
protected:
  ShadowDecider()
      : Decider(R"(
[master]
rls = "127.0.0.1:0"
rls_unknown_domain = "deny"
[master.domains.api]
rules = [ { rate = "60/min", burst = 1 } ]
envoy_mode = "shadow"
)") {}
};

TEST_F(ShadowDecider, ShadowAnswersOkAndChargesAndUnknownDomainsCanBeDenied) {
  EXPECT_EQ(ask("api", {{{"k", "s"}}}).overall_code(), OK);
  EXPECT_EQ(ask("api", {{{"k", "s"}}}).overall_code(), OK);
  EXPECT_EQ(engine_.states().find(engine_.find("api").value(), "s")->times.size(), 2u) << "both charged";
  EXPECT_EQ(ask("elsewhere", {{{"a", "b"}}}).overall_code(), OVER);
}

// RLQS: a usage report in, an action per bucket out.
class Rlqs : public Decider {
protected:
  Rlqs() = default;
  explicit Rlqs(const char* text) : Decider(text) {}
  rlqs_pb::RateLimitQuotaResponse report(rlqs_stream_state& s, const std::string& domain,
                                         std::vector<std::tuple<std::map<std::string, std::string>, int, int>> buckets,
                                         int elapsed_s = 1) {
    rlqs_pb::RateLimitQuotaUsageReports r;
    r.set_domain(domain);
    for (const auto& [b, allowed, denied] : buckets) {
      auto* u = r.add_bucket_quota_usages();
      for (const auto& [k, v] : b) (*u->mutable_bucket_id()->mutable_bucket())[k] = v;
      u->mutable_time_elapsed()->set_seconds(elapsed_s);
      u->set_num_requests_allowed(static_cast<std::uint64_t>(allowed));
      u->set_num_requests_denied(static_cast<std::uint64_t>(denied));
    }
    rlqs_pb::RateLimitQuotaResponse out;
    decider_.report(s, r, out, clock_.wall_us());
    return out;
  }
};

TEST_F(Rlqs, UsageIsChargedAndAnsweredWithTheRuleThenDenyAll) {
  rlqs_stream_state s{1, {}};
  auto out = report(s, "api", {{{{"api_key", "k"}}, 2, 0}});
  ASSERT_EQ(out.bucket_action_size(), 1);
  const auto& tb = out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket();
  EXPECT_EQ(tb.max_tokens(), 5u);
  EXPECT_EQ(tb.tokens_per_fill().value(), 1u);
  EXPECT_EQ(tb.fill_interval().seconds(), 1);
  EXPECT_EQ(out.bucket_action(0).quota_assignment_action().assignment_time_to_live().seconds(), 3);
  out = report(s, "api", {{{{"api_key", "k"}}, 4, 3}});
  const auto& qa = out.bucket_action(0).quota_assignment_action();
  EXPECT_EQ(qa.rate_limit_strategy().blanket_rule(), ::envoy::type::v3::RateLimitStrategy::DENY_ALL);
  EXPECT_EQ(qa.assignment_time_to_live().seconds(), 2) << "6 units over a burst of 5: free in 2 s";
  EXPECT_EQ(engine_.states().find_stats(engine_.find("api").value(), "k").n_over, 1u) << "the denials counted";
  EXPECT_EQ(published_, std::vector<std::string>({"k"}));
  EXPECT_EQ(decider_.buckets(), 1u);
  decider_.stream_closed(s);
  EXPECT_EQ(decider_.buckets(), 0u);
}

TEST_F(Rlqs, BucketsOfNobodyOrBeyondTheBoundAreAbandonedAndStreamsShareARate) {
  rlqs_stream_state s{1, {}};
  auto out = report(s, "api", {{{{"user", "u"}}, 1, 0}, {{{"api_key", "k"}}, 0, 0}});
  EXPECT_TRUE(out.bucket_action(0).has_abandon_action());
  EXPECT_TRUE(out.bucket_action(1).has_quota_assignment_action());
  EXPECT_TRUE(report(s, "elsewhere", {{{{"api_key", "k"}}, 1, 0}}).bucket_action(0).has_abandon_action());
  rlqs_stream_state t{2, {}};
  out = report(t, "api", {{{{"api_key", "k"}}, 0, 0}});
  const auto& half = out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket();
  EXPECT_EQ(half.max_tokens(), 2u);
  EXPECT_EQ(half.tokens_per_fill().value(), 1u);
  EXPECT_EQ(half.fill_interval().seconds(), 2);
  decider_.stream_closed(t);
  clock_.advance(std::chrono::seconds(1));
  out = report(s, "api", {{{{"api_key", "k"}}, 0, 0}});
  EXPECT_EQ(out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket().max_tokens(), 5u)
      << "the other stream closed: the whole rate again";
}

TEST_F(Rlqs, AQuotaWithLessLeftThanTheBucketHoldsIsTheBucket) {
  // Domain q: 60/min burst 5 (a sliding log over 5 s), and 7 a day. Its
  // identifier is every value. The uses are spread so that the rule never binds.
  const std::map<std::string, std::string> k{{"api_key", "k"}};
  const auto bucket = [](const rlqs_pb::RateLimitQuotaResponse& out) {
    const auto& tb = out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket();
    return token_bucket{tb.max_tokens(), tb.tokens_per_fill().value(), tb.fill_interval().seconds()};
  };
  rlqs_stream_state s{1, {}};
  EXPECT_EQ(bucket(report(s, "q", {{k, 0, 0}})), (token_bucket{5, 1, 1})) << "7 left today: the rule's bucket";
  clock_.advance(std::chrono::seconds(1));
  EXPECT_EQ(bucket(report(s, "q", {{k, 3, 0}})), (token_bucket{4, 1, 3600})) << "4 left: no more, not refilled";
  // A second stream asked for as much as the first: half of what is left each.
  clock_.advance(std::chrono::seconds(5));
  report(s, "q", {{k, 0, 3}});
  rlqs_stream_state t{2, {}};
  EXPECT_EQ(bucket(report(t, "q", {{k, 1, 2}})), (token_bucket{1, 1, 3600})) << "3 left, half each";
  clock_.advance(std::chrono::seconds(1));
  const auto out = report(s, "q", {{k, 2, 1}});  // 1 left: half a request each
  EXPECT_EQ(out.bucket_action(0).quota_assignment_action().rate_limit_strategy().blanket_rule(),
            ::envoy::type::v3::RateLimitStrategy::DENY_ALL);
  EXPECT_EQ(out.bucket_action(0).quota_assignment_action().assignment_time_to_live().seconds(), 3)
      << "until the next reports, not the day's end: the other stream may still use the last one";
  EXPECT_TRUE(published_.empty()) << "nothing throttled: 6 of 7 used, within the rule";
}

class RlqsQuotas : public Rlqs {
protected:
  RlqsQuotas()
      : Rlqs(R"(
[master]
rls = "127.0.0.1:0"
[master.domains.daily]
rules = [ { quota = 7, per = "day" } ]
[master.domains.open]
rules = [ { concurrency = 4 } ]
)") {}
};

TEST_F(RlqsQuotas, QuotasAloneAreABucketOfWhatIsLeft) {
  // Before, a domain without a rate rule was ALLOW_ALL until its quota ran out.
  rlqs_stream_state s{1, {}};
  const std::map<std::string, std::string> k{{"api_key", "k"}};
  auto out = report(s, "daily", {{k, 0, 0}});
  const auto& tb = out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket();
  EXPECT_EQ((token_bucket{tb.max_tokens(), tb.tokens_per_fill().value(), tb.fill_interval().seconds()}),
            (token_bucket{7, 1, 3600}));
  out = report(s, "daily", {{k, 5, 0}});
  EXPECT_EQ(out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket().max_tokens(), 2u);
  out = report(s, "open", {{k, 5, 0}});
  EXPECT_EQ(out.bucket_action(0).quota_assignment_action().rate_limit_strategy().blanket_rule(),
            ::envoy::type::v3::RateLimitStrategy::ALLOW_ALL)
      << "neither rule nor quota";
}

// RLQS streams sharing one identifier's rate by what their Envoys are asked for.
class RlqsShares : public Rlqs {
protected:
  RlqsShares()
      : Rlqs(R"(
[master]
rls = "127.0.0.1:0"
[master.domains.api]
rules = [ { rate = "600/min", burst = 100 } ]
descriptor_keys = ["api_key"]
)") {}
  static token_bucket bucket_of(const rlqs_pb::RateLimitQuotaResponse& out) {
    const auto& tb = out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket();
    return {tb.max_tokens(), tb.tokens_per_fill().value(), tb.fill_interval().seconds()};
  }
  const std::map<std::string, std::string> k_{{"api_key", "k"}};
};

TEST_F(RlqsShares, TheRateGoesWhereTheRequestsAre) {
  // Envoy reports every bucket it made, used or not: both streams know the key.
  rlqs_stream_state hot{1, {}};
  rlqs_stream_state idle{2, {}};
  EXPECT_EQ(bucket_of(report(hot, "api", {{k_, 0, 0}}, 0)), (token_bucket{100, 10, 1})) << "alone: the rule";
  EXPECT_EQ(bucket_of(report(idle, "api", {{k_, 0, 0}}, 0)), (token_bucket{50, 5, 1})) << "two, nothing known: half";
  token_bucket h, i;
  for (int round = 0; round < 2; ++round) {
    clock_.advance(std::chrono::seconds(1));
    h = bucket_of(report(hot, "api", {{k_, 5, 25}}));  // 30 a second wanted, 5 let through
    i = bucket_of(report(idle, "api", {{k_, 0, 0}}));
  }
  EXPECT_EQ(h, (token_bucket{95, 19, 2})) << "the rate where the requests are, but for the other's floor";
  EXPECT_EQ(i, (token_bucket{5, 1, 2})) << "the idle stream keeps its floor (5%), no more";
  // The requests spread to the other Envoy too: half each.
  clock_.advance(std::chrono::seconds(1));
  EXPECT_EQ(bucket_of(report(idle, "api", {{k_, 5, 25}})), (token_bucket{50, 5, 1}));
  EXPECT_EQ(bucket_of(report(hot, "api", {{k_, 5, 25}})), (token_bucket{50, 5, 1}));
  EXPECT_FALSE(engine_.check(engine_.find("api").value(), "k", 0, clock_.wall_us(), limiter::charge_mode::probe)
                   .throttled_until_us > clock_.wall_us())
      << "what was let through fits the rule: token buckets, not DENY_ALL";
}

TEST_F(Rlqs, AThrottledStreamsDenialsAreItsDemandWhenTheThrottleEnds) {
  const std::map<std::string, std::string> k{{"api_key", "k"}};
  rlqs_stream_state s{1, {}};
  rlqs_stream_state t{2, {}};
  report(s, "api", {{k, 6, 0}});  // over the burst of 5: throttled
  for (int second = 0; second < 10; ++second) {
    // Both keep asking: t first, so it answers before s is heard again.
    const auto out = report(t, "api", {{k, 0, 4}});
    report(s, "api", {{k, 0, 3}});
    const auto& qa = out.bucket_action(0).quota_assignment_action();
    if (qa.rate_limit_strategy().has_token_bucket()) {
      EXPECT_EQ(qa.rate_limit_strategy().token_bucket().max_tokens(), 2u)
          << "half of the burst: s's denials while throttled counted, not t alone";
      return;
    }
    clock_.advance(std::chrono::seconds(1));
  }
  FAIL() << "still throttled after 10 s";
}

TEST_F(Rlqs, AStreamReportingSlowlyStillSharesBetweenItsReports) {
  const std::map<std::string, std::string> k{{"api_key", "k"}};
  rlqs_stream_state s{1, {}};
  rlqs_stream_state t{2, {}};
  // Envoys reporting every 10 s, 5 s out of step: each hears of the other in time.
  report(s, "api", {{k, 0, 10}}, 10);
  clock_.advance(std::chrono::seconds(5));
  auto out = report(t, "api", {{k, 0, 10}}, 10);
  EXPECT_EQ(out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket().max_tokens(), 2u);
  clock_.advance(std::chrono::seconds(5));
  out = report(s, "api", {{k, 0, 10}}, 10);
  EXPECT_EQ(out.bucket_action(0).quota_assignment_action().rate_limit_strategy().token_bucket().max_tokens(), 2u)
      << "t, heard 5 s ago, reports every 10 s: still a sharer";
}

TEST_F(RlqsShares, ASmallChangeInDemandKeepsTheBucketSent) {
  rlqs_stream_state a{1, {}};
  rlqs_stream_state b{2, {}};
  rlqs_stream_state light{3, {}};
  report(a, "api", {{k_, 3, 27}});
  report(b, "api", {{k_, 3, 27}});
  report(light, "api", {{k_, 2, 0}});  // wants 2.5 a second: the other two 3.75 each
  const token_bucket before = bucket_of(report(a, "api", {{k_, 3, 27}}));
  EXPECT_EQ(before, (token_bucket{37, 15, 4}));
  report(light, "api", {{k_, 2, 0}}, 1);
  clock_.advance(std::chrono::seconds(1));
  report(light, "api", {{k_, 11, 0}}, 5);  // 2.2 a second: 3.625 each, 3% less
  EXPECT_EQ(bucket_of(report(a, "api", {{k_, 3, 27}})), before) << "Envoy would start a new bucket full";
  report(light, "api", {{k_, 4, 0}});  // 4 a second, 5 with room to grow: over a third, so a third each
  EXPECT_EQ(bucket_of(report(a, "api", {{k_, 3, 27}})), (token_bucket{33, 10, 3}));
}

}  // namespace
