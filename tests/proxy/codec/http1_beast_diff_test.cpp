// Differential test of the request path's HTTP/1.1 parser (proxy/codec/http1.hpp)
// against Boost.Beast's request_parser (issue 14): generated and mutated
// request heads and bodies, every disagreement named, counted and either
// allow-listed with its reason or a failure.
#include "proxy/codec/http1.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/system/error_code.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <iostream>
#include <map>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smockron::proxy::http1 {
namespace {

// ---- the allow-list -----------------------------------------------------------
//
// Categories of disagreement that are accepted, each with its reason (the
// docs/security.md list). Only two kinds belong here: Smockron refuses what Beast
// takes ("smockron_stricter: <Smockron's reason>"), on purpose; or Beast
// refuses what Smockron forwards, and what Smockron forwards Beast parses to
// the same message ("forwarded_same: <why Beast refused>"). Anything else
// (both accept but disagree, or Smockron forwards what Beast refuses or reads
// otherwise) is a bug to fix, never an entry here.
struct allowed {
  std::string_view category, reason;
};
constexpr allowed k_allowed[] = {
    {"smockron_stricter: HTTP/1.1 request without Host",
     "RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without Host; Beast leaves that to the caller"},
    {"smockron_stricter: more than one Host",
     "RFC 9112 3.2: MUST answer 400 to more than one Host; routing and X-Forwarded-Host need exactly one"},
    {"smockron_stricter: invalid Host",
     "RFC 9112 3.2: MUST answer 400 to a Host with an invalid value (userinfo, spaces, a path): a host no server "
     "would read as one must not be routed as another; Beast takes any field value"},
    {"smockron_stricter: obsolete line folding",
     "RFC 9112 5.2 lets a server reject obs-fold; Beast unfolds it, and a next hop that does not would split the line"},
    {"smockron_stricter: more than one Content-Length",
     "RFC 9112 6.3 lets a recipient refuse repeated Content-Length lines; they are refused even with equal values "
     "(Beast merges equal ones), so every next hop reads one line"},
    {"smockron_stricter: invalid Content-Length",
     "only 1*18DIGIT is taken: a list (\"5, 5\", which Beast merges) and more than 18 digits, leading zeros "
     "included, are refused"},
    {"smockron_stricter: both Transfer-Encoding and Content-Length",
     "RFC 9112 6.1: a request with both MAY be refused, and is (Beast takes Content-Length when the coding before it "
     "was not chunked)"},
    {"smockron_stricter: unsupported Transfer-Encoding",
     "exactly one coding, \"chunked\", in HTTP/1.1 only (\"gzip, chunked\" and repeated lines too are refused); "
     "Beast reads a request whose final coding is not chunked as having no body (RFC 9112 6.3: MUST answer 400) "
     "and takes chunked in HTTP/1.0 (RFC 9112 6.1: faulty framing)"},
    {"smockron_stricter: chunk size too large",
     "at most 15 hex digits, leading zeros included (a bounded size line); Beast takes any number of leading zeros "
     "and sizes up to 2^64-1"},
    {"smockron_stricter: invalid chunk extension",
     "control characters in a chunk extension are refused; Beast takes any byte but '\"' inside a quoted value"},
    {"smockron_stricter: chunk extension too long",
     "a chunk size line longer than max_header_bytes is refused (Beast has no limit on it)"},
    {"smockron_stricter: trailers too large",
     "trailer lines longer than max_header_bytes in all are refused (Beast has no limit on them)"},
    {"smockron_stricter: obsolete line folding in trailers",
     "trailers are relayed as they came, so obs-fold is refused there as in the head (Beast unfolds it)"},
    {"forwarded_same: empty line before the request line",
     "RFC 9112 2.2: empty lines before the request line are skipped, and not forwarded; Beast refuses them"},
    {"forwarded_same: Connection not a token list",
     "Beast refuses a Connection or Proxy-Connection value that is not a token list; both are hop-by-hop and "
     "never forwarded"},
};

// ---- the oracle and the parser under test -----------------------------------------

namespace beast_http = boost::beast::http;

constexpr std::size_t k_max_head = 64 * 1024;  // both parsers; generated heads stay below
constexpr std::size_t k_max_line = 16 * 1024;  // the chunk decoder's, max_header_bytes by default

using field_lines = std::vector<std::pair<std::string, std::string>>;

// The forwarding options varied per message (forward_info's; tunnel follows the request).
struct hop {
  std::string_view peer = "192.0.2.1";
  bool trusted = false;            ///< its X-Forwarded-Proto / -Host are kept
  bool forwarded_element = false;  ///< an RFC 7239 element is appended
};

enum class verdict : std::uint8_t { accepted, rejected, incomplete };
enum class phase : std::uint8_t { head, body };

// What one parser made of one message.
struct outcome {
  verdict result = verdict::incomplete;
  phase where = phase::head;  ///< where it stopped when not accepted
  std::string why;            ///< rejected: the parser's reason
  boost::system::error_code ec;
  std::string method, target;
  unsigned version = 0;
  field_lines fields;  ///< the head's lines (trailers not included)
  framing body = framing::none;
  std::uint64_t length = 0;
  std::string payload;
  std::size_t consumed = 0;  ///< accepted: bytes of the message, head and body
};

std::string_view phase_name(phase p) { return p == phase::head ? "head" : "body"; }

std::string_view framing_name(framing f) {
  switch (f) {
    case framing::none: return "no body";
    case framing::length: return "length";
    case framing::chunked: return "chunked";
    case framing::until_close: return "until close";
  }
  return "?";
}

// Beast, fed the whole buffer. The head first (eager off), so that its lines
// are copied before trailers join them; then the body, eagerly.
outcome beast_parse(std::string_view in) {
  beast_http::request_parser<beast_http::string_body> p;
  p.header_limit(static_cast<std::uint32_t>(k_max_head));
  p.body_limit(boost::none);
  p.eager(false);
  outcome o;
  std::size_t used = p.put(boost::asio::const_buffer(in.data(), in.size()), o.ec);
  if (o.ec == beast_http::error::need_more) return o;
  if (o.ec) {
    o.result = verdict::rejected;
    o.why = o.ec.message();
    return o;
  }
  const auto& m = p.get();
  o.method = std::string(m.method_string());
  o.target = std::string(m.target());
  o.version = m.version();
  for (const auto& f : m) o.fields.emplace_back(std::string(f.name_string()), std::string(f.value()));
  if (p.chunked()) {
    o.body = framing::chunked;
  } else if (const auto n = p.content_length(); n && *n > 0) {
    o.body = framing::length;
    o.length = *n;
  }
  o.where = phase::body;
  if (!p.is_done()) {
    // string_body reserves the whole Content-Length: a length the buffer
    // cannot hold is an incomplete message, not an allocation.
    if (o.body == framing::length && o.length > in.size() - used) return o;
    p.eager(true);
    while (!p.is_done()) {
      if (used == in.size()) return o;
      const auto n = p.put(boost::asio::const_buffer(in.data() + used, in.size() - used), o.ec);
      used += n;
      if (o.ec == beast_http::error::need_more) return o;
      if (o.ec) {
        o.result = verdict::rejected;
        o.why = o.ec.message();
        return o;
      }
      if (n == 0) return o;
    }
    o.payload = p.get().body();
  }
  o.result = verdict::accepted;
  o.consumed = used;
  return o;
}

// Smockron: parse_request on the head, then the body as the proxy relays it
// (body_relay with the same framing on both sides): Content-Length bytes, or
// the chunked decoder's consumed bytes, forwarded as received. `relayed` gets
// the body bytes that would have gone upstream so far.
outcome smockron_parse(std::string_view in, request_head& h, std::string& relayed) {
  outcome o;
  const auto r = parse_request(in, k_max_head, h);
  if (r.status == parse_status::incomplete) return o;
  if (r.status != parse_status::complete) {
    o.result = verdict::rejected;
    o.why = r.status == parse_status::bad ? std::string(r.reason) : "head too large";
    return o;
  }
  o.method = std::string(h.method);
  o.target = std::string(h.target);
  o.version = h.version;
  for (const auto& f : h.headers) o.fields.emplace_back(std::string(f.name), std::string(f.value));
  o.body = h.body;
  o.length = h.body == framing::length ? h.content_length : 0;
  o.where = phase::body;
  const std::string_view rest = in.substr(h.size);
  switch (h.body) {
    case framing::none: break;
    case framing::length:
      relayed =
          std::string(rest.substr(0, static_cast<std::size_t>(std::min<std::uint64_t>(h.content_length, rest.size()))));
      if (rest.size() < h.content_length) return o;
      o.payload = relayed;
      break;
    case framing::chunked: {
      chunked_decoder dec(k_max_line);
      std::size_t n = 0;
      while (n < rest.size() && !dec.done()) {
        std::string_view data;
        const auto used = dec.feed(rest.substr(n), data);
        if (!used) {
          o.result = verdict::rejected;
          o.why = std::string(dec.error());
          relayed = std::string(rest.substr(0, n));
          return o;
        }
        n += *used;
        o.payload.append(data);
      }
      relayed = std::string(rest.substr(0, n));
      if (!dec.done()) return o;
      break;
    }
    case framing::until_close: return o;  // never for a request
  }
  o.result = verdict::accepted;
  o.consumed = h.size + relayed.size();
  return o;
}

// ---- the documented rewriting, modelled independently --------------------------------

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           const auto lx = static_cast<unsigned char>(x >= 'A' && x <= 'Z' ? x + 32 : x);
           const auto ly = static_cast<unsigned char>(y >= 'A' && y <= 'Z' ? y + 32 : y);
           return lx == ly;
         });
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated elements of `list`, trimmed (empty ones kept).
std::vector<std::string_view> elements(std::string_view list) {
  std::vector<std::string_view> out;
  for (;;) {
    const auto comma = list.find(',');
    out.push_back(trim_ows(list.substr(0, comma)));
    if (comma == std::string_view::npos) return out;
    list.remove_prefix(comma + 1);
  }
}

