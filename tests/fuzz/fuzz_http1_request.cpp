// Request heads: parsing never crashes; parsing in two steps (resumable scan)
// decides like parsing at once; a head that parses is forwarded as a head that
// parses again to the same message (method, target, Host, framing, length).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_frames.hpp"
#include "proxy/codec/http1.hpp"

using namespace smockron::proxy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t split = data[0] % (size);  // where the first part of the head ends
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  constexpr std::size_t max_head = 4096;
  http1::request_head once;
  const auto r = http1::parse_request(bytes, max_head, once);

  http1::request_head step;
  std::size_t scanned = 0;
  auto s = http1::parse_request(bytes.substr(0, std::min(split, bytes.size())), max_head, step, scanned);
  if (s.status == http1::parse_status::incomplete) s = http1::parse_request(bytes, max_head, step, scanned);
  FUZZ_CHECK(s.status == r.status);
  if (r.status != http1::parse_status::complete) return 0;
  FUZZ_CHECK(step.size == once.size && once.size <= bytes.size());

  std::string out;
  http1::write_request_head(out, once, {"192.0.2.1", "http", false, false});
  http1::request_head again;
  const auto back = http1::parse_request(out, out.size() + 1, again);
  FUZZ_CHECK(back.status == http1::parse_status::complete);
  FUZZ_CHECK(again.size == out.size());
  FUZZ_CHECK(again.method == once.method && again.target == once.target);
  FUZZ_CHECK(again.body == once.body && again.content_length == once.content_length);
  FUZZ_CHECK(again.host == once.host);
  return 0;
}
