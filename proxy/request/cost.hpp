// A request's cost, in units of its domain's limits (a route's `cost`): a
// constant, a request field, the request body's size, or a response field
// or trailer. Pure functions: what to charge, and why a cost was not
// charged as read (missing or malformed: cost_default; over cost_max).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proxy/codec/http1.hpp"
#include "proxy/io/conn_io.hpp"
#include "proxy/request/routes.hpp"

namespace smockron::proxy {

/// Why a cost was not charged as read.
enum class cost_fallback : std::uint8_t { none, missing, malformed, over_max };

struct cost_charge {
  std::int64_t units = 1;
  cost_fallback why = cost_fallback::none;
};

/// The charge for a cost field's value (nothing: the field was absent): a
/// decimal integer of at least 0, optional whitespace around it; more than
/// the route's cost_max is charged as cost_max.
cost_charge cost_of_value(const route& r, std::optional<std::string_view> value);

/// The charge for `units` counted by the proxy itself (request_bytes).
cost_charge cost_of_count(const route& r, std::uint64_t units);

/// The cost of a request when it is admitted; nothing when it is known only
/// once the request is done (a response field; the size of a body without a
/// Content-Length), then charged with cost_when_done().
std::optional<cost_charge> cost_at_admission(const route& r, const http1::request_head& req);

/// What a request whose cost is known only from its response reserves at
/// admission: the route's cost_estimate (a constant; a request field read as
/// a cost is; a number in the JSON body, of which `body_prefix` holds the
/// start: at most cost_max, not found or not a count: cost_default, counted),
/// else cost_default. A request_bytes route's body without a length: its
/// cost_estimate, if it has one. Nothing for any other cost.
std::optional<cost_charge> estimate_at_admission(const route& r, const http1::request_head& req,
                                                 std::string_view body_prefix = {});

/// Notes the route's cost field among a response's fields (its head, or its
/// trailers as HTTP/2 carries them) in `o` (response_header costs). Any
/// range of items with `name` and `value` (http1::header_list, h2 fields).
template <class Fields>
void note_cost_fields(const route& r, const Fields& fields, request_outcome& o) {
  for (const auto& f : fields) {
    if (!http1::iequals(f.name, r.cost.field)) continue;
    if (o.cost_field) o.cost_fields_several = true;
    o.cost_field = std::string(f.value);
  }
}
/// The same, from a trailer section kept by the chunked decoder (when the head had none).
void note_cost_trailer(const route& r, std::string_view section, request_outcome& o);

/// True when `bytes` of a body are more than its cost may grow to
/// (o.body_cost_limit): the body is then cut off (o.cost_cut), and the caller
/// refuses the request with refusal_for_cost_cut() (request_steps.hpp).
bool cut_by_cost(request_outcome& o, std::uint64_t bytes);

/// The cost of a request admitted with charge_when_done, now that it is done:
/// its response's cost field (response_header), or the body bytes relayed
/// upstream (request_bytes; a body cut off is charged all that fit).
cost_charge cost_when_done(const route& r, const request_outcome& o);

}  // namespace smockron::proxy
