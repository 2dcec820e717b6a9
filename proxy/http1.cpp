// HTTP/1.1 heads and chunked framing (see http1.hpp).
#include "proxy/http1.hpp"

#include <array>
#include <charconv>

namespace smockron::proxy::http1 {

namespace {

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
constexpr auto k_tchar = make_tchar();

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

bool connection_has(const header_list& h, std::string_view token) {
  return h.for_each("Connection", [&](std::string_view v) { return has_token(v, token); });
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

bool has_token(std::string_view list, std::string_view token) {
  return for_each_token(list, [&](std::string_view t) { return iequals(t, token); });
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

  // One pass over the headers for everything the proxy decides on.
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
  out.upgrade = upgrade && !upgrade->empty() && conn_upgrade;
  out.head = out.method == "HEAD";
  return {parse_status::complete, {}};
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

// ---- chunked ---------------------------------------------------------------

bool chunked_decoder::fail(std::string_view why) {
  state_ = state::failed;
  error_ = why;
  return false;
}

std::optional<std::size_t> chunked_decoder::feed(std::string_view in, std::string_view& data) {
  data = {};
  std::size_t i = 0;
  while (i < in.size()) {
    const auto c = static_cast<unsigned char>(in[i]);
    switch (state_) {
      case state::size: {
        int v = -1;
        if (c >= '0' && c <= '9') v = c - '0';
        else if (lower(c) >= 'a' && lower(c) <= 'f') v = lower(c) - 'a' + 10;
        if (v >= 0) {
          if (++digits_ > 15) return fail("chunk size too large"), std::nullopt;
          remaining_ = remaining_ * 16 + static_cast<std::uint64_t>(v);
        } else if (digits_ == 0) {
          return fail("invalid chunk size"), std::nullopt;
        } else if (c == ';' || c == ' ' || c == '\t') {
          state_ = state::ext;
        } else if (c == '\r') {
          state_ = state::size_lf;
        } else {
          return fail("invalid chunk size"), std::nullopt;
        }
        ++i;
        break;
      }
      case state::ext:
        if (c == '\r') {
          state_ = state::size_lf;
        } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
          return fail("invalid chunk extension"), std::nullopt;
        } else if (++line_ > max_line_) {
          return fail("chunk extension too long"), std::nullopt;
        }
        ++i;
        break;
      case state::size_lf:
        if (c != '\n') return fail("invalid chunk size line"), std::nullopt;
        ++i;
        digits_ = 0;
        line_ = 0;
        if (remaining_ == 0) {
          state_ = state::trailer;
          line_empty_ = true;
        } else {
          state_ = state::data;
        }
        break;
      case state::data: {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, in.size() - i));
        data = in.substr(i, n);
        i += n;
        remaining_ -= n;
        if (remaining_ == 0) state_ = state::data_cr;
        return i;  // one run of data per call
      }
      case state::data_cr:
        if (c != '\r') return fail("chunk data longer than its size"), std::nullopt;
        state_ = state::data_lf;
        ++i;
        break;
      case state::data_lf:
        if (c != '\n') return fail("chunk data longer than its size"), std::nullopt;
        state_ = state::size;
        ++i;
        break;
      case state::trailer:
        if (c == '\r') {
          state_ = state::trailer_lf;
        } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
          return fail("invalid trailer"), std::nullopt;
        } else {
          line_empty_ = false;
          if (++trailer_bytes_ > max_line_) return fail("trailers too large"), std::nullopt;
        }
        ++i;
        break;
      case state::trailer_lf:
        if (c != '\n') return fail("invalid trailer"), std::nullopt;
        ++i;
        if (line_empty_) {
          state_ = state::done;
          return i;
        }
        line_empty_ = true;
        state_ = state::trailer;
        break;
      case state::done: return i;
      case state::failed: return std::nullopt;
    }
  }
  return i;
}

// ---- rewriting -------------------------------------------------------------

namespace {

// Connection header values of a head, gathered once per rewrite.
struct connection_lists {
  std::array<std::string_view, 4> values{};
  std::size_t count = 0;
  bool overflow = false;
  const header_list* all = nullptr;

  explicit connection_lists(const header_list& h) : all(&h) {
    for (const auto& f : h) {
      if (f.name.size() == 10 && iequals(f.name, "Connection")) {
        if (count < values.size()) values[count++] = f.value;
        else overflow = true;
      }
    }
  }
  bool lists(std::string_view name) const {
    if (overflow) return connection_has(*all, name);
    for (std::size_t i = 0; i < count; ++i) {
      if (has_token(values[i], name)) return true;
    }
    return false;
  }
};

bool is_end_to_end(std::string_view name) {
  return iequals(name, "Content-Length") || iequals(name, "Transfer-Encoding") || iequals(name, "Host");
}

bool hop_by_hop(std::string_view name, const connection_lists& conn, bool tunnel) {
  switch (name.size()) {
    case 2:
      if (iequals(name, "TE")) return true;
      break;
    case 7:
      if (iequals(name, "Trailer")) return true;
      if (iequals(name, "Upgrade")) return !tunnel;
      break;
    case 10:
      if (iequals(name, "Connection") || iequals(name, "Keep-Alive")) return true;
      break;
    case 16:
      if (iequals(name, "Proxy-Connection")) return true;
      break;
    case 18:
      if (iequals(name, "Proxy-Authenticate")) return true;
      break;
    case 19:
      if (iequals(name, "Proxy-Authorization")) return true;
      break;
    default: break;
  }
  // Whatever Connection lists, the message's framing and Host are not the
  // sender's to drop: without them the next hop would read the body as
  // another (ungated) request.
  return conn.count > 0 && conn.lists(name) && !(tunnel && iequals(name, "Upgrade")) && !is_end_to_end(name);
}

void append_line(std::string& out, std::string_view name, std::string_view value) {
  out.append(name).append(": ").append(value).append("\r\n");
}

}  // namespace

