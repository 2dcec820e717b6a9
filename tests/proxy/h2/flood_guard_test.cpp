// The HTTP/2 flood limits, frame by frame, with an injected time.
#include "proxy/h2/flood_guard.hpp"

#include <gtest/gtest.h>

namespace smockron::proxy::h2 {
namespace {

constexpr auto u8 = [](frame_type t) { return static_cast<std::uint8_t>(t); };
constexpr std::uint32_t k_flow_control_error = 0x3, k_cancel = 0x8, k_refused_stream = 0x7;

steady::time_point at(double seconds) {
  return steady::time_point{} + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(seconds));
}

TEST(TokenBucket, BurstThenRate) {
  token_bucket b(3, 2, at(0));
  EXPECT_TRUE(b.take(at(0)));
  EXPECT_TRUE(b.take(at(0)));
  EXPECT_TRUE(b.take(at(0)));
  EXPECT_FALSE(b.take(at(0)));
  EXPECT_FALSE(b.take(at(0.25)));  // half a token
  EXPECT_TRUE(b.take(at(0.5)));    // one token back at 2/s
  EXPECT_FALSE(b.take(at(0.5)));
  EXPECT_TRUE(b.take(at(100)));  // refilled to the burst, no more
  EXPECT_TRUE(b.take(at(100)));
  EXPECT_TRUE(b.take(at(100)));
  EXPECT_FALSE(b.take(at(100)));
  EXPECT_FALSE(b.take(at(99)));  // time going back gives nothing
}

// Which frames cost a token of which bound: each row sent past a burst of one.
TEST(FloodGuard, WhatEachReceivedFrameCosts) {
  struct row {
    frame_type type;
    std::uint8_t flags;
    std::size_t length;
    flood second;  ///< what the same frame a second time crosses (burst 1, rate 0)
  };
  const row rows[] = {
      {frame_type::rst_stream, 0, 4, flood::reset},
      {frame_type::settings, 0, 6, flood::control},
      {frame_type::settings, k_flag_ack, 0, flood::none},  // an acknowledgement of the server's SETTINGS
      {frame_type::ping, 0, 8, flood::control},
      {frame_type::ping, k_flag_ack, 8, flood::none},
      {frame_type::priority, 0, 5, flood::control},
      {frame_type::priority, k_flag_ack, 5, flood::control},  // no ACK flag for PRIORITY: still a cost
      {frame_type::window_update, 0, 4, flood::control},      // unearned
      {frame_type::data, 0, 0, flood::control},               // empty, not ending the stream
      {frame_type::data, k_flag_end_stream, 0, flood::none},  // ends the request body
      {frame_type::data, 0, 100, flood::none},
      {frame_type::headers, 0, 20, flood::none},
      {frame_type::continuation, 0, 20, flood::none},  // bounded by http2_max_continuations instead
      {frame_type::goaway, 0, 8, flood::none},
  };
  for (const auto& r : rows) {
    flood_guard g({1, 0, 1, 0}, at(0));
    EXPECT_EQ(g.received(u8(r.type), r.flags, r.length, at(0)), flood::none) << int(u8(r.type));
    EXPECT_EQ(g.received(u8(r.type), r.flags, r.length, at(0)), r.second) << int(u8(r.type)) << " " << int(r.flags);
  }
}

TEST(FloodGuard, WindowUpdatesEarnedByData) {
  flood_guard g({10, 0, 1, 0}, at(0));
  // Two DATA frames sent earn four WINDOW_UPDATEs (stream and connection each).
  g.data_sent();
  g.data_sent();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.received(u8(frame_type::window_update), 0, 4, at(0)), flood::none) << i;
  EXPECT_EQ(g.received(u8(frame_type::window_update), 0, 4, at(0)), flood::none);  // the control burst
  EXPECT_EQ(g.received(u8(frame_type::window_update), 0, 4, at(0)), flood::control);
}

// "MadeYouReset" (CVE-2025-8671): streams the server resets because of what
// the client sent cost resets, as the client's own RST_STREAMs do.
TEST(FloodGuard, ServerResetsCountAsResets) {
  flood_guard g({3, 0, 10, 0}, at(0));
  EXPECT_EQ(g.server_reset(k_flow_control_error, at(0)), flood::none);
  EXPECT_EQ(g.server_reset(k_cancel, at(0)), flood::none);
  EXPECT_EQ(g.server_reset(k_no_error, at(0)), flood::none);                    // a complete answer: free
  EXPECT_EQ(g.received(u8(frame_type::rst_stream), 0, 4, at(0)), flood::none);  // the third reset, the client's
  EXPECT_EQ(g.server_reset(k_refused_stream, at(0)), flood::reset);
  EXPECT_EQ(g.server_reset(k_no_error, at(0)), flood::none);
}

TEST(FloodGuard, ResetsAndControlFramesHaveTheirOwnBuckets) {
  flood_guard g({1, 0, 1, 0}, at(0));
  EXPECT_EQ(g.received(u8(frame_type::rst_stream), 0, 4, at(0)), flood::none);
  EXPECT_EQ(g.received(u8(frame_type::ping), 0, 8, at(0)), flood::none);
  EXPECT_EQ(g.received(u8(frame_type::ping), 0, 8, at(0)), flood::control);
  EXPECT_EQ(g.received(u8(frame_type::rst_stream), 0, 4, at(0)), flood::reset);
}

TEST(FloodGuard, RatesRefill) {
  flood_guard g({1, 10, 1, 10}, at(0));
  EXPECT_EQ(g.received(u8(frame_type::rst_stream), 0, 4, at(0)), flood::none);
  EXPECT_EQ(g.received(u8(frame_type::rst_stream), 0, 4, at(0.05)), flood::reset);
  EXPECT_EQ(g.received(u8(frame_type::rst_stream), 0, 4, at(0.2)), flood::none);
}

}  // namespace
}  // namespace smockron::proxy::h2
