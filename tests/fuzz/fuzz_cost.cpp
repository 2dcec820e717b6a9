// A route's cost read from untrusted bytes: a request head's field, a
// response head's field, a chunked trailer section, and an estimate read
// from the start of a JSON body (json_field). Never crashes, and
// every charge is within [0, cost_max] (cost_default when not read), its
// reason agreeing with it.
#include <cstdint>
#include <string>

#include "fuzz_frames.hpp"
#include "proxy/codec/json_field.hpp"
#include "proxy/request/cost.hpp"

using namespace smockron;
using namespace smockron::proxy;

namespace {
bool sound(const route& r, const cost_charge& c) {
  switch (c.why) {
    case cost_fallback::none: return c.units >= 0 && c.units <= r.cost_max;
    case cost_fallback::over_max: return c.units == r.cost_max;
    case cost_fallback::missing:
    case cost_fallback::malformed: return c.units == r.cost_default;
  }
  return false;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto f = fuzz::frames(data, size);
  if (f.size() < 3) return 0;
  route r;
  r.cost_max = 50'000;
  r.cost_default = 7;
  r.cost.field = "x-cost";
  // A request head: the field as a request's cost.
  r.cost.type = config::route_config::cost_source::kind::header;
  http1::request_head req;
  if (http1::parse_request(f[0], 4096, req).status == http1::parse_status::complete) {
    if (const auto c = cost_at_admission(r, req)) FUZZ_CHECK(sound(r, *c));
  }
  // A response head, then a trailer section: the field as a response's cost.
  r.cost.type = config::route_config::cost_source::kind::response_header;
  request_outcome o;
  http1::response_head res;
  if (http1::parse_response(f[1], 4096, false, res).status == http1::parse_status::complete) {
    note_cost_fields(r, res.headers, o);
  }
  if (!o.cost_field) note_cost_trailer(r, f[2], o);
  FUZZ_CHECK(sound(r, cost_when_done(r, o)));
  FUZZ_CHECK(sound(r, cost_of_value(r, f[2])));
  // An estimate read from the start of a JSON body (any bytes, any member name).
  config::route_config::cost_source estimate;
  estimate.type = config::route_config::cost_source::kind::json_body;
  estimate.field = std::string(f[0].substr(0, 16));
  r.cost_estimate = estimate;
  if (const auto e = estimate_at_admission(r, req, f[2])) FUZZ_CHECK(sound(r, *e));
  const json_field_result j = json_field(f[2], estimate.field);
  if (j.k == json_field_result::kind::number) {
    FUZZ_CHECK(!j.digits.empty() && j.digits.size() <= 19);
    FUZZ_CHECK(j.digits.find_first_not_of("0123456789") == std::string_view::npos);
    FUZZ_CHECK(j.digits.data() >= f[2].data() && j.digits.data() + j.digits.size() <= f[2].data() + f[2].size());
  }
  return 0;
}
