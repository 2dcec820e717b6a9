// Character classes of RFC 9110 shared by the HTTP/1.1 head parser and the
// chunked decoder (internal to smockron_http1).
#pragma once

#include <array>
#include <string_view>

namespace smockron::proxy::http1::chars {

constexpr unsigned char lower(unsigned char c) { return c >= 'A' && c <= 'Z' ? static_cast<unsigned char>(c + 32) : c; }

// RFC 9110 5.6.2 tchar.
constexpr std::array<bool, 256> make_tchar() {
  std::array<bool, 256> t{};
  for (int c = '0'; c <= '9'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (int c = 'a'; c <= 'z'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (int c = 'A'; c <= 'Z'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (const char c : std::string_view("!#$%&'*+-.^_`|~")) t[static_cast<unsigned char>(c)] = true;
  return t;
}
inline constexpr auto tchar = make_tchar();

inline bool is_tchar(unsigned char c) { return tchar[c]; }
/// Control characters a field value or quoted string may not hold (HTAB is allowed).
inline bool is_ctl(unsigned char c) { return (c < 0x20 && c != '\t') || c == 0x7f; }

}  // namespace smockron::proxy::http1::chars
