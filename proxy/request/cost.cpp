// A request's cost (see cost.hpp).
#include "proxy/request/cost.hpp"

#include <charconv>

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

std::optional<cost_charge> cost_at_admission(const route& r, const http1::request_head& req) {
  using kind = config::route_config::cost_source::kind;
  switch (r.cost.type) {
    case kind::constant: return cost_charge{r.cost.units, cost_fallback::none};
    case kind::header: {
      // One line; several lines of the field are malformed (which would the backend mean?).
      request_outcome seen;
      note_cost_fields(r, req.headers, seen);
      if (seen.cost_fields_several) return cost_charge{r.cost_default, cost_fallback::malformed};
      return cost_of_value(r, seen.cost_field);
    }
    case kind::request_bytes:
      if (req.body == http1::framing::none) return cost_of_count(r, 0);
      if (req.body == http1::framing::length) return cost_of_count(r, req.content_length);
      return std::nullopt;  // chunked: counted as it is relayed
    case kind::response_header: return std::nullopt;
  }
  return std::nullopt;
}

void note_cost_trailer(const route& r, std::string_view section, request_outcome& o) {
  http1::trailer_fields(section, [&](std::string_view name, std::string_view value) {
    if (!http1::iequals(name, r.cost.field)) return;
    if (o.cost_field) o.cost_fields_several = true;
    o.cost_field = std::string(value);
  });
}

cost_charge cost_when_done(const route& r, const request_outcome& o) {
  if (r.cost.type == config::route_config::cost_source::kind::request_bytes) return cost_of_count(r, o.bytes_in);
  if (o.cost_fields_several) return {r.cost_default, cost_fallback::malformed};
  return cost_of_value(r, o.cost_field);
}

}  // namespace smockron::proxy
