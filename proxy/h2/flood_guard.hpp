// The HTTP/2 flood limits of one client connection, as pure arithmetic over
// the frames that cross it (type, flags, error code; RFC 9113 numbering):
// resets (Rapid Reset, and streams the server resets because of what the
// client sent: "MadeYouReset"), frames that carry no request (SETTINGS,
// PING, PRIORITY, empty DATA, WINDOW_UPDATE beyond what the server's DATA
// earned). Each bound is a token bucket; the session ends the connection
// with GOAWAY(ENHANCE_YOUR_CALM) when a frame crosses one. No I/O, no
// nghttp2: table-tested in tests/proxy/h2/flood_guard_test.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace smockron::proxy::h2 {

using steady = std::chrono::steady_clock;

/// RFC 9113 6: the frame types the guard looks at.
enum class frame_type : std::uint8_t {
  data = 0x0,
  headers = 0x1,
  priority = 0x2,
  rst_stream = 0x3,
  settings = 0x4,
  push_promise = 0x5,
  ping = 0x6,
  goaway = 0x7,
  window_update = 0x8,
  continuation = 0x9,
};
inline constexpr std::uint8_t k_flag_end_stream = 0x1;
inline constexpr std::uint8_t k_flag_ack = 0x1;
inline constexpr std::uint32_t k_no_error = 0x0;

/// `burst` at most, refilled at `rate` per second.
class token_bucket {
public:
  token_bucket(std::int64_t burst, std::int64_t rate, steady::time_point now);
  /// Takes one token; false when none is left.
  bool take(steady::time_point now);

private:
  double tokens_, burst_, rate_;
  steady::time_point last_;
};

/// Which bound a frame crossed.
enum class flood : std::uint8_t { none, reset, control };

struct flood_limits {
  std::int64_t reset_burst, reset_rate;      ///< http2_reset_burst, http2_reset_rate
  std::int64_t control_burst, control_rate;  ///< http2_control_burst, http2_control_rate
};

class flood_guard {
public:
  flood_guard(const flood_limits& limits, steady::time_point now);

  /// A frame from the client (its header: type, flags, payload length).
  flood received(std::uint8_t type, std::uint8_t flags, std::size_t length, steady::time_point now);
  /// The server sent a DATA frame: the client may answer it with two WINDOW_UPDATEs.
  void data_sent() { window_credit_ += 2; }
  /// The server resets a stream (`error_code`), when it decides to: within
  /// the read that caused it, so a burst of such streams ends the connection
  /// before the streams that follow in that read are opened.
  flood server_reset(std::uint32_t error_code, steady::time_point now);

private:
  token_bucket resets_, control_;
  std::uint64_t window_credit_ = 0;  ///< WINDOW_UPDATEs the server's DATA frames earned
};

}  // namespace smockron::proxy::h2
