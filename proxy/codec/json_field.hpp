// One number out of the start of a JSON request body, without parsing the
// rest: the value of a member of the top-level object (e.g. "max_tokens" of
// an LLM call), for a route's cost estimate. The body may be cut short (only
// its first bytes are read before admission). Pure; fuzzed (fuzz_json_field)
// and compared with a JSON library in tests.
#pragma once

#include <cstdint>
#include <string_view>

namespace smockron::proxy {

struct json_field_result {
  enum class kind : std::uint8_t {
    number,     ///< the member's value is a non-negative integer: `digits`
    not_found,  ///< the object has no such member (or the bytes end before it)
    malformed,  ///< not a JSON object, or the member's value is not a non-negative integer
  };
  kind k = kind::not_found;
  std::string_view digits;  ///< kind::number: its decimal digits (at most 19; more is malformed)
};

/// The member `name` of the top-level object that `body` starts (after
/// optional whitespace). Its first occurrence is taken, as the bytes come.
/// Member names with escapes never match. A value such as 5.0, 1e3 or -1 is
/// malformed (a cost is a count); an integer followed by the end of the
/// bytes is not found (it may go on).
json_field_result json_field(std::string_view body, std::string_view name);

}  // namespace smockron::proxy