bool is_hop_by_hop(std::string_view name, const header_list& h, bool tunnel) {
  return hop_by_hop(name, connection_lists(h), tunnel);
}

void write_request_head(std::string& out, const request_head& req, const forward_info& info) {
  out.append(req.method).append(" ").append(req.target).append(" HTTP/1.1\r\n");
  const connection_lists conn(req.headers);
  std::size_t xff_lines = 0;
  for (const auto& f : req.headers) {
    if (hop_by_hop(f.name, conn, info.tunnel)) continue;
    if (f.name.size() >= 15 && f.name.size() <= 17 && (f.name[0] == 'X' || f.name[0] == 'x')) {
      if (iequals(f.name, "X-Forwarded-For")) {
        ++xff_lines;
        continue;
      }
      if (iequals(f.name, "X-Forwarded-Proto") || iequals(f.name, "X-Forwarded-Host")) continue;
    }
    if (req.expect_continue && f.name.size() == 6 && iequals(f.name, "Expect")) continue;
    append_line(out, f.name, f.value);
  }
  // This hop is appended to the chain; several lines fold into one.
  out.append("X-Forwarded-For: ");
  if (xff_lines > 0) {
    req.headers.for_each("X-Forwarded-For", [&](std::string_view v) {
      out.append(v).append(", ");
      return false;
    });
  }
  out.append(info.client_ip).append("\r\n");
  append_line(out, "X-Forwarded-Proto", info.proto);
  if (!req.host.empty()) append_line(out, "X-Forwarded-Host", req.host);
  // HTTP/1.0 allows a request without Host; the HTTP/1.1 it goes on as does
  // not: an empty one is what a target without authority calls for (RFC 9112 3.2).
  if (req.version < 11 && !req.has_host) out.append("Host: \r\n");
  if (info.tunnel) out.append("Connection: upgrade\r\n");
  out.append("\r\n");
}

void write_response_head(std::string& out, const response_head& res, unsigned client_version, framing body,
                         bool keep_alive, bool tunnel) {
  out.append(client_version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ");
  char code[3] = {static_cast<char>('0' + res.status / 100 % 10), static_cast<char>('0' + res.status / 10 % 10),
                  static_cast<char>('0' + res.status % 10)};
  out.append(code, 3).append(" ").append(res.reason.empty() ? reason_phrase(res.status) : res.reason).append("\r\n");
  const connection_lists conn(res.headers);
  // Framing headers are rewritten when the framing changes.
  const bool drop_te = res.body == framing::chunked && body != framing::chunked;
  // A transfer coding makes Content-Length meaningless (RFC 9112 6.3): never send both.
  const bool drop_length = res.transfer_encoded || body == framing::chunked;
  for (const auto& f : res.headers) {
    if (hop_by_hop(f.name, conn, tunnel)) continue;
    if (f.name.size() == 17 && drop_te && iequals(f.name, "Transfer-Encoding")) continue;
    if (f.name.size() == 14 && drop_length && iequals(f.name, "Content-Length")) continue;
    append_line(out, f.name, f.value);
  }
  if (body == framing::chunked && res.body == framing::until_close) out.append("Transfer-Encoding: chunked\r\n");
  if (tunnel) out.append("Connection: upgrade\r\n");
  else if (!keep_alive) out.append("Connection: close\r\n");
  else if (client_version < 11) out.append("Connection: keep-alive\r\n");
  out.append("\r\n");
}

void write_simple_response(std::string& out, unsigned version, unsigned status, std::string_view body, bool keep_alive,
                           std::int64_t retry_after_s) {
  out.append(version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ").append(std::to_string(status)).append(" ");
  out.append(reason_phrase(status)).append("\r\nServer: smockron\r\nContent-Type: text/plain; charset=utf-8\r\n");
  out.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
  if (retry_after_s > 0) out.append("Retry-After: ").append(std::to_string(retry_after_s)).append("\r\n");
  if (!keep_alive) out.append("Connection: close\r\n");
  else if (version < 11) out.append("Connection: keep-alive\r\n");
  out.append("\r\n").append(body);
}

std::string_view reason_phrase(unsigned status) {
  switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

}  // namespace smockron::proxy::http1
