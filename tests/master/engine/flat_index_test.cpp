// The limiter's open-addressing index: against std::unordered_map under a
// long random sequence of inserts, finds and erasures (small keyspace, so
// probe runs form, wrap around the table's end and are shifted back by
// erasures), entries that never move, and growth.
#include "master/engine/flat_index.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>

using smockron::master::flat_index;

namespace {
struct item {
  std::string key;
  int value = 0;
};
}  // namespace

TEST(FlatIndex, AgreesWithAStandardMapUnderRandomOperations) {
  flat_index<item> index;
  std::unordered_map<std::string, item*> ref;  // the entry each key had when inserted
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> key_of(0, 1999), op(0, 9);
  for (int step = 0; step < 200'000; ++step) {
    const std::string key = "id-" + std::to_string(key_of(rng));
    item* found = index.find(key);
    const auto it = ref.find(key);
    ASSERT_EQ(found, it == ref.end() ? nullptr : it->second) << "step " << step << " key " << key;
    if (found) {
      ASSERT_EQ(found->value, std::stoi(key.substr(3)));
    }
    if (op(rng) < 5) {
      if (!found) {
        item* e = index.insert(key);
        ASSERT_EQ(e->key, key);
        e->value = std::stoi(key.substr(3));
        ref[key] = e;
      }
    } else if (found) {
      index.erase(found);
      ref.erase(it);
    }
    ASSERT_EQ(index.size(), ref.size());
  }
  std::unordered_set<std::string> seen;
  index.for_each([&](item& e) { EXPECT_TRUE(seen.insert(e.key).second); });
  EXPECT_EQ(seen.size(), ref.size());
  for (const auto& [key, e] : ref) EXPECT_EQ(index.find(key), e) << "entries never move";
}

TEST(FlatIndex, GrowsAndKeepsEveryEntryWhereItWas) {
  flat_index<item> index;
  std::vector<item*> made;
  for (int i = 0; i < 100'000; ++i) made.push_back(index.insert("k" + std::to_string(i)));
  for (int i = 0; i < 100'000; ++i) ASSERT_EQ(index.find("k" + std::to_string(i)), made[static_cast<std::size_t>(i)]);
  EXPECT_EQ(index.find("k100000"), nullptr);
  for (int i = 0; i < 100'000; i += 2) index.erase(made[static_cast<std::size_t>(i)]);
  EXPECT_EQ(index.size(), 50'000u);
  for (int i = 1; i < 100'000; i += 2)
    ASSERT_EQ(index.find("k" + std::to_string(i)), made[static_cast<std::size_t>(i)]);
  EXPECT_EQ(index.find("k0"), nullptr);
  flat_index<item> empty;
  EXPECT_EQ(empty.find("x"), nullptr);
}
