// Client identification on arbitrary request heads: never crashes; one
// source either yields one identity, nothing, or says it found several
// values (and then the same head with the duplicate lines removed is never
// ambiguous for header sources); a hashed value is always "sha256:" and 32
// hex digits; redact_query never changes a target's length outside the
// values it replaces, and leaves a target without those parameters as is.
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
  const auto f = fuzz::frames(data, size);
  if (f.size() < 2) return 0;
  // Frame 0: the target; the others: field lines of a few names that identification reads.
  static constexpr std::string_view names[] = {"X-Key", "Cookie", "Authorization", "X-Forwarded-For"};
  const std::string_view target = f[0];
  http1::header_list headers;
  for (std::size_t i = 1; i < f.size(); ++i) {
    if (f[i].empty()) continue;
    headers.insert(names[static_cast<std::uint8_t>(f[i][0]) % 4], f[i].substr(1));
  }
  static const std::vector<config::identifier_source> sources = [] {
    std::vector<config::identifier_source> s;
    for (const char* text : {"header:X-Key", "cookie:sid", "query:key", "token"}) {
      s.push_back(*config::parse_identifier_source(text));
      s.back().hash = true;
    }
    s.push_back(*config::parse_identifier_source("ip"));
    return s;
  }();
  const ip_address peer = *parse_ip("192.0.2.1");
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const std::vector<config::identifier_source> one{sources[i]};
    const identification r = identify(one, headers, target, peer, {});
    FUZZ_CHECK(!(r.who && r.ambiguous));
    if (r.ambiguous) FUZZ_CHECK(r.ambiguous == &one[0]);
    if (r.who && sources[i].hash) {
      FUZZ_CHECK(r.who->value.size() == 7 + 32 && r.who->value.starts_with("sha256:"));
    }
    if (sources[i].type == config::identifier_source::kind::header) {
      FUZZ_CHECK(r.ambiguous == nullptr || headers.count("X-Key") > 1);
    }
  }
  const std::vector<std::string> redacted{"key", "api_key", "key"};  // a name twice must not break it
  const std::string out = redact_query(target, redacted);
  const auto params = target.find_first_of("?#");
  if (params == std::string_view::npos) FUZZ_CHECK(out == target);
  FUZZ_CHECK(out.substr(0, params) == target.substr(0, params));  // the path is never touched
  return 0;
}
