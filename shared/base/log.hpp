// Logging set-up (spdlog): one named logger per component, all sharing one
// stderr sink, plus a rate limiter for logs on the data path.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace smockron::log {

/// Parses "trace", "debug", "info", "warn", "error", "critical", "off".
std::optional<spdlog::level::level_enum> parse_level(std::string_view text);

/// Sets the level of every logger (existing and future).
void set_level(spdlog::level::level_enum level);

/// The logger named `component` ("master", "master.accounting", "proxy.gate", ...).
std::shared_ptr<spdlog::logger> get(const std::string& component);

/// Lets through at most `burst` messages per `period`; counts the rest so the
/// next message that passes can say how many were suppressed. Single-threaded.
class rate_limiter {
public:
  explicit rate_limiter(std::uint32_t burst = 10, std::chrono::steady_clock::duration period = std::chrono::seconds(1))
      : burst_(burst), period_(period) {}

  /// True if a message may be logged now; `suppressed` receives how many were
  /// dropped since the last message that passed.
  bool allow(std::chrono::steady_clock::time_point now, std::uint64_t& suppressed);

private:
  std::uint32_t burst_;
  std::chrono::steady_clock::duration period_;
  std::chrono::steady_clock::time_point window_start_{};
  std::uint32_t in_window_ = 0;
  std::uint64_t suppressed_ = 0;
};

}  // namespace smockron::log
