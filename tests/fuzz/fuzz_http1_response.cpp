// Response heads: parsing never crashes; a head that parses is written to the
// client as a head that parses again with the same status and the framing the
// proxy chose.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_frames.hpp"
#include "proxy/codec/http1.hpp"

using namespace smockron::proxy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool head_request = data[0] & 1;
  const unsigned client_version = (data[0] & 2) ? 10 : 11;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  http1::response_head res;
  const auto r = http1::parse_response(bytes, 4096, head_request, res);
  if (r.status != http1::parse_status::complete) return 0;
  FUZZ_CHECK(res.size <= bytes.size() && res.status >= 100 && res.status <= 999);
  // The framing the proxy would use towards this client.
  http1::framing to_client = res.body;
  if (client_version == 10 && to_client == http1::framing::chunked) to_client = http1::framing::until_close;
  if (client_version == 11 && to_client == http1::framing::until_close) to_client = http1::framing::chunked;
  std::string out;
  http1::write_response_head(out, res, client_version, to_client, to_client != http1::framing::until_close, false);
  http1::response_head again;
  const auto back = http1::parse_response(out, out.size() + 1, head_request, again);
  FUZZ_CHECK(back.status == http1::parse_status::complete);
  FUZZ_CHECK(again.status == res.status && again.size == out.size());
  if (!head_request && res.status >= 200 && res.status != 204 && res.status != 304) {
    FUZZ_CHECK(again.body == to_client);
    FUZZ_CHECK(to_client != http1::framing::length || again.content_length == res.content_length);
  }
  return 0;
}