const std::string* first_value(const field_lines& fields, std::string_view name) {
  for (const auto& [n, v] : fields) {
    if (same_name(n, name)) return &v;
  }
  return nullptr;
}

// Whether a Connection line lists `token`.
bool connection_lists(const field_lines& fields, std::string_view token) {
  for (const auto& [n, v] : fields) {
    if (!same_name(n, "Connection")) continue;
    for (const auto e : elements(v)) {
      if (same_name(e, token)) return true;
    }
  }
  return false;
}

bool is_tchar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// A Connection or Proxy-Connection value that is not #token (what Beast checks).
bool connection_not_token_list(const field_lines& fields) {
  for (const auto& [n, v] : fields) {
    if (!same_name(n, "Connection") && !same_name(n, "Proxy-Connection")) continue;
    for (const auto e : elements(v)) {
      if (!std::all_of(e.begin(), e.end(), is_tchar)) return true;
    }
  }
  return false;
}

// The field lines of the head forwarded upstream for a request with `in`, as
// http1.hpp documents write_request_head: hop-by-hop lines (Connection and
// what it lists except framing and Host, Keep-Alive, TE, Trailer, Upgrade
// unless tunnelling (never to h2c, which is not offered), HTTP2-Settings,
// Proxy-*) and Expect: 100-continue dropped; X-Forwarded-For
// lines folded into one with the peer appended; X-Forwarded-Proto and -Host
// replaced unless the peer is trusted; a Forwarded element for this hop if
// asked for; an empty Host for an HTTP/1.0 request without one;
// "Connection: upgrade" when tunnelling.
field_lines rewritten(const field_lines& in, unsigned version, const hop& via) {
  const std::string* upgrade = first_value(in, "Upgrade");
  const auto offers_h2c = [&] {
    for (const auto e : elements(*upgrade)) {
      if (same_name(e, "h2c")) return true;
    }
    return false;
  };
  const bool tunnel = upgrade && !upgrade->empty() && connection_lists(in, "upgrade") && !offers_h2c();
  const std::string* expect = first_value(in, "Expect");
  const bool expect_continue = expect && same_name(*expect, "100-continue");
  constexpr std::string_view k_hop[] = {
      "Connection",          "Keep-Alive",    "TE", "Trailer", "Proxy-Connection", "Proxy-Authenticate",
      "Proxy-Authorization", "HTTP2-Settings"};
  field_lines out;
  std::string xff;
  for (const auto& [name, value] : in) {
    const bool listed = connection_lists(in, name) && !(tunnel && same_name(name, "Upgrade")) &&
                        !same_name(name, "Content-Length") && !same_name(name, "Transfer-Encoding") &&
                        !same_name(name, "Host");
    const bool dropped = std::any_of(std::begin(k_hop), std::end(k_hop), [&](auto h) { return same_name(name, h); }) ||
                         (same_name(name, "Upgrade") && !tunnel) || listed;
    if (dropped) continue;
    if (same_name(name, "X-Forwarded-For")) {
      xff.append(value).append(", ");
      continue;
    }
    if (!via.trusted && (same_name(name, "X-Forwarded-Proto") || same_name(name, "X-Forwarded-Host"))) continue;
    if (expect_continue && same_name(name, "Expect")) continue;
    out.emplace_back(name, value);
  }
  out.emplace_back("X-Forwarded-For", xff + std::string(via.peer));
  if (!via.trusted || !first_value(in, "X-Forwarded-Proto")) out.emplace_back("X-Forwarded-Proto", "http");
  const std::string* host = first_value(in, "Host");
  if (host && !host->empty() && (!via.trusted || !first_value(in, "X-Forwarded-Host"))) {
    out.emplace_back("X-Forwarded-Host", *host);
  }
  if (via.forwarded_element) {
    // for= an IPv6 node bracketed and quoted, host= a quoted-string (RFC 7239 4, 6).
    const bool v6 = via.peer.find(':') != std::string_view::npos;
    std::string element = "for=" + (v6 ? "\"[" + std::string(via.peer) + "]\"" : std::string(via.peer));
    if (host && !host->empty()) {
      element += ";host=\"";
      for (const char c : *host) {
        if (c == '"' || c == '\\') element += '\\';
        element += c;
      }
      element += '"';
    }
    out.emplace_back("Forwarded", element + ";proto=http");
  }
  if (version < 11 && !host) out.emplace_back("Host", "");
  if (tunnel) out.emplace_back("Connection", "upgrade");
  return out;
}

