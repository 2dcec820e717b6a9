// BATCH messages (wire_batch.hpp): golden bytes, records back as messages
// with their topic, and malformed records refused whole.
#include "shared/protocol/wire_batch.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace smockron;
using namespace std::string_literals;

namespace {

std::vector<std::vector<std::string>> records_of(const std::string& records, bool* ok = nullptr) {
  std::vector<std::vector<std::string>> out;
  static const std::string topic = "api\0"s;
  const std::string_view batch[3] = {topic, wire::batch_status, records};
  const bool well_formed = wire::for_each_batch_record(
      std::span<const std::string_view>(batch), [&](auto frames) { out.emplace_back(frames.begin(), frames.end()); });
  if (ok) *ok = well_formed;
  return out;
}

TEST(WireBatch, RecordsComeBackAsMessagesWithTheirTopic) {
  std::string records;
  const std::string_view a[4] = {"ACCEPTED", "client-1", "1700000000000", ""};
  const std::string_view b[5] = {"DELAYED", "client-2", "1700000000000", "1700000000050", "loginfo"};
  ASSERT_TRUE(wire::append_batch_record(records, a));
  ASSERT_TRUE(wire::append_batch_record(records, b));
  // Golden: count, then each frame as a 2-byte big-endian length and its bytes.
  EXPECT_EQ(records.substr(0, 1 + 2 + 8 + 2 + 8), "\x04\x00\x08"s + "ACCEPTED" + "\x00\x08"s + "client-1");
  bool ok = false;
  const auto got = records_of(records, &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], (std::vector<std::string>{"api\0"s, "ACCEPTED", "client-1", "1700000000000", ""}));
  EXPECT_EQ(got[1],
            (std::vector<std::string>{"api\0"s, "DELAYED", "client-2", "1700000000000", "1700000000050", "loginfo"}));
}

TEST(WireBatch, WhatCannotBeARecordIsRefused) {
  std::string records;
  EXPECT_FALSE(wire::append_batch_record(records, {}));
  const std::string big(70'000, 'x');
  const std::string_view over[1] = {big};
  EXPECT_FALSE(wire::append_batch_record(records, over));
  const std::vector<std::string_view> many(16, "f");
  EXPECT_FALSE(wire::append_batch_record(records, many));
  EXPECT_TRUE(records.empty()) << "nothing appended";
}

TEST(WireBatch, MalformedRecordsAreRefusedWhole) {
  std::string good;
  const std::string_view a[2] = {"ACCEPTED", "id"};
  ASSERT_TRUE(wire::append_batch_record(good, a));
  for (const std::string& bad : {""s, "\x00"s, "\x10"s, "\x01\x00"s, "\x01\x00\x05"s + "abc", good + "\x02\x00\x01"s}) {
    bool ok = true;
    EXPECT_TRUE(records_of(bad, &ok).empty()) << "nothing delivered from a malformed batch";
    EXPECT_FALSE(ok);
  }
  const std::string topic = "api\0"s;
  const std::string_view not_batch[3] = {topic, "ACCEPTED", good};
  EXPECT_FALSE(wire::is_batch(not_batch));
}

}  // namespace
