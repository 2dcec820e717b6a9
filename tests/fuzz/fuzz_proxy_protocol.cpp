// PROXY protocol headers (v1 and v2) on arbitrary bytes: never crashes; a
// complete header consumed no more than it was given and parses the same
// alone; every shorter prefix of it asks for more rather than failing, so a
// header split across reads is never refused; an address comes only from
// a PROXY command.
#include <cstdint>
#include <string_view>

#include "fuzz_frames.hpp"
#include "proxy/codec/proxy_protocol.hpp"

using namespace smockron::proxy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t max_bytes = 536;  // v2 header + the TLVs a balancer adds
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto r = proxy_protocol::parse(in, max_bytes);
  if (r.state == proxy_protocol::status::invalid) FUZZ_CHECK(!r.reason.empty());
  if (r.state != proxy_protocol::status::complete) return 0;
  FUZZ_CHECK(r.consumed > 0 && r.consumed <= in.size() && r.consumed <= max_bytes);
  const auto alone = proxy_protocol::parse(in.substr(0, r.consumed), max_bytes);
  FUZZ_CHECK(alone.state == proxy_protocol::status::complete && alone.consumed == r.consumed &&
             alone.source == r.source && alone.source_port == r.source_port);
  for (std::size_t n = 0; n < r.consumed; ++n) {
    FUZZ_CHECK(proxy_protocol::parse(in.substr(0, n), max_bytes).state == proxy_protocol::status::incomplete);
  }
  return 0;
}
