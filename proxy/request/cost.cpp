// A request's cost (see cost.hpp).
#include "proxy/request/cost.hpp"

#include <charconv>

#include "proxy/codec/json_field.hpp"
#include "shared/base/text.hpp"

namespace smockron::proxy {

cost_charge cost_of_count(const route& r, std::uint64_t units) {
  if (units > static_cast<std::uint64_t>(r.cost_max)) return {r.cost_max, cost_fallback::over_max};
  return {static_cast<std::int64_t>(units), cost_fallback::none};
}

cost_charge cost_of_value(const route& r, std::optional<std::string_view> value) {
  if (!value) return {r.cost_default, cost_fallback::missing};
  const std::string_view v = trim_ows(*value);
  // Digits only (no sign, no fraction); a value too long to be a number is over any bound.
  if (v.empty() || v.find_first_not_of("0123456789") != std::string_view::npos) {
    return {r.cost_default, cost_fallback::malformed};
  }
  std::uint64_t units = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), units);
  if (ec == std::errc::result_out_of_range) return {r.cost_max, cost_fallback::over_max};
  (void)end;
  return cost_of_count(r, units);
}

namespace {
// The value of a request field read as a cost: one line, or cost_default.
cost_charge cost_of_request_field(const route& r, std::string_view name, const http1::request_head& req) {
  std::optional<std::string_view> value;
  for (const auto& f : req.headers) {
    if (!http1::iequals(f.name, name)) continue;
    if (value) return {r.cost_default, cost_fallback::malformed};  // which would the backend mean?
    value = f.value;
  }
  return cost_of_value(r, value);
}
}  // namespace

std::optional<cost_charge> cost_at_admission(const route& r, const http1::request_head& req) {
  using kind = config::route_config::cost_source::kind;
  switch (r.cost.type) {
    case kind::constant: return cost_charge{r.cost.units, cost_fallback::none};
    case kind::header: return cost_of_request_field(r, r.cost.field, req);
    case kind::request_bytes:
      if (req.body == http1::framing::none) return cost_of_count(r, 0);
      if (req.body == http1::framing::length) return cost_of_count(r, req.content_length);
      return std::nullopt;  // chunked: counted as it is relayed
    case kind::response_header:
    case kind::json_body: return std::nullopt;
  }
  return std::nullopt;
}

std::optional<cost_charge> estimate_at_admission(const route& r, const http1::request_head& req,
                                                 std::string_view body_prefix) {
  using kind = config::route_config::cost_source::kind;
  if (r.cost.type == kind::request_bytes) {
    // A body without a length (its size is the cost, known once relayed): the route's estimate, if any.
    if (!r.cost_estimate || req.body != http1::framing::chunked) return std::nullopt;
    return cost_charge{r.cost_estimate->units, cost_fallback::none};
  }
  if (!r.cost.after_response()) return std::nullopt;
  if (!r.cost_estimate) return cost_charge{r.cost_default, cost_fallback::none};
  switch (r.cost_estimate->type) {
    case kind::constant: return cost_charge{r.cost_estimate->units, cost_fallback::none};
    case kind::json_body: {
      const json_field_result f = json_field(body_prefix, r.cost_estimate->field);
      if (f.k == json_field_result::kind::number) return cost_of_value(r, f.digits);
      return cost_charge{r.cost_default,
                         f.k == json_field_result::kind::malformed ? cost_fallback::malformed : cost_fallback::missing};
    }
    default: return cost_of_request_field(r, r.cost_estimate->field, req);
  }
}

void note_cost_trailer(const route& r, std::string_view section, request_outcome& o) {
  http1::trailer_fields(section, [&](std::string_view name, std::string_view value) {
    if (!http1::iequals(name, r.cost.field)) return;
    if (o.cost_field) o.cost_fields_several = true;
    o.cost_field = std::string(value);
  });
}

bool cut_by_cost(request_outcome& o, std::uint64_t bytes) {
  if (o.body_cost_limit < 0 || bytes <= static_cast<std::uint64_t>(o.body_cost_limit)) return false;
  o.cost_cut = true;
  return true;
}

cost_charge cost_when_done(const route& r, const request_outcome& o) {
  if (r.cost.type == config::route_config::cost_source::kind::request_bytes) {
    // A body cut off tried to use more than fit: it is charged all that did,
    // however much of it the upstream got before the cut (that depends on
    // how the bytes came in).
    return cost_of_count(r, o.cost_cut ? static_cast<std::uint64_t>(o.body_cost_limit) : o.bytes_in);
  }
  if (o.cost_fields_several) return {r.cost_default, cost_fallback::malformed};
  return cost_of_value(r, o.cost_field);
}

}  // namespace smockron::proxy
