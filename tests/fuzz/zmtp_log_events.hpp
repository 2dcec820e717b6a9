// What a ZMTP session reports, written down as one string, so that two runs
// (cut differently, or CURVE against plaintext) can be compared.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "shared/protocol/zmtp_session.hpp"

namespace smockron::fuzz {

struct log_events final : zmtp::session_events {
  std::string log;
  void on_ready() override { log += "R;"; }
  void on_message(std::span<const std::string_view> frames, bool truncated) override {
    log += "M" + std::to_string(frames.size()) + (truncated ? "t" : "") + ":";
    for (auto f : frames) log.append(f).append(1, '|');
    log += ';';
  }
  void on_oversized(std::uint64_t bytes) override { log += "O" + std::to_string(bytes) + ";"; }
  void on_subscription(bool sub, std::string_view topic) override {
    log += (sub ? "S" : "C");
    log.append(topic).append(";");
  }
};

}  // namespace smockron::fuzz
