// Parsing of the human units used in configuration: durations ("250ms",
// "5s", "2min", "1h"), sizes ("512", "16KiB", "1MiB") and rates ("10/s",
// "30/10s"). Pure functions; errors are returned as messages, never thrown.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

namespace smockron {

/// Either a value or a human-readable error message.
template <class T>
using parse_result = std::variant<T, std::string>;

/// A rate: `count` requests per `period`.
struct rate {
  std::int64_t count = 0;
  std::chrono::microseconds period{0};

  /// The spacing between requests at this rate (1/rate), in microseconds, rounded down
  /// but never zero.
  std::int64_t interval_us() const {
    const std::int64_t i = period.count() / count;
    return i > 0 ? i : 1;
  }
  friend bool operator==(const rate&, const rate&) = default;
};

/// "250ms", "5s", "2min", "1h", "1d", "100us". A bare number is rejected (unit required).
parse_result<std::chrono::microseconds> parse_duration(std::string_view text);

/// "512", "16KiB", "1MiB", "1GiB", also "16KB"/"1MB" as powers of 1000.
parse_result<std::uint64_t> parse_size(std::string_view text);

/// "10/s", "600/min", "1000/h", "5/d", or "N/<duration>" such as "30/10s".
parse_result<rate> parse_rate(std::string_view text);

/// Formats a duration the way configuration writes it (for /status and logs).
std::string format_duration(std::chrono::microseconds d);

/// Formats a rate as "N/<duration>".
std::string format_rate(const rate& r);

}  // namespace smockron
