// One member's number from the start of a JSON object (see json_field.hpp).
#include "proxy/codec/json_field.hpp"

namespace smockron::proxy {
namespace {

using kind = json_field_result::kind;

bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool digit(char c) { return c >= '0' && c <= '9'; }

// A cursor over the bytes; every step is bounds-checked (the bytes may end anywhere).
struct cursor {
  std::string_view s;
  std::size_t i = 0;
  bool end() const { return i >= s.size(); }
  char peek() const { return s[i]; }
  void skip_space() {
    while (!end() && space(s[i])) ++i;
  }
};

// A string starting at the opening quote: false when it does not end in the
// bytes. `escaped`: it held a backslash (a member name never matched then).
bool skip_string(cursor& c, bool& escaped) {
  ++c.i;  // the opening quote
  escaped = false;
  while (!c.end()) {
    const char ch = c.s[c.i++];
    if (ch == '"') return true;
    if (ch == '\\') {
      escaped = true;
      if (c.end()) return false;
      ++c.i;
    }
  }
  return false;
}

// Any value: false when it does not end in the bytes or is not JSON-shaped.
// Nesting is counted, not recursed into (a body cannot exhaust the stack).
bool skip_value(cursor& c, bool& incomplete) {
  incomplete = false;
  std::size_t depth = 0;
  while (true) {
    c.skip_space();
    if (c.end()) return incomplete = true, false;
    const char ch = c.peek();
    bool ignored = false;
    if (ch == '"') {
      if (!skip_string(c, ignored)) return incomplete = true, false;
    } else if (ch == '{' || ch == '[') {
      ++depth;
      ++c.i;
      continue;
    } else if (ch == '}' || ch == ']') {
      if (depth == 0) return false;
      --depth;
      ++c.i;
    } else if (ch == ',' || ch == ':') {
      if (depth == 0) return false;
      ++c.i;
      continue;
    } else {  // a number or a literal: up to a delimiter
      const std::size_t from = c.i;
      while (!c.end() && !space(c.peek()) && c.peek() != ',' && c.peek() != '}' && c.peek() != ']' && c.peek() != ':') {
        ++c.i;
      }
      if (c.end()) return incomplete = true, false;
      if (c.i == from) return false;
    }
    if (depth == 0) return true;
  }
}

}  // namespace

json_field_result json_field(std::string_view body, std::string_view name) {
  cursor c{body};
  c.skip_space();
  if (c.end()) return {kind::not_found, {}};
  if (c.peek() != '{') return {kind::malformed, {}};
  ++c.i;
  while (true) {
    c.skip_space();
    if (c.end()) return {kind::not_found, {}};
    if (c.peek() == '}') return {kind::not_found, {}};
    if (c.peek() != '"') return {kind::malformed, {}};
    const std::size_t key_from = c.i + 1;
    bool escaped = false;
    if (!skip_string(c, escaped)) return {kind::not_found, {}};
    const std::string_view key = body.substr(key_from, c.i - 1 - key_from);
    c.skip_space();
    if (c.end()) return {kind::not_found, {}};
    if (c.peek() != ':') return {kind::malformed, {}};
    ++c.i;
    c.skip_space();
    if (c.end()) return {kind::not_found, {}};
    if (!escaped && key == name) {
      const std::size_t from = c.i;
      while (!c.end() && digit(c.peek())) ++c.i;
      if (c.end()) return {kind::not_found, {}};  // the number may go on
      const std::string_view digits = body.substr(from, c.i - from);
      const char next = c.peek();
      if (digits.empty() || digits.size() > 19 || (digits.size() > 1 && digits[0] == '0') ||
          !(space(next) || next == ',' || next == '}')) {
        return {kind::malformed, {}};
      }
      return {kind::number, digits};
    }
    bool incomplete = false;
    if (!skip_value(c, incomplete)) return {incomplete ? kind::not_found : kind::malformed, {}};
    c.skip_space();
    if (c.end()) return {kind::not_found, {}};
    if (c.peek() == ',') {
      ++c.i;
      continue;
    }
    if (c.peek() == '}') return {kind::not_found, {}};
    return {kind::malformed, {}};
  }
}

}  // namespace smockron::proxy
