// Windows of a quota: a calendar day, week (Monday to Sunday) or month, in
// UTC or shifted by a fixed offset, or a fixed length aligned to the epoch.
// Pure functions over µs since the epoch, shared by the master's rules and
// the gatekeepers' rate-limit fields.
#pragma once

#include <cstdint>

namespace smockron::calendar {

enum class period : std::uint8_t { day, week, month, fixed };

struct window_spec {
  period per = period::month;
  std::int64_t offset_us = 0;  ///< local time = UTC + offset
  std::int64_t length_us = 0;  ///< period::fixed: the window's length (> 0)
};

/// Start of the window of `w` that holds `t_us`.
std::int64_t window_start_us(const window_spec& w, std::int64_t t_us);
/// Start of the window after the one that holds `t_us`.
std::int64_t window_end_us(const window_spec& w, std::int64_t t_us);

}  // namespace smockron::calendar
