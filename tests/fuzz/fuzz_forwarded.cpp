// RFC 7239 Forwarded values from trusted proxies on arbitrary bytes: never
// crashes; the `for=` value found is a piece of its element; an address it
// yields is one that its own text form (as this hop writes it) yields again;
// and the client walked from a whole header is the peer or one of the
// header's addresses, never an invented one.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_frames.hpp"
#include "proxy/codec/http1.hpp"
#include "proxy/identify/identify.hpp"

using namespace smockron;
using namespace smockron::proxy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<ip_address> named;
  for (std::size_t start = 0; start <= in.size();) {
    const auto comma = in.find(',', start);
    const auto element = in.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (const auto v = forwarded_for(element)) {
      FUZZ_CHECK(v->data() >= element.data() && v->data() + v->size() <= element.data() + element.size());
      if (const auto a = forwarded_node_address(*v)) {
        named.push_back(*a);
        const std::string text = format_ip(*a);
        const std::string again = text.find(':') != std::string::npos ? "\"[" + text + "]\"" : text;
        FUZZ_CHECK(forwarded_node_address(again) == a);
      }
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  // The whole input as a Forwarded header from a trusted peer (one field line: no line ends in it).
  if (in.find_first_of("\r\n") != std::string_view::npos) return 0;
  std::string head = "GET / HTTP/1.1\r\nHost: a\r\nForwarded: ";
  head.append(in);
  head.append("\r\n\r\n");
  http1::request_head req;
  if (http1::parse_request(head, head.size() + 1, req).status != http1::parse_status::complete) return 0;
  const ip_address peer = *parse_ip("10.0.0.1");
  const std::vector<cidr> trusted{*parse_cidr("10.0.0.0/8")};
  const ip_address client = client_address(req.headers, peer, trusted, real_ip_header::forwarded);
  bool known = client == peer;
  for (const auto& a : named) known = known || a == client;
  FUZZ_CHECK(known);
  return 0;
}
