// Durations, sizes and rates as written in configuration files.
#include "shared/base/units.hpp"

#include <charconv>
#include <limits>

namespace smockron {
namespace {

// Splits "123abc" into 123 and "abc"; fails on a missing or overflowing number.
bool split_number(std::string_view text, std::uint64_t& value, std::string_view& suffix) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc{} || ptr == begin) return false;
  suffix = std::string_view(ptr, static_cast<std::size_t>(end - ptr));
  return true;
}

struct unit {
  std::string_view name;
  std::int64_t micros;
};
constexpr unit duration_units[] = {
    {"us", 1},         {"ms", 1000},           {"s", 1'000'000},        {"min", 60'000'000},
    {"m", 60'000'000}, {"h", 3'600'000'000LL}, {"d", 86'400'000'000LL},
};

}  // namespace

parse_result<std::chrono::microseconds> parse_duration(std::string_view text) {
  std::uint64_t n = 0;
  std::string_view suffix;
  if (!split_number(text, n, suffix)) {
    return std::string("invalid duration \"") + std::string(text) + "\" (expected e.g. 250ms, 5s, 2min, 1h)";
  }
  if (suffix.empty()) {
    return std::string("duration \"") + std::string(text) + "\" needs a unit (us, ms, s, min, h, d)";
  }
  for (const auto& u : duration_units) {
    if (suffix == u.name) {
      if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max() / u.micros)) {
        return std::string("duration \"") + std::string(text) + "\" is too large";
      }
      return std::chrono::microseconds(static_cast<std::int64_t>(n) * u.micros);
    }
  }
  return std::string("unknown duration unit \"") + std::string(suffix) + "\" in \"" + std::string(text) +
         "\" (use us, ms, s, min, h, d)";
}

parse_result<std::uint64_t> parse_size(std::string_view text) {
  std::uint64_t n = 0;
  std::string_view suffix;
  if (!split_number(text, n, suffix)) {
    return std::string("invalid size \"") + std::string(text) + "\" (expected e.g. 512, 16KiB, 1MiB)";
  }
  struct size_unit {
    std::string_view name;
    std::uint64_t factor;
  };
  static constexpr size_unit units[] = {{"", 1},
                                        {"B", 1},
                                        {"KiB", 1024},
                                        {"MiB", 1024 * 1024},
                                        {"GiB", 1024ULL * 1024 * 1024},
                                        {"KB", 1000},
                                        {"MB", 1000 * 1000},
                                        {"GB", 1000ULL * 1000 * 1000}};
  for (const auto& u : units) {
    if (suffix == u.name) {
      if (n > std::numeric_limits<std::uint64_t>::max() / u.factor) {
        return std::string("size \"") + std::string(text) + "\" is too large";
      }
      return n * u.factor;
    }
  }
  return std::string("unknown size unit \"") + std::string(suffix) + "\" in \"" + std::string(text) +
         "\" (use B, KiB, MiB, GiB)";
}

parse_result<rate> parse_rate(std::string_view text) {
  const auto slash = text.find('/');
  const auto bad = [&] {
    return std::string("invalid rate \"") + std::string(text) + "\" (expected N/s, N/min, N/h, N/d or N/<duration>)";
  };
  if (slash == std::string_view::npos) return bad();
  std::uint64_t count = 0;
  std::string_view rest;
  if (!split_number(text.substr(0, slash), count, rest) || !rest.empty()) return bad();
  if (count == 0) return std::string("rate \"") + std::string(text) + "\" must allow at least one request";
  if (count > 1'000'000'000ULL) return std::string("rate \"") + std::string(text) + "\" is too large";
  std::string_view per = text.substr(slash + 1);
  std::string per_text(per);
  // "N/s" means "N per 1s": a unit alone is a period of one unit.
  if (!per.empty() && (per[0] < '0' || per[0] > '9')) per_text = "1" + per_text;
  auto period = parse_duration(per_text);
  if (auto* err = std::get_if<std::string>(&period)) return bad() + ": " + *err;
  const auto p = std::get<std::chrono::microseconds>(period);
  if (p.count() <= 0) return std::string("rate \"") + std::string(text) + "\" has an empty period";
  return rate{static_cast<std::int64_t>(count), p};
}

std::string format_duration(std::chrono::microseconds d) {
  const std::int64_t us = d.count();
  for (auto it = std::rbegin(duration_units); it != std::rend(duration_units); ++it) {
    if (it->name == "m") continue;
    if (us != 0 && us % it->micros == 0) return std::to_string(us / it->micros) + std::string(it->name);
  }
  return std::to_string(us) + "us";
}

std::string format_rate(const rate& r) {
  std::string period = format_duration(r.period);
  if (period == "1s" || period == "1min" || period == "1h" || period == "1d") period.erase(0, 1);
  return std::to_string(r.count) + "/" + period;
}

}  // namespace smockron
