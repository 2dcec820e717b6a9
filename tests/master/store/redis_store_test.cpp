// The Redis store's key and value layout (the I/O itself is tested against a
// real redis-server in integration/test_redis.py).
#include "master/store/redis_store.hpp"

#include <gtest/gtest.h>

using namespace smockron;
using namespace smockron::master;
using namespace std::string_literals;

TEST(RedisStore, KeyIsPrefixDomainNulIdentifier) {
  const std::string k = store_key("api:v1", std::string_view("user\0:x", 7));
  EXPECT_EQ(k, std::string("smockron:api:v1\0user\0:x", 23));
  std::string_view d, id;
  ASSERT_TRUE(split_store_key(k, d, id));
  EXPECT_EQ(d, "api:v1");  // a ':' in the domain is no ambiguity: the first \0 ends it
  EXPECT_EQ(id, std::string_view("user\0:x", 7));
  ASSERT_TRUE(split_store_key(store_key("d", ""), d, id));
  EXPECT_EQ(id, "");
  EXPECT_FALSE(split_store_key("smockron:nodomain", d, id));
  EXPECT_FALSE(split_store_key(std::string("other:d\0i", 9), d, id));
  EXPECT_FALSE(split_store_key(std::string("smockron:\0i", 11), d, id));
}

TEST(RedisStore, ValueRoundTripsAndRejectsGarbage) {
  const rules::state s{{1700000000000000, 1700000000100000}};
  EXPECT_EQ(encode_state(rules::algorithm::sliding_log, s), "sliding-log:1700000000000000,1700000000100000");
  EXPECT_EQ(encode_state(rules::algorithm::gcra, rules::state{{5}}), "gcra:5");
  EXPECT_EQ(encode_state(rules::algorithm::sliding_log, rules::state{}), "sliding-log:");
  for (auto algo : {rules::algorithm::sliding_log, rules::algorithm::gcra}) {
    auto back = decode_state(encode_state(algo, s));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->algo, algo);
    EXPECT_EQ(back->st.times, s.times);
  }
  // Counters and quotas (state::aux) follow a ";"; a value written before them has none.
  const rules::state with_aux{{1700000000000000}, {1699999920000000, 12, 3, 1698796800000000, 77}};
  EXPECT_EQ(encode_state(rules::algorithm::sliding_log, with_aux),
            "sliding-log:1700000000000000;1699999920000000,12,3,1698796800000000,77");
  auto aux_back = decode_state(encode_state(rules::algorithm::sliding_log, with_aux));
  ASSERT_TRUE(aux_back);
  EXPECT_EQ(aux_back->st.times, with_aux.times);
  EXPECT_EQ(aux_back->st.aux, with_aux.aux);
  auto only_aux = decode_state("gcra:;5,6");
  ASSERT_TRUE(only_aux);
  EXPECT_TRUE(only_aux->st.times.empty());
  EXPECT_EQ(only_aux->st.aux, (std::vector<std::int64_t>{5, 6}));
  auto empty = decode_state("sliding-log:");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->st.times.empty());
  // The tier its uses named follows a "|" (written since tiers have their own TTL); none before.
  EXPECT_EQ(encode_state(rules::algorithm::gcra, rules::state{{5}}, "pro"), "gcra:5|pro");
  auto tiered = decode_state(encode_state(rules::algorithm::sliding_log, with_aux, "team.b-2"));
  ASSERT_TRUE(tiered);
  EXPECT_EQ(tiered->tier, "team.b-2");
  EXPECT_EQ(tiered->st.aux, with_aux.aux);
  EXPECT_EQ(decode_state("gcra:5")->tier, "");
  for (const char* bad : {"gcra:5|", "gcra:5|a b", "gcra:5|pro|x", "gcra:x|pro"})
    EXPECT_FALSE(decode_state(bad)) << bad;
  for (const char* bad : {"", "sliding-log", "leaky:1", "gcra:1,", "gcra:,1", "gcra:1;", "gcra:1;x", "gcra:1;2;3",
                          "sliding-log:;1,,2", "gcra:x", "gcra:-5", "sliding-log:2,1", "gcra:99999999999999999999"}) {
    EXPECT_FALSE(decode_state(bad)) << bad;
  }
}

// A reservation's record: the key names its master, the use and a tag, the
// value its time, units and when it was first received; anything else is
// not one.
TEST(RedisStore, AReservationRecordRoundTripsAndRejectsGarbage) {
  const reservation_record r{"m1 tcp://*:10004", "llm", std::string("key\0x", 5), 0x00ab'cdef'0123'4567ULL,
                             1700000000123,      300,   1700000000125000};
  const std::string key = reservation_key(r.owner, r.domain, r.identifier, r.tag);
  EXPECT_EQ(key, std::string("smockron-resv:m1 tcp://*:10004\0llm\0key\0x\0"
                             "00abcdef01234567",
                             57));
  EXPECT_TRUE(key.starts_with(reservation_prefix(r.owner)));
  EXPECT_FALSE(key.starts_with(k_store_prefix)) << "the states' read-back never meets a reservation";
  const std::string value = encode_reservation(r);
  EXPECT_EQ(value, "1700000000123,300,1700000000125000");
  const auto back = decode_reservation(key, value);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->owner, r.owner);
  EXPECT_EQ(back->domain, "llm");
  EXPECT_EQ(back->identifier, std::string("key\0x", 5));  // a \0 in the identifier: the tag is the last field
  EXPECT_EQ(back->tag, r.tag);
  EXPECT_EQ(back->at_ms, r.at_ms);
  EXPECT_EQ(back->units, 300);
  EXPECT_EQ(back->opened_us, r.opened_us);
  for (const std::string bad : {"", "1,2", "1,2,3,4", "1,0,3", "1,-5,3", "a,2,3", "1,,3", "1,2,3 "}) {
    EXPECT_FALSE(decode_reservation(key, bad)) << bad;
  }
  EXPECT_FALSE(decode_reservation(store_key("llm", "key"), value)) << "a state's key";
  const auto bad_key = [](std::string_view rest) { return "smockron-resv:m\0"s + std::string(rest); };
  EXPECT_FALSE(decode_reservation(bad_key("llm\0key\0"s + "123"), value)) << "a short tag";
  EXPECT_FALSE(decode_reservation(bad_key("\0key\0"s + "00abcdef01234567"), value)) << "no domain";
  EXPECT_FALSE(decode_reservation(bad_key("llm\0key\0"s + "00abcdef0123456z"), value));
  EXPECT_FALSE(decode_reservation("smockron-resv:no-owner-end", value));
  EXPECT_TRUE(decode_reservation(bad_key("llm\0key\0"s + "00abcdef01234567"), value));
}
