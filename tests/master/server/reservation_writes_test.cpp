// The reservation book's copy in Redis: what is written, what is deleted,
// and what never reaches Redis (opened and closed between two flushes).
#include "master/server/reservation_writes.hpp"

#include <gtest/gtest.h>

using namespace smockron;
using namespace smockron::master;

namespace {

reservations::reservation one(std::string id, std::uint64_t tag) { return {1, "llm", std::move(id), 1000, 50, 7, tag}; }

}  // namespace

TEST(ReservationWrites, OpenedThenClosedBeforeAFlushWritesNothing) {
  reservation_writes w("m1");
  w.opened(one("a", 1));
  w.closed(one("a", 1));
  std::vector<redis_store::write> batch;
  w.drain(batch, std::chrono::minutes(10));
  EXPECT_TRUE(batch.empty());
}

TEST(ReservationWrites, AWrittenOneIsDeletedWhenItCloses) {
  reservation_writes w("m1");
  w.opened(one("a", 1));
  std::vector<redis_store::write> batch;
  w.drain(batch, std::chrono::minutes(10));
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0].key, reservation_key("m1", "llm", "a", 1));
  EXPECT_EQ(batch[0].value, "1000,50,7");
  EXPECT_FALSE(batch[0].erase);
  EXPECT_EQ(batch[0].ttl_ms, (10 * 60 + 24 * 3600) * 1000) << "reservation_timeout, and a day for a master down";
  EXPECT_EQ(w.pending(), 0u);
  w.closed(one("a", 1));
  batch.clear();
  w.drain(batch, std::chrono::minutes(10));
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0].key, reservation_key("m1", "llm", "a", 1));
  EXPECT_TRUE(batch[0].erase);
}

TEST(ReservationWrites, ARestoredOneClosedIsDeletedAndOthersAreKeptApart) {
  reservation_writes w("m1");
  w.closed(one("r", 9));  // read back at start, never opened in this run
  w.opened(one("a", 1));
  w.opened(one("a", 2));  // the same use twice: two records
  std::vector<redis_store::write> batch;
  w.drain(batch, std::chrono::seconds(1));
  ASSERT_EQ(batch.size(), 3u);
  std::size_t erased = 0, set = 0;
  for (const auto& b : batch) (b.erase ? erased : set) += 1;
  EXPECT_EQ(erased, 1u);
  EXPECT_EQ(set, 2u);
}
