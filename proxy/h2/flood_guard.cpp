// HTTP/2 flood limits (see flood_guard.hpp).
#include "proxy/h2/flood_guard.hpp"

#include <algorithm>
#include <chrono>

namespace smockron::proxy::h2 {

token_bucket::token_bucket(std::int64_t burst, std::int64_t rate, steady::time_point now)
    : tokens_(static_cast<double>(burst)),
      burst_(static_cast<double>(burst)),
      rate_(static_cast<double>(rate)),
      last_(now) {}

bool token_bucket::take(steady::time_point now) {
  if (now > last_) {
    tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
    last_ = now;
  }
  if (tokens_ < 1) return false;
  tokens_ -= 1;
  return true;
}

flood_guard::flood_guard(const flood_limits& limits, steady::time_point now)
    : resets_(limits.reset_burst, limits.reset_rate, now), control_(limits.control_burst, limits.control_rate, now) {}

flood flood_guard::received(std::uint8_t type, std::uint8_t flags, std::size_t length, steady::time_point now) {
  const auto control = [&] { return control_.take(now) ? flood::none : flood::control; };
  switch (static_cast<frame_type>(type)) {
    case frame_type::data:
      // An empty DATA frame that does not end the stream carries nothing.
      return length == 0 && (flags & k_flag_end_stream) == 0 ? control() : flood::none;
    case frame_type::rst_stream: return resets_.take(now) ? flood::none : flood::reset;
    case frame_type::window_update:
      // Each DATA frame sent earns the client a WINDOW_UPDATE for the stream and one for the connection.
      if (window_credit_ > 0) {
        --window_credit_;
        return flood::none;
      }
      return control();
    case frame_type::settings:
    case frame_type::ping:
      return (flags & k_flag_ack) != 0 ? flood::none : control();  // an acknowledgement of the server's
    case frame_type::priority: return control();
    default: return flood::none;
  }
}

flood flood_guard::server_reset(std::uint32_t error_code, steady::time_point now) {
  // A stream the server resets costs a reset as one the client resets does: a
  // client that makes the server reset its streams (a WINDOW_UPDATE
  // overflowing a window, a frame on a closed stream: "MadeYouReset",
  // CVE-2025-8671) has each request forwarded and torn down as Rapid Reset
  // does. NO_ERROR ends a stream whose answer is complete: not a reset.
  return error_code == k_no_error || resets_.take(now) ? flood::none : flood::reset;
}

}  // namespace smockron::proxy::h2