// ---- comparison --------------------------------------------------------------------

std::string printable(std::string_view s, std::size_t max = 200) {
  std::string out;
  const auto put = [&](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\r') out += "\\r";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20 || c >= 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += ch;
    }
  };
  if (s.size() <= max) {
    for (const char c : s) put(c);
  } else {
    for (const char c : s.substr(0, max / 2)) put(c);
    out += "\" ... (" + std::to_string(s.size() - max) + " bytes) ... \"";
    for (const char c : s.substr(s.size() - max / 2)) put(c);
  }
  return "\"" + out + "\"";
}

std::string show(const field_lines& f) {
  std::string out;
  for (const auto& [n, v] : f) out += printable(n, 40) + ": " + printable(v, 40) + "; ";
  return out;
}

// Beast's fields keep lines of one name together (a repeated name goes after
// its last line), and order matters only among lines of one name (RFC 9110
// 5.3): lines grouped so, by first appearance, compare as Beast keeps them.
field_lines grouped(const field_lines& in) {
  field_lines out;
  std::vector<bool> taken(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (taken[i]) continue;
    for (std::size_t j = i; j < in.size(); ++j) {
      if (!taken[j] && same_name(in[j].first, in[i].first)) {
        taken[j] = true;
        out.push_back(in[j]);
      }
    }
  }
  return out;
}

// How the forwarded message differs: `kind` names it (a category), `detail` shows it.
struct difference {
  std::string kind, detail;
};

// The message Smockron forwards (the head as rewritten, then the body bytes
// relayed so far) parsed by Beast. Nothing when it means `expect` with the
// fields rewritten from `source`; when the original is still incomplete
// (`complete` false), nothing unless Beast refuses or ends what was relayed.
difference check_forwarded(const request_head& h, std::string_view relayed, const hop& via, const field_lines& source,
                           const outcome& expect, bool complete) {
  std::string out;
  write_request_head(out, h, forward_info{via.peer, "http", h.upgrade, via.trusted, via.forwarded_element});
  out.append(relayed);
  const outcome b = beast_parse(out);
  const auto differs = [&](std::string kind, std::string detail) {
    return difference{std::move(kind), (detail.empty() ? "" : detail + "; ") + "forwarded " + printable(out, 300)};
  };
  if (b.result == verdict::rejected) {
    return differs("rejected in " + std::string(phase_name(b.where)) + ": " + b.why, "");
  }
  if (!complete) return b.result == verdict::accepted ? differs("ends before Smockron's", "") : difference{};
  if (b.result != verdict::accepted) return differs("incomplete " + std::string(phase_name(b.where)), "");
  if (b.method != expect.method) return differs("method", printable(b.method));
  if (b.target != expect.target) return differs("target", printable(b.target));
  if (b.version != 11) return differs("version", std::to_string(b.version));
  if (const auto want = grouped(rewritten(source, expect.version, via)); grouped(b.fields) != want) {
    return differs("header fields", show(b.fields) + " expected " + show(want));
  }
  if (b.body != expect.body || b.length != expect.length) return differs("body framing", "");
  if (b.payload != expect.payload) return differs("payload", printable(b.payload));
  if (b.consumed != out.size()) return differs("message end", std::to_string(b.consumed));
  return {};
}

