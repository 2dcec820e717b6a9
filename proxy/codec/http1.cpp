// HTTP/1.1 request and response heads (see http1.hpp).
#include "proxy/codec/http1.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>

#include "proxy/codec/http1_chars.hpp"

namespace smockron::proxy::http1 {

namespace {

using chars::lower;
constexpr const auto& k_tchar = chars::tchar;

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (!k_tchar[static_cast<unsigned char>(c)]) return false;
  }
  return true;
}

// Field values: HTAB, SP, VCHAR, obs-text; no other control characters.
bool is_field_value(std::string_view s) {
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Calls f(token) for each non-empty element of a comma-separated list until f returns true.
template <class F>
bool for_each_token(std::string_view list, F&& f) {
  while (!list.empty()) {
    const auto comma = list.find(',');
    const auto token = trim(list.substr(0, comma));
    if (!token.empty() && f(token)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

std::optional<std::uint64_t> parse_length(std::string_view v) {
  v = trim(v);
  if (v.empty() || v.size() > 18) return std::nullopt;
  std::uint64_t n = 0;
  for (const char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return n;
}

// Finds the end of a head (one past the blank line's CRLF) after skipping
// leading empty lines; `scanned` carries the search position between calls.
struct head_bounds {
  parse_status status;
  std::size_t start = 0, end = 0;
  std::string_view reason = {};  ///< for bad
};
head_bounds find_head(std::string_view data, std::size_t max_head, std::size_t& scanned) {
  std::size_t start = 0;
  while (data.size() - start >= 2 && data[start] == '\r' && data[start + 1] == '\n') start += 2;
  const std::size_t from = std::max(start, scanned > 3 ? scanned - 3 : std::size_t{0});
  const auto blank = data.find("\r\n\r\n", from);
  // The request line alone ends with CRLF followed by the blank line's CRLF.
  if (blank != std::string_view::npos && blank + 4 <= max_head) return {parse_status::complete, start, blank + 4};
  scanned = data.size();
  // Lines end at CRLF only: a head with a bare LF never completes (or fails
  // its checks once it does). Refuse it now, not when a timeout fires.
  for (auto lf = data.find('\n', from); lf != std::string_view::npos; lf = data.find('\n', lf + 1)) {
    if (lf == 0 || data[lf - 1] != '\r') return {parse_status::bad, 0, 0, "bare LF in the head"};
  }
  if (data.size() < max_head && blank == std::string_view::npos) return {parse_status::incomplete};
  const auto line_end = data.find("\r\n", start);
  return {line_end == std::string_view::npos || line_end >= max_head ? parse_status::line_too_long
                                                                     : parse_status::headers_too_large};
}

// Splits header lines [pos, end) into `out`; returns an error text or nothing.
// Lines end at CRLF; a bare CR or LF left inside a line fails the name or
// value check (as the request and status lines fail theirs): no line can be
// split differently by the next hop.
std::string_view parse_fields(std::string_view head, std::size_t pos, header_list& out) {
  // `head` ends with the blank line's CRLF: every scan below stops at a CR.
  const char* p = head.data() + pos;
  for (;;) {
    const char* const name = p;
    while (k_tchar[static_cast<unsigned char>(*p)]) ++p;
    if (p == name) {
      if (p[0] == '\r' && p[1] == '\n') return {};  // the blank line
      if (*p == ' ' || *p == '\t') return "obsolete line folding";
      return "invalid header name";
    }
    if (*p != ':') return *p == '\r' ? "header line without a colon" : "invalid header name";
    const std::string_view field_name(name, static_cast<std::size_t>(p - name));
    ++p;
    while (*p == ' ' || *p == '\t') ++p;
    const char* const value = p;
    for (;; ++p) {
      const auto c = static_cast<unsigned char>(*p);
      if (c >= 0x20 && c != 0x7f) continue;
      if (c == '\t') continue;
      if (c == '\r') break;
      return "invalid header value";  // control characters, bare LF
    }
    if (p[1] != '\n') return "invalid header value";  // bare CR
    const char* end = p;
    while (end > value && (end[-1] == ' ' || end[-1] == '\t')) --end;
    out.insert(field_name, std::string_view(value, static_cast<std::size_t>(end - value)));
    p += 2;
  }
}

bool parse_version(std::string_view v, unsigned& out) {
  if (v == "HTTP/1.1") out = 11;
  else if (v == "HTTP/1.0") out = 10;
  else return false;
  return true;
}

parse_result bad(std::string_view why) { return {parse_status::bad, why}; }

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(static_cast<unsigned char>(a[i])) != lower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

bool connection_has(const header_list& h, std::string_view token) {
  return h.for_each("Connection", [&](std::string_view v) { return has_token(v, token); });
}

bool has_token(std::string_view list, std::string_view token) {
  return for_each_token(list, [&](std::string_view t) { return iequals(t, token); });
}

namespace {
// RFC 3986 3.2.2 reg-name (and IPv4address): unreserved, pct-encoded, sub-delims.
constexpr std::array<bool, 256> make_reg_name_char() {
  std::array<bool, 256> t{};
  for (int c = '0'; c <= '9'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (int c = 'a'; c <= 'z'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (int c = 'A'; c <= 'Z'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (const char c : std::string_view("-._~%!$&'()*+,;=")) t[static_cast<unsigned char>(c)] = true;
  return t;
}
constexpr auto k_reg_name_char = make_reg_name_char();
}  // namespace

bool valid_host(std::string_view host) {
  // uri-host: an IP-literal in brackets, or reg-name / IPv4address.
  std::size_t i = 0;
  if (!host.empty() && host.front() == '[') {
    const auto close = host.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (const char c : host.substr(1, close - 1)) {
      const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (!hex && c != ':' && c != '.' && c != 'v' && c != 'V') return false;
    }
    i = close + 1;
  } else {
    while (i < host.size() && k_reg_name_char[static_cast<unsigned char>(host[i])]) ++i;
  }
  if (i == host.size()) return true;
  if (host[i] != ':') return false;
  // port = *DIGIT
  return std::all_of(host.begin() + static_cast<std::ptrdiff_t>(i) + 1, host.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

namespace {
std::string_view moved(std::string_view v, const char* from, std::size_t n, const char* to) {
  // Compared as integers: pointers into different objects have no order.
  const auto p = reinterpret_cast<std::uintptr_t>(v.data()), b = reinterpret_cast<std::uintptr_t>(from);
  if (v.data() == nullptr || p < b || p + v.size() > b + n) return v;
  return {to + (p - b), v.size()};
}
}  // namespace

void header_list::rebase(const char* from, std::size_t n, const char* to) {
  for (auto& h : items_) {
    h.name = moved(h.name, from, n, to);
    h.value = moved(h.value, from, n, to);
  }
}

void rebase(request_head& r, const char* from, std::size_t n, const char* to) {
  r.method = moved(r.method, from, n, to);
  r.target = moved(r.target, from, n, to);
  r.host = moved(r.host, from, n, to);
  r.headers.rebase(from, n, to);
}

std::optional<std::string_view> header_list::first(std::string_view name) const {
  for (const auto& h : items_) {
    if (iequals(h.name, name)) return h.value;
  }
  return std::nullopt;
}

std::size_t header_list::count(std::string_view name) const {
  std::size_t n = 0;
  for (const auto& h : items_) n += iequals(h.name, name) ? 1 : 0;
  return n;
}

namespace {
// The request's fields, parsed into out.headers: one pass over them for
// everything the proxy decides on (Host, framing, connection, Expect, Upgrade).
parse_result decide_request_fields(request_head& out) {
  std::size_t hosts = 0, lengths = 0, encodings = 0;
  std::string_view length_value, encoding_value;
  std::optional<std::string_view> expect, upgrade;
  bool conn_close = false, conn_keep_alive = false, conn_upgrade = false;
  out.host = {};
  for (const auto& f : out.headers) {
    switch (f.name.size()) {
      case 4:
        if (iequals(f.name, "Host")) {
          ++hosts;
          out.host = f.value;
        }
        break;
      case 6:
        if (!expect && iequals(f.name, "Expect")) expect = f.value;
        break;
      case 7:
        if (!upgrade && iequals(f.name, "Upgrade")) upgrade = f.value;
        break;
      case 10:
        if (iequals(f.name, "Connection")) {
          conn_close = conn_close || has_token(f.value, "close");
          conn_keep_alive = conn_keep_alive || has_token(f.value, "keep-alive");
          conn_upgrade = conn_upgrade || has_token(f.value, "upgrade");
        }
        break;
      case 14:
        if (iequals(f.name, "Content-Length")) {
          ++lengths;
          length_value = f.value;
        }
        break;
      case 17:
        if (iequals(f.name, "Transfer-Encoding")) {
          ++encodings;
          encoding_value = f.value;
        }
        break;
      default: break;
    }
  }
  if (hosts > 1) return bad("more than one Host");
  if (hosts == 0 && out.version >= 11) return bad("HTTP/1.1 request without Host");
  if (hosts == 1 && !valid_host(out.host)) return bad("invalid Host");
  out.has_host = hosts == 1;
  if (lengths > 1) return bad("more than one Content-Length");
  if (encodings > 0 && lengths > 0) return bad("both Transfer-Encoding and Content-Length");
  out.content_length = 0;
  out.body = framing::none;
  if (encodings > 0) {
    // Exactly one coding, "chunked": anything else cannot be delimited safely.
    if (encodings > 1 || out.version < 11 || !iequals(trim(encoding_value), "chunked")) {
      return bad("unsupported Transfer-Encoding");
    }
    out.body = framing::chunked;
  } else if (lengths == 1) {
    const auto n = parse_length(length_value);
    if (!n) return bad("invalid Content-Length");
    out.content_length = *n;
    out.body = *n > 0 ? framing::length : framing::none;
  }
  out.keep_alive = out.version >= 11 ? !conn_close : conn_keep_alive;
  out.expect_continue = expect && iequals(*expect, "100-continue");
  // h2c is not offered (RFC 9113 3.1 removed it; the proxy's HTTP/2 is ALPN or
  // prior knowledge): relayed, it would open an ungated tunnel to a backend
  // that speaks it. Such a request goes on as plain HTTP/1.1, Upgrade dropped.
  out.upgrade = upgrade && !upgrade->empty() && conn_upgrade && !has_token(*upgrade, "h2c");
  out.head = out.method == "HEAD";
  return {parse_status::complete, {}};
}
}  // namespace

parse_result parse_request(std::string_view data, std::size_t max_head, request_head& out, std::size_t& scanned) {
  const auto bounds = find_head(data, max_head, scanned);
  if (bounds.status != parse_status::complete) return {bounds.status, bounds.reason};
  const std::string_view head = data.substr(0, bounds.end);
  out.headers.clear();
  out.size = bounds.end;

  const auto eol = head.find("\r\n", bounds.start);
  const std::string_view line = head.substr(bounds.start, eol - bounds.start);
  const auto sp1 = line.find(' ');
  const auto sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return bad("malformed request line");
  out.method = line.substr(0, sp1);
  out.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (!is_token(out.method)) return bad("invalid method");
  if (out.target.empty()) return bad("empty request target");
  for (const char ch : out.target) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7f) return bad("invalid request target");
  }
  if (!parse_version(line.substr(sp2 + 1), out.version)) return bad("unsupported HTTP version");
  if (const auto why = parse_fields(head, eol + 2, out.headers); !why.empty()) return bad(why);

  return decide_request_fields(out);
}

parse_result parse_request(std::string_view data, std::size_t max_head, request_head& out) {
  std::size_t scanned = 0;
  return parse_request(data, max_head, out, scanned);
}

parse_result parse_response(std::string_view data, std::size_t max_head, bool request_was_head, response_head& out,
                            std::size_t& scanned) {
  const auto bounds = find_head(data, max_head, scanned);
  if (bounds.status != parse_status::complete) return {bounds.status, bounds.reason};
  if (bounds.start != 0) return bad("empty line before the status line");
  const std::string_view head = data.substr(0, bounds.end);
  out.headers.clear();
  out.size = bounds.end;
  const auto eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  // HTTP-version SP 3DIGIT SP reason-phrase (the reason may be empty, its SP is sometimes missing).
  if (line.size() < 12 || line[8] != ' ' || !parse_version(line.substr(0, 8), out.version)) {
    return bad("malformed status line");
  }
  out.status = 0;
  for (std::size_t i = 9; i < 12; ++i) {
    if (line[i] < '0' || line[i] > '9') return bad("malformed status code");
    out.status = out.status * 10 + static_cast<unsigned>(line[i] - '0');
  }
  if (out.status < 100) return bad("malformed status code");
  if (line.size() > 12 && line[12] != ' ') return bad("malformed status line");
  out.reason = line.size() > 13 ? line.substr(13) : std::string_view{};
  if (!is_field_value(out.reason)) return bad("invalid reason phrase");
  if (const auto why = parse_fields(head, eol + 2, out.headers); !why.empty()) return bad(why);

  std::optional<std::uint64_t> length;
  bool chunked = false, encoded = false;
  for (const auto& f : out.headers) {
    if (f.name.size() == 14 && iequals(f.name, "Content-Length")) {
      // Repeated (as lines or as a list) only with one value.
      bool ok = !trim(f.value).empty();
      for_each_token(f.value, [&](std::string_view v) {
        const auto n = parse_length(v);
        if (!n || (length && *length != *n)) ok = false;
        else length = n;
        return !ok;
      });
      if (!ok) return bad("invalid Content-Length");
    } else if (f.name.size() == 17 && iequals(f.name, "Transfer-Encoding")) {
      encoded = true;
      // Chunked when it is the final coding (RFC 9112 6.3).
      chunked = false;
      for_each_token(f.value, [&](std::string_view t) {
        chunked = iequals(t, "chunked");
        return false;
      });
    }
  }
  out.content_length = 0;
  out.transfer_encoded = encoded;
  if (request_was_head || out.status < 200 || out.status == 204 || out.status == 304) {
    out.body = framing::none;
  } else if (encoded) {
    out.body = chunked ? framing::chunked : framing::until_close;
  } else if (length) {
    out.content_length = *length;
    out.body = *length > 0 ? framing::length : framing::none;
  } else {
    out.body = framing::until_close;
  }
  out.keep_alive = out.body != framing::until_close && (out.version >= 11 ? !connection_has(out.headers, "close")
                                                                          : connection_has(out.headers, "keep-alive"));
  return {parse_status::complete, {}};
}

parse_result parse_response(std::string_view data, std::size_t max_head, bool request_was_head, response_head& out) {
  std::size_t scanned = 0;
  return parse_response(data, max_head, request_was_head, out, scanned);
}

}  // namespace smockron::proxy::http1
