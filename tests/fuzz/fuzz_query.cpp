// The UDP query protocol's request parser on arbitrary datagrams: never
// crashes; what it accepts is within its bounds, and the request it read,
// written out again, reads back the same.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_frames.hpp"
#include "master/core/query.hpp"

using namespace smockron;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view d(reinterpret_cast<const char*>(data), size);
  const auto r = query::parse(d);
  if (!r.req) return 0;
  const query::request& q = *r.req;
  FUZZ_CHECK(size <= query::max_datagram);
  std::string again = q.id ? std::to_string(*q.id) + " " : std::string();
  switch (q.cmd) {
    case query::command::get_size: again += "get_size"; break;
    case query::command::over_limit: again += "over_limit "; break;
    case query::command::get_stats: again += "get_stats "; break;
  }
  if (q.cmd != query::command::get_size) {
    FUZZ_CHECK(!q.domain.empty() && q.domain.size() <= 255 && q.domain.find(' ') == std::string_view::npos);
    FUZZ_CHECK(!q.identifier.empty() && q.identifier.size() <= 1024);
    for (const char c : std::string(q.domain) + std::string(q.identifier)) {
      FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
    }
    again += std::string(q.domain) + " " + std::string(q.identifier);
  }
  const auto back = query::parse(again);
  FUZZ_CHECK(back.req && back.req->id == q.id && back.req->cmd == q.cmd && back.req->domain == q.domain &&
             back.req->identifier == q.identifier);
  // The response helpers take any such request.
  FUZZ_CHECK(!query::format(q.id, query::stats_answer{}, q.domain, q.identifier).empty());
  return 0;
}