// Why Beast did not take a message Smockron takes, refined where the cause is known.
std::string beast_cause(std::string_view in, const outcome& b, const outcome& s) {
  if (b.result == verdict::incomplete) return "incomplete " + std::string(phase_name(b.where));
  if (b.where == phase::head && b.ec == beast_http::error::bad_method && in.starts_with("\r\n")) {
    return "empty line before the request line";
  }
  if (b.where == phase::head && b.ec == beast_http::error::bad_value && connection_not_token_list(s.fields)) {
    return "Connection not a token list";
  }
  return "rejected in " + std::string(phase_name(b.where)) + ": " + b.why;
}

// The category of one message; `detail` says more for a disagreement.
std::string classify(std::string_view in, const hop& via, std::string& detail) {
  const outcome b = beast_parse(in);
  request_head h;
  std::string relayed;
  const outcome s = smockron_parse(in, h, relayed);
  const bool s_ok = s.result == verdict::accepted, b_ok = b.result == verdict::accepted;
  if (s_ok && b_ok) {
    const auto differ = [&](std::string_view what, std::string d) {
      detail = std::move(d);
      return "mismatch: " + std::string(what);
    };
    if (s.method != b.method) return differ("method", printable(s.method) + " vs " + printable(b.method));
    if (s.target != b.target) return differ("target", printable(s.target) + " vs " + printable(b.target));
    if (s.version != b.version) {
      return differ("version", std::to_string(s.version) + " vs " + std::to_string(b.version));
    }
    if (grouped(s.fields) != grouped(b.fields)) {
      return differ("header fields", show(s.fields) + " vs " + show(b.fields));
    }
    if (s.body != b.body || s.length != b.length) {
      return differ("body framing", std::string(framing_name(s.body)) + " " + std::to_string(s.length) + " vs " +
                                        std::string(framing_name(b.body)) + " " + std::to_string(b.length));
    }
    if (s.payload != b.payload) return differ("payload", printable(s.payload) + " vs " + printable(b.payload));
    if (s.consumed != b.consumed) {
      return differ("message end", std::to_string(s.consumed) + " vs " + std::to_string(b.consumed));
    }
    auto fwd = check_forwarded(h, relayed, via, b.fields, b, true);
    if (!fwd.kind.empty()) return differ("forwarded " + fwd.kind, std::move(fwd.detail));
    return "agree: both accept, " + std::string(framing_name(s.body));
  }
  if (s_ok) {
    auto fwd = check_forwarded(h, relayed, via, s.fields, s, true);
    const auto cause = beast_cause(in, b, s);
    if (fwd.kind.empty()) return "forwarded_same: " + cause;
    detail = "Beast on the original: " + cause + "; " + fwd.detail;
    return "forward_differs: " + fwd.kind;
  }
  if (b_ok) {
    if (s.result == verdict::rejected) return "smockron_stricter: " + s.why;
    return "smockron_incomplete: " + std::string(phase_name(s.where));
  }
  // Neither takes it. A chunked body Smockron is still reading has been
  // relayed as far as it went: Beast must not refuse (or end) that part.
  if (s.result == verdict::incomplete && s.where == phase::body) {
    auto fwd = check_forwarded(h, relayed, via, s.fields, s, false);
    if (!fwd.kind.empty()) {
      detail = "Smockron waits for more; " + fwd.detail;
      return "forward_differs: " + fwd.kind;
    }
  }
  if (s.result == b.result) return s.result == verdict::rejected ? "agree: both reject" : "agree: both incomplete";
  return "agree: one rejects, the other waits for more";
}

// ---- the generator -------------------------------------------------------------------

using views = std::span<const std::string_view>;

constexpr std::string_view k_methods[] = {"GET",      "POST",     "PUT",   "DELETE",  "PATCH",
                                          "HEAD",     "OPTIONS",  "TRACE", "CONNECT", "PROPFIND",
                                          "M-SEARCH", "X-CUSTOM", "get",   "Post",    "!#$%&'*+-.^_`|~"};
constexpr std::string_view k_odd_methods[] = {"",      "G@T",    "GE(T", "G\x80T",
                                              "GET:",  "[GET]",  "G,ET", std::string_view("GET\0", 4),
                                              "GE\"T", "G\x7fT", "GE/T", "G\x01T"};
constexpr std::string_view k_targets[] = {"/",
                                          "/index.html",
                                          "/a/b?c=d&e=f",
                                          "/%20x%2F%00",
                                          "http://example.com/",
                                          "http://u:p@example.com:8080/p?q#f",
                                          "*",
                                          "example.com:443",
                                          "/~user/!$&'()*+,;=:@",
                                          "/caf\xc3\xa9",
                                          "/\x80\xff",
                                          "/a/../b//c"};
constexpr std::string_view k_odd_targets[] = {"",
                                              "/a b",
                                              "/a\tb",
                                              "/a\x01"
                                              "b",
                                              "/a\x7f",
                                              "/a\rb",
                                              "/a\nb",
                                              std::string_view("/\0", 2),
                                              " /",
                                              "/a\x0b"};
constexpr std::string_view k_odd_versions[] = {"HTTP/1.2", "HTTP/2.0", "HTTP/0.9",   "http/1.1",  "HTTP/1.10",
                                               "HTTP/1",   "HTTP/11",  "HTTP/1.1 ",  "HTTP /1.1", "HTTP/1.a",
                                               "HTTP/3.0", "",         "HTTP/1.1\t", "HTTP/1.01", "HTTPS/1.1"};
