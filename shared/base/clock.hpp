// Injected time for both daemons: wall time (epoch ms / µs, used on the wire
// and by the rule engine) and steady time (timers). Tests use manual_clock.
#pragma once

#include <time.h>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace smockron {

/// Source of time. Implementations must be thread-safe.
class clock {
public:
  virtual ~clock() = default;
  /// Wall-clock time in microseconds since 1970-01-01 UTC.
  virtual std::int64_t wall_us() const = 0;
  /// Monotonic time for timers and latency measurement.
  virtual std::chrono::steady_clock::time_point steady_now() const = 0;
  /// Monotonic time at a few milliseconds' resolution, cheaper to read: for
  /// deadlines of seconds, set on every read and write.
  virtual std::chrono::steady_clock::time_point coarse_steady_now() const { return steady_now(); }

  /// Wall-clock time in milliseconds since the epoch (the wire unit).
  std::int64_t wall_ms() const { return wall_us() / 1000; }
};

/// The real clocks of the operating system.
class system_clock final : public clock {
public:
  std::int64_t wall_us() const override {
    using namespace std::chrono;
    return duration_cast<microseconds>(system_clock_t::now().time_since_epoch()).count();
  }
  std::chrono::steady_clock::time_point steady_now() const override { return std::chrono::steady_clock::now(); }
  /// CLOCK_MONOTONIC_COARSE: the monotonic clock as of the last timer tick
  /// (1-4 ms behind), read without the vDSO's TSC arithmetic. The same base as
  /// steady_clock (CLOCK_MONOTONIC), so the two compare.
  std::chrono::steady_clock::time_point coarse_steady_now() const override {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return std::chrono::steady_clock::time_point(std::chrono::seconds(ts.tv_sec) +
                                                 std::chrono::nanoseconds(ts.tv_nsec));
  }

  /// A process-wide instance.
  static const system_clock& instance() {
    static const system_clock c;
    return c;
  }

private:
  using system_clock_t = std::chrono::system_clock;
};

/// A clock that only moves when told to; wall and steady time advance together.
class manual_clock final : public clock {
public:
  explicit manual_clock(std::int64_t start_wall_us = 1'700'000'000'000'000) : wall_us_(start_wall_us) {}

  std::int64_t wall_us() const override { return wall_us_.load(); }
  std::chrono::steady_clock::time_point steady_now() const override {
    return std::chrono::steady_clock::time_point(std::chrono::microseconds(steady_us_.load()));
  }
  void advance(std::chrono::microseconds d) {
    wall_us_ += d.count();
    steady_us_ += d.count();
  }
  void set_wall_ms(std::int64_t ms) { wall_us_ = ms * 1000; }

private:
  std::atomic<std::int64_t> wall_us_;
  std::atomic<std::int64_t> steady_us_{1'000'000};
};

}  // namespace smockron
