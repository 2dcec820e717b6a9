// The injected clock's real implementation: the coarse steady time is the
// steady clock's own base, read at a tick's resolution (never ahead of it).
#include "shared/base/clock.hpp"

#include <gtest/gtest.h>

using namespace smockron;

TEST(SystemClock, CoarseSteadyTimeIsTheSteadyClockAtATicksResolution) {
  const auto& c = system_clock::instance();
  const auto before = c.steady_now();
  const auto coarse = c.coarse_steady_now();
  const auto after = c.steady_now();
  EXPECT_LE(coarse, after) << "never ahead of the fine clock";
  // Behind it by at most a timer tick (1-10 ms); a second is a bound no kernel comes near.
  EXPECT_GT(coarse, before - std::chrono::seconds(1)) << "the same base (CLOCK_MONOTONIC)";
}

TEST(ManualClock, CoarseIsTheManualTime) {
  manual_clock c;
  c.advance(std::chrono::seconds(3));
  EXPECT_EQ(c.coarse_steady_now(), c.steady_now());
}