constexpr std::string_view k_hosts[] = {"example.com", "example.com:8080", "[::1]:80", "a", "EXAMPLE.com."};
constexpr std::string_view k_odd_hosts[] = {"", "  padded  ", "ex ample", "exa\x01mple", "\xc3\xa9.example", "a,b"};
constexpr std::string_view k_fields[] = {
    "Accept: */*",
    "Accept-Encoding: gzip, deflate",
    "User-Agent: curl/8.0",
    "Cookie: a=b; c=d",
    "X-Request-Id: 42",
    "Connection: keep-alive",
    "Connection: close",
    "Connection: Upgrade",
    "connection: keep-alive, X-Hop",
    "Connection: X-Forwarded-For",
    "Connection: Expect",
    "Connection: Content-Length",
    "Connection: Host, Transfer-Encoding",
    "Connection: TE, Trailer",
    "Connection: , , close,",
    "Connection:",
    "Keep-Alive: timeout=5",
    "TE: trailers",
    "Trailer: X-Sum",
    "Upgrade: websocket",
    "Upgrade: h2c",
    "Upgrade:",
    "Proxy-Connection: keep-alive",
    "Proxy-Authorization: Basic YTpi",
    "Expect: 100-continue",
    "Expect: 100-Continue",
    "Expect: something",
    "X-Forwarded-For: 203.0.113.9",
    "X-Forwarded-For: 1.1.1.1, 2.2.2.2",
    "x-forwarded-for:",
    "X-Forwarded-Proto: https",
    "X-Forwarded-Host: public.example",
    "X-Hop: 1",
    "Forwarded: for=1.2.3.4",
    "X-Empty:",
    "X-Spaces:   a  b   ",
    "X-Tabs:\t\ta\tb\t",
    "X-Only-Space: \t ",
    "X-UTF8: caf\xc3\xa9",
    "X-Latin1: \xe9\xff",
    "x-lower: v",
    "X-UPPER: V",
    "X-Quote: \"q\"",
    "!#$%&'*+-.^_`|~: v",
    "X-Colons: a:b::c",
};
constexpr std::string_view k_odd_fields[] = {
    "Connection: a b",
    "Connection: close;x",
    "Proxy-Connection: a b",
    "Connection: \xe9",
    "X-A : v",
    "X-A\t: v",
    "X A: v",
    ": v",
    "X-No-Colon",
    "X(A): v",
    "X\xc3\xa4: v",
    "X-A:\x01v",
    "X-A: a\x7f"
    "b",
    std::string_view("X-A: a\0b", 8),
    "X-A: a\rb",
    "X-A: a\nb",
    "X-A: a\r\n b",
    "X-A: a\r\n\tb",
    "X-A:\r\n b",
    " X-A: leading space",
    "X-A: \x1b[31m",
};
constexpr std::string_view k_odd_lengths[] = {" # ",
                                              "\t#",
                                              "0#",
                                              "+#",
                                              "-#",
                                              "#, #",
                                              "#,#",
                                              "#,",
                                              ",#",
                                              "# #",
                                              "0x#",
                                              "",
                                              "1e3",
                                              "0000000000000000000#",
                                              "18446744073709551615",
                                              "18446744073709551616",
                                              "999999999999999999",
                                              "1000000000000000000",
                                              "#;",
                                              "#.0"};
constexpr std::string_view k_encodings[] = {"chunked", "chunked", "chunked", "Chunked", "CHUNKED", " chunked\t"};
constexpr std::string_view k_odd_encodings[] = {
    "gzip, chunked", "chunked, gzip", "gzip",     "identity",  "chunked, chunked", "",
    "chunked;q=1",   "chunked,",      ",chunked", "x-chunked", "chunked x",        "\"chunked\""};
constexpr std::string_view k_extensions[] = {
    ";a", ";a=b", ";name=\"quoted value\"", ";a=\"x\\\"y\"", " ;a=b", "\t;a=b", "; a = b", ";a;b=c", ";a=b;c=\"\""};
constexpr std::string_view k_odd_extensions[] = {
    ";",       ";=b",  ";a=",     ";a b", ";a=b c", ";a=\"open", " ",    " \t",     ";caf\xc3\xa9",  "x",
    ";a=\x01", ";(a)", ";a=\x7f", ";a,b", ";a=b;",  "; ",        ";a =", ";a=\"\\", ";a=\"x\x01y\"", ";a=\"\x7f\""};
constexpr std::string_view k_odd_sizes[] = {"# ",
                                            "#\t",
                                            " #",
                                            "# #",
                                            "-#",
                                            "0x#",
                                            "+#",
                                            "#g",
                                            "",
                                            "0000000000000000#",
                                            "fffffffffffffff",
                                            "ffffffffffffffff",
                                            "10000000000000000",
                                            "#;",
                                            "#,1"};
constexpr std::string_view k_trailers[] = {"X-Sum: 1", "X-Checksum: abc\r\nExpires: 0", "x-empty:"};
constexpr std::string_view k_odd_trailers[] = {
    "bad trailer",     " folded",   "X-A : b", "Content-Length: 5", "Transfer-Encoding: chunked",
    "Connection: a b", "X-A: \x01", ": v",     "X-A: a\r\n b",      "X-\xe9: v"};
constexpr std::string_view k_next_request = "GET /next HTTP/1.1\r\nHost: b\r\n\r\n";

// The parts of a message the generator can make odd.
enum class aspect : std::uint8_t {
  leading_lines,  // empty (or not quite empty) lines before the request line
  method,
  target,
  version,
  separator,        // between method and target
  line_end,         // a head line ending in LF, CR, CR CR LF
  host,             // none, two, or an odd value
  field,            // one odd field line
  long_field,       // a value of several KB
  length_value,     // Content-Length with sign, list, spaces, too many digits
  length_repeat,    // a second Content-Length, equal or not
  body_size,        // fewer or more bytes than Content-Length says
  both_framings,    // Content-Length and Transfer-Encoding
  encoding,         // a Transfer-Encoding other than "chunked"
  encoding_repeat,  // a second Transfer-Encoding line
  chunk_size,
  chunk_ext,
  long_chunk_ext,
  chunk_line_end,  // a size line ending in LF
  chunk_data,      // one byte more or less than the size
  chunk_end,       // no CRLF (or another one) after the data
  last_chunk,      // a last chunk of 17 zeros
  trailer,
  long_trailer,
  body_end,  // no (or a bare LF) final CRLF
  count_
};
constexpr std::size_t k_aspects = static_cast<std::size_t>(aspect::count_);

