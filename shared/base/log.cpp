// spdlog loggers sharing one stderr sink.
#include "shared/base/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <atomic>
#include <mutex>

namespace smockron::log {
namespace {
std::atomic<spdlog::level::level_enum> g_level{spdlog::level::info};
std::mutex g_mutex;
}  // namespace

std::optional<spdlog::level::level_enum> parse_level(std::string_view text) {
  using spdlog::level::level_enum;
  if (text == "trace") return level_enum::trace;
  if (text == "debug") return level_enum::debug;
  if (text == "info") return level_enum::info;
  if (text == "warn" || text == "warning") return level_enum::warn;
  if (text == "error") return level_enum::err;
  if (text == "critical") return level_enum::critical;
  if (text == "off") return level_enum::off;
  return std::nullopt;
}

void set_level(spdlog::level::level_enum level) {
  g_level = level;
  spdlog::set_level(level);
}

std::shared_ptr<spdlog::logger> get(const std::string& component) {
  std::lock_guard lock(g_mutex);
  if (auto existing = spdlog::get(component)) return existing;
  static auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(component, sink);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  logger->set_level(g_level.load());
  spdlog::register_logger(logger);
  return logger;
}

bool rate_limiter::allow(std::chrono::steady_clock::time_point now, std::uint64_t& suppressed) {
  if (now - window_start_ >= period_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace smockron::log
