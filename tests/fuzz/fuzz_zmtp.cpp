// ZMTP 3.0 framing on arbitrary bytes: the greeting check, frame parsing (in
// arbitrary splits: a frame parsed from a prefix is the frame parsed from the
// whole) and command parsing never crash or read out of bounds, and frames
// round-trip through append_frame.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_frames.hpp"
#include "shared/protocol/zmtp.hpp"

using namespace smockron;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::string detail;
  (void)zmtp::check_greeting(bytes, detail);
  (void)zmtp::printable(bytes);
  std::string_view rest = bytes;
  while (!rest.empty()) {
    zmtp::frame f;
    const auto st = zmtp::next_frame(rest, 1 << 16, f);
    if (st != zmtp::frame_status::ok) break;
    FUZZ_CHECK(f.size > 0 && f.size <= rest.size() && f.body.size() < f.size);
    // Resumable: any cut before the frame's end asks for more bytes.
    zmtp::frame cut;
    FUZZ_CHECK(zmtp::next_frame(rest.substr(0, f.size - 1), 1 << 16, cut) == zmtp::frame_status::need_more);
    FUZZ_CHECK(f.body.data() >= rest.data() && f.body.data() + f.body.size() <= rest.data() + rest.size());
    std::string again;
    zmtp::append_frame(again, f.flags & (zmtp::flag_more | zmtp::flag_command), f.body);
    zmtp::frame g;
    FUZZ_CHECK(zmtp::next_frame(again, 1 << 16, g) == zmtp::frame_status::ok && g.body == f.body);
    if (f.command()) {
      if (auto cmd = zmtp::split_command(f.body)) {
        if (cmd->first == "READY") (void)zmtp::ready_socket_type(cmd->second);
        if (cmd->first == "PING") (void)zmtp::pong_for(cmd->second);
      }
    }
    rest.remove_prefix(f.size);
  }
  return 0;
}