// Request messages from a fixed seed. `message` builds one from parts with
// none, one or a few of its aspects odd (one at a time is what reaches past
// the first check); `mutated` damages a valid one at the byte level.
class generator {
public:
  explicit generator(std::uint32_t seed) : rng_(seed) {}

  std::string message() {
    odd_.fill(false);
    const std::size_t n = below(100);
    for (std::size_t k = n < 30 ? 0 : n < 85 ? 1 : 2 + below(2); k > 0; --k) odd_[below(k_aspects)] = true;
    return build();
  }

  // A valid message with one to four byte-level mutations.
  std::string mutated() {
    odd_.fill(false);
    std::string m = build();
    static constexpr char k_raw[] =
        " \t\r\n:;,=\"\0\x01\x7f\x80\xff"
        "0fz-+";
    constexpr std::string_view k_bytes(k_raw, sizeof k_raw - 1);
    for (std::size_t k = 1 + below(4); k > 0 && !m.empty(); --k) {
      const std::size_t at = below(m.size());
      switch (below(9)) {
        case 0: m[at] = static_cast<char>(m[at] ^ (1 << below(8))); break;
        case 1: m[at] = k_bytes[below(k_bytes.size())]; break;
        case 2: m.insert(at, 1, k_bytes[below(k_bytes.size())]); break;
        case 3: m.erase(at, 1); break;
        case 4:
        case 5: {  // CRLF -> LF or CR
          const auto crlf = nth_crlf(m);
          if (crlf != std::string::npos) m.erase(crlf + (percent(70) ? 0 : 1), 1);
          break;
        }
        case 6: {  // a space or tab after a CRLF (obs-fold, leading whitespace) or before a colon
          const auto crlf = nth_crlf(m);
          const auto colon = m.find(':', at);
          const char ws = percent(50) ? ' ' : '\t';
          if (percent(50) && crlf != std::string::npos) m.insert(crlf + 2, 1, ws);
          else if (colon != std::string::npos) m.insert(colon, 1, ws);
          break;
        }
        case 7: {  // a line duplicated
          const auto begin = m.rfind("\r\n", at);
          const auto end = begin == std::string::npos ? begin : m.find("\r\n", begin + 2);
          if (end != std::string::npos) m.insert(end, m.substr(begin, end - begin));
          break;
        }
        default:
          if (percent(30)) m.resize(at);  // truncated
          break;
      }
    }
    return m;
  }

