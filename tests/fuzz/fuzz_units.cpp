// Durations, sizes and rates as written in configuration: parsing never
// crashes, and what parses formats to text that parses to the same value.
#include <cstdint>
#include <string_view>
#include <variant>

#include "fuzz_frames.hpp"
#include "shared/base/units.hpp"

using namespace smockron;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto d = parse_duration(text); std::holds_alternative<std::chrono::microseconds>(d)) {
    const auto v = std::get<std::chrono::microseconds>(d);
    FUZZ_CHECK(v.count() >= 0);
    const auto again = parse_duration(format_duration(v));
    FUZZ_CHECK(std::holds_alternative<std::chrono::microseconds>(again));
    FUZZ_CHECK(std::get<std::chrono::microseconds>(again) == v);
  }
  (void)parse_size(text);
  if (auto r = parse_rate(text); std::holds_alternative<rate>(r)) {
    const auto v = std::get<rate>(r);
    FUZZ_CHECK(v.count > 0 && v.period.count() > 0 && v.interval_us() >= 1);
    const auto again = parse_rate(format_rate(v));
    FUZZ_CHECK(std::holds_alternative<rate>(again));
    FUZZ_CHECK(std::get<rate>(again).interval_us() == v.interval_us());
  }
  return 0;
}
