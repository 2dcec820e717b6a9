// Path normalization on arbitrary bytes (the first byte chooses the
// options), and the segment parameters routes do not see: never crashes; what it returns is normal (already_normal says
// so and normalizing it again changes nothing), starts with '/', and holds no dot-segment, no "//" (with merge_slashes)
// and no backslash.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_frames.hpp"
#include "proxy/codec/path.hpp"

using namespace smockron::proxy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  {
    // Segment parameters: none left, every separator kept, stripping twice is stripping once.
    const std::string_view raw(reinterpret_cast<const char*>(data), size);
    const std::string stripped = path::strip_parameters(raw);
    FUZZ_CHECK(stripped.find(';') == std::string::npos);
    FUZZ_CHECK(std::count(stripped.begin(), stripped.end(), '/') == std::count(raw.begin(), raw.end(), '/'));
    FUZZ_CHECK(path::strip_parameters(stripped) == stripped);
    FUZZ_CHECK(!path::hides_dot_segment(stripped));  // no parameters left to hide one
  }
  path::options o;
  o.merge_slashes = data[0] & 1;
  o.slashes = static_cast<path::escaped_slash>((data[0] >> 1) % 3);
  std::string p = "/";
  p.append(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string_view why;
  const std::string out = path::normalize(p, o, why);
  if (!why.empty()) {
    FUZZ_CHECK(out.empty());
    return 0;
  }
  FUZZ_CHECK(!out.empty() && out.front() == '/');
  std::string_view again_why;
  const std::string again = path::normalize(out, o, again_why);
  FUZZ_CHECK(again_why.empty() && again == out);  // idempotent
  if (o.slashes != path::escaped_slash::unescape) {
    FUZZ_CHECK(out.find('\\') == std::string::npos);
  }
  FUZZ_CHECK(out.find("/./") == std::string::npos && out.find("/../") == std::string::npos);
  if (o.merge_slashes) FUZZ_CHECK(out.find("//") == std::string::npos);
  return 0;
}