  bool percent(unsigned p) { return below(100) < p; }

private:
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(rng_() % n); }
  std::string_view pick(views from) { return from[below(from.size())]; }
  bool odd(aspect a) const { return odd_[static_cast<std::size_t>(a)]; }
  bool any_odd(std::initializer_list<aspect> as) const {
    return std::any_of(as.begin(), as.end(), [&](aspect a) { return odd(a); });
  }

  std::string build() {
    std::string m;
    if (odd(aspect::leading_lines)) m += pick(std::array<std::string_view, 4>{"\r\n", "\r\n\r\n", "\n", " \r\n"});
    const std::string_view version =
        odd(aspect::version) ? pick(k_odd_versions) : (percent(85) ? "HTTP/1.1" : "HTTP/1.0");
    const std::string_view sep = odd(aspect::separator) ? pick(std::array<std::string_view, 3>{"  ", "\t", ""}) : " ";
    m.append(odd(aspect::method) ? pick(k_odd_methods) : pick(k_methods)).append(sep);
    if (odd(aspect::target)) m.append(pick(k_odd_targets));
    else if (percent(1)) m.append("/" + std::string(2000, 'p'));
    else m.append(pick(k_targets));
    m.append(" ").append(version);

    std::vector<std::string> lines;
    const std::string_view host_name = percent(20) ? "host" : "Host";
    if (!odd(aspect::host)) {
      lines.push_back(std::string(host_name) + ": " + std::string(pick(k_hosts)));
    } else {
      switch (below(3)) {
        case 0: break;  // none
        case 1:
          lines.push_back("Host: " + std::string(pick(k_hosts)));
          lines.push_back(std::string(host_name) + ": " + std::string(pick(k_hosts)));
          break;
        default: lines.push_back("Host: " + std::string(pick(k_odd_hosts))); break;
      }
    }
    for (std::size_t n = below(7); n > 0; --n) lines.emplace_back(pick(k_fields));
    if (odd(aspect::field)) insert_line(lines, std::string(pick(k_odd_fields)));
    if (odd(aspect::long_field)) insert_line(lines, "X-Long: " + std::string(5000 + below(7000), 'v'));
    if (percent(1)) {
      for (int i = 0; i < 100; ++i) lines.push_back("X-N" + std::to_string(i) + ": " + std::to_string(i));
    }
    const std::string body = framing_and_body(lines);
    // Which line ends oddly (the request line is line 0, the blank line the last).
    const std::size_t odd_end = odd(aspect::line_end) ? below(lines.size() + 2) : lines.size() + 2;
    const auto eol = [&](std::size_t i) {
      return i == odd_end ? pick(std::array<std::string_view, 4>{"\n", "\r", "\r\r\n", "\n\r"}) : "\r\n";
    };
    m.append(eol(0));
    for (std::size_t i = 0; i < lines.size(); ++i) m.append(lines[i]).append(eol(i + 1));
    m.append(eol(lines.size() + 1)).append(body);
    if (percent(15)) m.append(k_next_request);
    return m;
  }

  std::string bytes(std::size_t n) {
    std::string s(n, 'x');
    const bool binary = percent(30);
    for (auto& c : s) c = binary ? static_cast<char>(below(256)) : static_cast<char>('a' + below(26));
    return s;
  }

  // "#" in a pattern stands for `n`.
  static std::string with_number(std::string_view pattern, std::string_view n) {
    std::string out;
    for (const char c : pattern) {
      if (c == '#') out.append(n);
      else out += c;
    }
    return out;
  }

  void insert_line(std::vector<std::string>& lines, std::string line) {
    lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(below(lines.size() + 1)), std::move(line));
  }

  // Adds the framing lines (at random places) and returns the body. An odd
  // aspect of one framing picks that framing.
  std::string framing_and_body(std::vector<std::string>& lines) {
    if (odd(aspect::both_framings)) {
      const std::string te = "Transfer-Encoding: " + std::string(percent(50) ? "chunked" : pick(k_odd_encodings));
      const std::string cl = "Content-Length: " + std::to_string(below(20));
      const bool te_first = percent(50);
      insert_line(lines, te_first ? te : cl);
      lines.push_back(te_first ? cl : te);
      return percent(50) ? chunked_body() : bytes(below(20));
    }
    const bool length = any_odd({aspect::length_value, aspect::length_repeat, aspect::body_size}) || (below(100) < 35);
    const bool chunked =
        !length && (any_odd({aspect::encoding, aspect::encoding_repeat, aspect::chunk_size, aspect::chunk_ext,
                             aspect::long_chunk_ext, aspect::chunk_line_end, aspect::chunk_data, aspect::chunk_end,
                             aspect::last_chunk, aspect::trailer, aspect::long_trailer, aspect::body_end}) ||
                    percent(55));
    if (length) {
      const std::size_t n = below(41);
      const std::string value =
          odd(aspect::length_value) ? with_number(pick(k_odd_lengths), std::to_string(n)) : std::to_string(n);
      insert_line(lines, (percent(20) ? "content-length: " : "Content-Length: ") + value);
      if (odd(aspect::length_repeat)) {
        insert_line(lines, "Content-Length: " + (percent(50) ? value : std::to_string(n + 1)));
      }
      std::string body = bytes(n);
      if (odd(aspect::body_size)) {
        if (percent(50) && !body.empty()) body.resize(below(body.size()));
        else body += bytes(1 + below(5));
      }
      return body;
    }
    if (chunked) {
      const std::string_view te = odd(aspect::encoding) ? pick(k_odd_encodings) : pick(k_encodings);
      insert_line(lines, (percent(20) ? "transfer-encoding: " : "Transfer-Encoding: ") + std::string(te));
      if (odd(aspect::encoding_repeat)) {
        insert_line(lines, "Transfer-Encoding: " + std::string(percent(50) ? "chunked" : pick(k_odd_encodings)));
      }
      return chunked_body();
    }
    return {};
  }

  std::string hex(std::size_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, percent(20) ? "%zX" : "%zx", n);
    return std::string(percent(10) ? below(3) + 1 : 0, '0') + buf;
  }

  std::string chunked_body() {
    std::string b;
    // An odd aspect of chunks shows in one chunk of each body (the last-chunk line counts as one).
    const std::size_t chunks = below(5);
    const std::size_t odd_one = below(chunks + 1);
    for (std::size_t i = 0; i < chunks; ++i) {
      const bool here = i == odd_one;
      const std::size_t n = 1 + below(40);
      b += here && odd(aspect::chunk_size) ? with_number(pick(k_odd_sizes), hex(n)) : hex(n);
      b += extension(here);
      b += here && odd(aspect::chunk_line_end) ? "\n" : "\r\n";
      std::string data = bytes(n);
      if (here && odd(aspect::chunk_data)) {
        if (percent(50)) data.pop_back();
        else data += 'x';
      }
      b += data;
      b += here && odd(aspect::chunk_end) ? pick(std::array<std::string_view, 4>{"", "\n", "\r", "XX"}) : "\r\n";
    }
    const bool here = odd_one == chunks;
    b += odd(aspect::last_chunk) ? "00000000000000000" : (percent(10) ? "000" : "0");
    b += extension(here);
    b += here && odd(aspect::chunk_line_end) ? "\n" : "\r\n";
    if (odd(aspect::trailer)) b.append(pick(k_odd_trailers)).append("\r\n");
    if (percent(15)) b.append(pick(k_trailers)).append("\r\n");
    if (odd(aspect::long_trailer)) b += "X-Long: " + std::string(k_max_line + 10, 't') + "\r\n";
    b += odd(aspect::body_end) ? pick(std::array<std::string_view, 2>{"", "\n"}) : "\r\n";
    return b;
  }

  std::string extension(bool here) {
    if (here && odd(aspect::long_chunk_ext)) return ";" + std::string(k_max_line + 10, 'e');
    if (here && odd(aspect::chunk_ext)) return std::string(pick(k_odd_extensions));
    return percent(20) ? std::string(pick(k_extensions)) : std::string();
  }

  // A random CRLF of `m` (npos if none).
  std::size_t nth_crlf(const std::string& m) {
    std::vector<std::size_t> at;
    for (auto p = m.find("\r\n"); p != std::string::npos; p = m.find("\r\n", p + 2)) at.push_back(p);
    return at.empty() ? std::string::npos : at[below(at.size())];
  }

  std::mt19937 rng_;
  std::array<bool, k_aspects> odd_{};
};

// ---- the suite -----------------------------------------------------------------------

struct tally {
  std::size_t count = 0;
  std::string example, detail;
};

