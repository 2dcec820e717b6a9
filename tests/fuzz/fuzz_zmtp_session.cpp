// The ZMTP session (both roles) on arbitrary bytes: never crashes, never
// consumes more than it was given, and reports the same events and the same
// fault whether the bytes arrive at once or cut into pieces (the first input
// byte chooses the role and the cuts).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_frames.hpp"
#include "shared/protocol/zmtp_session.hpp"
#include "zmtp_log_events.hpp"

using namespace smockron;

namespace {

using fuzz::log_events;

// Feeds `bytes` in pieces of the given sizes (cycled); returns the events,
// the replies and the fault.
std::string run(zmtp::session::role role, std::string_view bytes, const std::vector<std::size_t>& cuts) {
  zmtp::session s(role,
                  {.max_message = 512, .max_skip = role == zmtp::session::role::sub ? 4096u : 0u, .max_frames = 4});
  log_events ev;
  std::string out, pending;
  std::size_t at = 0, i = 0;
  while (at < bytes.size()) {
    const std::size_t n = cuts.empty() ? bytes.size() : std::min(bytes.size() - at, cuts[i++ % cuts.size()]);
    pending.append(bytes.substr(at, n));
    at += n;
    const std::size_t used = s.feed(pending, ev, out);
    FUZZ_CHECK(used <= pending.size());
    pending.erase(0, used);
    if (s.failed()) break;
  }
  return ev.log + "#" + out + "#" + (s.failed() ? std::string(zmtp::to_string(*s.failed())) : "-");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto role = data[0] & 1 ? zmtp::session::role::pub : zmtp::session::role::sub;
  std::vector<std::size_t> cuts = {1u + (data[0] >> 1) % 7, 1u + (data[0] >> 4), 64};
  // The greeting a real peer sends, so that the fuzzer spends its time past it.
  std::string bytes(
      zmtp::session::hello(role == zmtp::session::role::pub ? zmtp::session::role::sub : zmtp::session::role::pub));
  bytes.append(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string whole = run(role, bytes, {});
  FUZZ_CHECK(run(role, bytes, cuts) == whole);
  FUZZ_CHECK(run(role, bytes, {1}) == whole);
  // And with the input taken as the greeting itself.
  (void)run(role, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), cuts);
  return 0;
}
