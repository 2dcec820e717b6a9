// HTTP/2 request field sections on arbitrary fields (each name and value one
// length-prefixed frame; the first byte chooses END_STREAM and the size
// bound), as libnghttp2 would hand them over: never crashes; a section
// accepted becomes a head with a method, a target starting with '/' (or
// OPTIONS *), one host field at most, one cookie field at most and no
// connection-specific field; its fields for an HTTP/2 upstream start with
// the pseudo-headers and carry no connection-specific field either.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_frames.hpp"
#include "proxy/codec/h2_fields.hpp"

using namespace smockron::proxy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool end_stream = data[0] & 1;
  const std::size_t max_bytes = (data[0] & 2) ? 200 : 16384;
  const char* p = reinterpret_cast<const char*>(data) + 1;
  std::size_t left = size - 1;
  const auto next = [&]() -> std::string_view {
    if (left == 0) return {};
    const std::size_t n = std::min<std::size_t>(static_cast<std::uint8_t>(*p), left - 1);
    std::string_view out(p + 1, n);
    p += 1 + n;
    left -= 1 + n;
    return out;
  };
  h2::request_fields rf(max_bytes);
  std::size_t bytes = 0;
  for (int i = 0; i < 64 && left > 0; ++i) {
    const std::string_view name = next(), value = next();
    bytes += name.size() + value.size() + 32;
    const bool kept = rf.add(name, value);
    FUZZ_CHECK(kept == (bytes <= max_bytes));
  }
  if (rf.too_large()) return 0;
  http1::request_head head;
  if (!rf.finish(end_stream, head).empty()) return 0;
  FUZZ_CHECK(!head.method.empty());
  FUZZ_CHECK(head.target.starts_with('/') || (head.target == "*" && head.method == "OPTIONS"));
  FUZZ_CHECK(head.headers.count("host") <= 1);
  FUZZ_CHECK(head.headers.count("cookie") <= 1);
  FUZZ_CHECK(head.body != http1::framing::none || end_stream);
  for (const auto& f : head.headers) {
    FUZZ_CHECK(!f.name.starts_with(':'));
    FUZZ_CHECK(!h2::connection_specific(f.name) || f.name == "transfer-encoding");
  }
  http1::forward_info info;
  info.peer_ip = "192.0.2.1";
  std::string arena;
  std::vector<h2::field> up;
  h2::upstream_request_fields(head, info, "http", arena, up);
  bool regular = false;
  for (const auto& f : up) {
    if (f.name.starts_with(':')) FUZZ_CHECK(!regular);
    else regular = true;
    FUZZ_CHECK(!h2::connection_specific(f.name));
  }
  return 0;
}