TEST(Http1BeastDiff, GeneratedAndMutatedRequests) {
  constexpr std::size_t k_generated = 30'000, k_mutated = 30'000;
  generator gen(20240614);
  std::map<std::string, tally> seen;
  // Each message is forwarded with its own options: a trusted peer or not,
  // an RFC 7239 element or not, an IPv4 or IPv6 peer.
  const auto run = [&](const std::string& m) {
    const hop via{gen.percent(30) ? "2001:db8::7" : "192.0.2.1", gen.percent(20), gen.percent(30)};
    std::string detail;
    auto& t = seen[classify(m, via, detail)];
    if (t.count++ == 0) {
      t.example = printable(m, 300);
      t.detail = detail;
    }
  };
  for (std::size_t i = 0; i < k_generated; ++i) run(gen.message());
  for (std::size_t i = 0; i < k_mutated; ++i) run(gen.mutated());

  // The summary, quotable as it is.
  std::cout << "Beast differential: " << k_generated << " generated + " << k_mutated << " mutated requests\n";
  std::cout << "  count  category\n";
  for (const auto& [category, t] : seen) {
    char count[16];
    std::snprintf(count, sizeof count, "%7zu", t.count);
    std::cout << count << "  " << category << "\n";
  }
  std::cout << "First example of each disagreement:\n";
  for (const auto& [category, t] : seen) {
    if (category.starts_with("agree: ")) continue;
    std::cout << "  [" << category << "] " << t.example << (t.detail.empty() ? "" : "\n      " + t.detail) << "\n";
  }

  for (const auto& [category, t] : seen) {
    if (category.starts_with("agree: ")) continue;
    const bool listed = std::any_of(std::begin(k_allowed), std::end(k_allowed),
                                    [&](const allowed& a) { return a.category == category; });
    EXPECT_TRUE(listed) << "disagreement not in the allow-list: " << category << " (" << t.count << " cases), e.g. "
                        << t.example << (t.detail.empty() ? "" : "; " + t.detail);
  }
  // The list stays docs/security.md's truth: an entry nothing hits any more goes.
  for (const auto& a : k_allowed) EXPECT_TRUE(seen.contains(std::string(a.category))) << "stale entry: " << a.category;
  // The generator reaches past the first checks: many messages both accept, of each framing.
  EXPECT_GT(seen["agree: both accept, no body"].count, 2000u);
  EXPECT_GT(seen["agree: both accept, length"].count, 2000u);
  EXPECT_GT(seen["agree: both accept, chunked"].count, 2000u);
}

// ---- disagreements found and fixed --------------------------------------------------
//
// Minimal cases of what the differential test found in the chunked decoder:
// Beast refused the body (or never saw its end) while Smockron relayed it as
// received. Regressions now: each must agree, or disagree only in a listed way.

std::string chunked_post(std::string_view body) {
  return "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(body);
}

::testing::AssertionResult agrees_or_listed(std::string_view message) {
  std::string detail;
  const auto category = classify(message, hop{}, detail);
  const bool listed =
      std::any_of(std::begin(k_allowed), std::end(k_allowed), [&](const allowed& a) { return a.category == category; });
  if (category.starts_with("agree: ") || listed) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << printable(message) << " gave " << category << "; " << detail;
}

// RFC 9112 7.1.1: BWS after the size only before ";". Smockron takes "1 " alone.
TEST(Http1BeastDiffFixed, WhitespaceAfterChunkSizeWithoutExtension) {
  for (const std::string_view body : {"1 \r\nx\r\n0\r\n\r\n", "0\t\r\n\r\n"}) {
    EXPECT_EQ(beast_parse(chunked_post(body)).result, verdict::rejected) << printable(body);
    EXPECT_TRUE(agrees_or_listed(chunked_post(body)));
  }
}

// chunk-ext = *( BWS ";" BWS token [ BWS "=" BWS ( token / quoted-string ) ] ):
// Smockron takes any bytes but controls after ";".
TEST(Http1BeastDiffFixed, ChunkExtensionSyntax) {
  for (const std::string_view ext : {";", ";a=", ";=b", ";a b", ";a=b c", ";(a)", ";a,b", ";a=b;"}) {
    const std::string body = "1" + std::string(ext) + "\r\nx\r\n0\r\n\r\n";
    EXPECT_EQ(beast_parse(chunked_post(body)).result, verdict::rejected) << printable(body);
    EXPECT_TRUE(agrees_or_listed(chunked_post(body)));
  }
}

// A quoted extension value without its closing quote: Beast looks for the
// quote past the end of the line and never finds the end of the message;
// Smockron relays the whole body.
TEST(Http1BeastDiffFixed, UnterminatedQuotedChunkExtension) {
  const std::string m = chunked_post("1;a=\"open\r\nx\r\n0\r\n\r\n");
  EXPECT_EQ(beast_parse(m).result, verdict::incomplete);
  EXPECT_TRUE(agrees_or_listed(m));
}

// Trailer lines are field lines (RFC 9112 7.1.2): Smockron takes any line
// without controls, so a request pipelined after a last chunk that lacks its
// blank line is relayed as the first request's trailers.
TEST(Http1BeastDiffFixed, TrailerLineSyntax) {
  for (const std::string_view body : {"0\r\nbad\r\n\r\n", "0\r\nX-A : b\r\n\r\n", "0\r\n: v\r\n\r\n",
                                      "0\r\n folded\r\n\r\n", "0\r\nGET /next HTTP/1.1\r\nHost: b\r\n\r\n"}) {
    EXPECT_EQ(beast_parse(chunked_post(body)).result, verdict::rejected) << printable(body);
    EXPECT_TRUE(agrees_or_listed(chunked_post(body)));
  }
}

// Framing and connection fields in trailers (RFC 9110 6.5.1: not allowed
// there): Beast applies its header checks to them and refuses; Smockron
// relays them.
TEST(Http1BeastDiffFixed, FramingFieldsInTrailers) {
  for (const std::string_view body :
       {"0\r\nContent-Length: 5\r\n\r\n", "0\r\nTransfer-Encoding: chunked\r\n\r\n", "0\r\nConnection: a b\r\n\r\n"}) {
    EXPECT_EQ(beast_parse(chunked_post(body)).result, verdict::rejected) << printable(body);
    EXPECT_TRUE(agrees_or_listed(chunked_post(body)));
  }
}

}  // namespace
}  // namespace smockron::proxy::http1
