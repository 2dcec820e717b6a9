// The proxy's HTTP/2 server session on arbitrary client bytes (after the
// connection preface), fed in pieces whose size the first byte chooses, as
// reads would bring them: frames, field sections, resets, window updates and
// floods through nghttp2 into the session's callbacks and the request steps
// (every route answered by the proxy itself: tests/proxy/h2/session_fixture.hpp,
// so nothing leaves the process). Never crashes, leaks or trips a sanitizer;
// what the session writes is whole frames, each within the default maximum
// frame size.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_frames.hpp"
#include "tests/proxy/h2/session_fixture.hpp"

using namespace smockron::proxy;

namespace {

// Whether `out` is a run of whole HTTP/2 frames (RFC 9113 4.1) within 16,384 bytes of payload each.
bool whole_frames(std::string_view out) {
  std::size_t at = 0;
  while (at < out.size()) {
    if (out.size() - at < 9) return false;
    const auto b = [&](std::size_t i) { return static_cast<std::uint8_t>(out[at + i]); };
    const std::size_t length = (std::size_t{b(0)} << 16) | (std::size_t{b(1)} << 8) | b(2);
    if (length > 16384 || out.size() - at - 9 < length) return false;
    at += 9 + length;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const std::string_view preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  test::h2_session_fixture f;
  const std::size_t piece = 1 + data[0] % 64 * 16;  // 1 to 1,009 bytes a read
  std::string written = f.exchange(preface);
  for (std::size_t at = 1; at < size && f.session->alive(); at += piece) {
    const std::size_t n = std::min(piece, size - at);
    written += f.exchange({reinterpret_cast<const char*>(data) + at, n});
  }
  FUZZ_CHECK(whole_frames(written));
  return 0;
}
