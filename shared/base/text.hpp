// Small text helpers shared by the parsers of both daemons.
#pragma once

#include <string_view>

namespace smockron {

/// `s` without the optional whitespace (SP, HTAB) around it (RFC 9110 5.6.3).
constexpr std::string_view trim_ows(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

/// The value of a hexadecimal digit (either case), or -1.
constexpr int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace smockron
