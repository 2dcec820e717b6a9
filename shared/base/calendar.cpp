// Quota windows (see calendar.hpp).
#include "shared/base/calendar.hpp"

#include <chrono>

namespace smockron::calendar {
namespace {

constexpr std::int64_t k_day_us = 86'400'000'000;

std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

}  // namespace

std::int64_t window_start_us(const window_spec& w, std::int64_t t_us) {
  using namespace std::chrono;
  if (w.per == period::fixed) return floor_div(t_us + w.offset_us, w.length_us) * w.length_us - w.offset_us;
  const std::int64_t day = floor_div(t_us + w.offset_us, k_day_us);
  std::int64_t first = day;
  if (w.per == period::week) first = day - (((day + 3) % 7) + 7) % 7;  // 1970-01-01 was a Thursday
  if (w.per == period::month) {
    const year_month_day ymd{sys_days{days{day}}};
    first = sys_days{ymd.year() / ymd.month() / 1}.time_since_epoch().count();
  }
  return first * k_day_us - w.offset_us;
}

std::int64_t window_end_us(const window_spec& w, std::int64_t t_us) {
  using namespace std::chrono;
  const std::int64_t start = window_start_us(w, t_us);
  switch (w.per) {
    case period::fixed: return start + w.length_us;
    case period::day: return start + k_day_us;
    case period::week: return start + 7 * k_day_us;
    case period::month: {
      const std::int64_t day = floor_div(start + w.offset_us, k_day_us);
      const year_month_day next = year_month_day{sys_days{days{day}}} + months{1};
      return sys_days{next}.time_since_epoch().count() * k_day_us - w.offset_us;
    }
  }
  return start + k_day_us;
}

}  // namespace smockron::calendar
