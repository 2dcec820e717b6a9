// HTTP/1.1 message heads and chunked framing for the proxy's request path,
// without allocation per message: heads are parsed in place (names and values
// are views into the connection's buffer) and rewritten for the next hop in
// one pass. Strict where smuggling lives (RFC 9112): CRLF only, no obs-fold,
// one Content-Length, Transfer-Encoding exactly "chunked" and never together
// with Content-Length, valid chunk sizes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace smockron::proxy::http1 {

bool iequals(std::string_view a, std::string_view b);
/// RFC 9110 9.2.2: a proxy must not resend a request of any other method (POST, PATCH, ...).
inline bool idempotent(std::string_view m) {
  return m == "GET" || m == "HEAD" || m == "OPTIONS" || m == "PUT" || m == "DELETE" || m == "TRACE";
}
/// True when the comma-separated `list` holds `token` (case-insensitive).
bool has_token(std::string_view list, std::string_view token);
/// Whether `host` is a valid Host field value or :authority (RFC 9112 3.2,
/// RFC 9113 8.3.1): uri-host [":" port], empty allowed. No userinfo (`@`),
/// no path, no spaces: what no server would read as the same host.
bool valid_host(std::string_view host);

struct header {
  std::string_view name, value;
};

/// Header lines in arrival order; names compare case-insensitively. Views:
/// the bytes they point into must outlive the list.
class header_list {
public:
  void clear() { items_.clear(); }
  void insert(std::string_view name, std::string_view value) { items_.push_back({name, value}); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  std::size_t size() const { return items_.size(); }

  /// Calls f(value) for each line called `name` until f returns true; returns whether one did.
  template <class F>
  bool for_each(std::string_view name, F&& f) const {
    for (const auto& h : items_) {
      if (iequals(h.name, name) && f(h.value)) return true;
    }
    return false;
  }
  /// The same, from the last line to the first.
  template <class F>
  bool for_each_reverse(std::string_view name, F&& f) const {
    for (auto it = items_.rbegin(); it != items_.rend(); ++it) {
      if (iequals(it->name, name) && f(it->value)) return true;
    }
    return false;
  }
  std::optional<std::string_view> first(std::string_view name) const;
  std::size_t count(std::string_view name) const;
  /// Views into [from, from + n) move to the same offsets from `to` (see rebase()).
  void rebase(const char* from, std::size_t n, const char* to);

private:
  std::vector<header> items_;
};

/// How a message body is delimited.
enum class framing : std::uint8_t { none, length, chunked, until_close };

/// Whether any Connection field lists `token`.
bool connection_has(const header_list& h, std::string_view token);

struct request_head {
  std::string_view method, target, host;
  unsigned version = 11;  ///< 10 or 11
  header_list headers;
  std::size_t size = 0;  ///< bytes of the head, blank line included
  framing body = framing::none;
  std::uint64_t content_length = 0;
  bool keep_alive = true;
  bool expect_continue = false;
  bool upgrade = false;  ///< Upgrade with "Connection: upgrade" (WebSocket and friends)
  bool head = false;     ///< method HEAD
  bool has_host = false;
};

/// The head's buffer moved (from `from`, `n` bytes, to `to`): the views of `r`
/// that pointed into it point into the new one; others (a target the proxy
/// rewrote, kept elsewhere) stay.
void rebase(request_head& r, const char* from, std::size_t n, const char* to);

struct response_head {
  unsigned status = 0;
  unsigned version = 11;
  std::string_view reason;
  header_list headers;
  std::size_t size = 0;
  framing body = framing::none;
  std::uint64_t content_length = 0;
  bool keep_alive = true;
  bool transfer_encoded = false;  ///< has Transfer-Encoding (chunked or not)
};

enum class parse_status : std::uint8_t { complete, incomplete, bad, line_too_long, headers_too_large };

struct parse_result {
  parse_status status = parse_status::incomplete;
  std::string_view reason;  ///< for bad: what was wrong (static text)
};

/// Parses a request head from the start of `data`. Incomplete until the blank
/// line is in `data`; line_too_long / headers_too_large once `max_head` bytes
/// hold no complete head. Leading empty lines are skipped (RFC 9112 2.2).
parse_result parse_request(std::string_view data, std::size_t max_head, request_head& out);
/// The same, resumable: `scanned` (start at 0) keeps the search for the blank
/// line from rescanning bytes it has seen when more arrive.
parse_result parse_request(std::string_view data, std::size_t max_head, request_head& out, std::size_t& scanned);

/// Parses a response head. `request_was_head`: the body is none whatever the headers say.
parse_result parse_response(std::string_view data, std::size_t max_head, bool request_was_head, response_head& out);
parse_result parse_response(std::string_view data, std::size_t max_head, bool request_was_head, response_head& out,
                            std::size_t& scanned);

/// Incremental chunked-body decoder (RFC 9112 7.1): tracks framing so the
/// proxy knows where the message ends, and hands out the payload data.
/// Everything it accepts is relayed as is, so it accepts only what the
/// grammar allows: chunk extensions as `;name[=token|"quoted"]` with BWS
/// around `;` and `=`; trailer lines as field lines (`name:value`, no
/// obs-fold), never a framing, routing or connection field (RFC 9110
/// 6.5.1). A request pipelined after a body that lacks its final blank line
/// is thus refused, not taken for trailers.
class chunked_decoder {
public:
  explicit chunked_decoder(std::size_t max_line = 4096) : max_line_(max_line) {}

  /// Consumes bytes of `in` (framing, then at most one run of payload data)
  /// and returns how many; `data` is set to the payload run, which is the
  /// tail of the consumed bytes (possibly empty). Stops at the end of the
  /// message (done()). Returns nullopt on malformed framing (error()).
  std::optional<std::size_t> feed(std::string_view in, std::string_view& data);
  bool done() const { return state_ == state::done; }
  std::string_view error() const { return error_; }
  /// When set, the trailer section's bytes are appended here as they are
  /// decoded (lines end with CR; LFs may be dropped): see trailer_fields().
  std::string* keep_trailers = nullptr;

private:
  enum class state : std::uint8_t {
    size,
    size_ws,      // BWS after the size: only ";" may follow
    ext_name_ws,  // BWS after ";"
    ext_name,
    ext_name_end,  // BWS after a name: "=" or ";"
    ext_value_ws,  // BWS after "="
    ext_token,
    ext_quoted,
    ext_quoted_pair,
    ext_quote_end,  // after a quoted value's closing quote
    ext_value_end,  // BWS after a value: ";" only
    size_lf,
    data,
    data_cr,
    data_lf,
    trailer,  // the start of a trailer line (or of the final blank line)
    trailer_name,
    trailer_value,
    trailer_lf,
    done,
    failed
  };
  bool fail(std::string_view why);
  bool size_line(unsigned char c);
  // The trailer field named so far (its first bytes): a framing, routing or connection field is refused.
  bool forbidden_trailer() const;

  state state_ = state::size;
  std::uint64_t remaining_ = 0;
  std::size_t digits_ = 0;
  std::size_t line_ = 0;  // bytes of the current size line
  std::size_t trailer_bytes_ = 0;
  bool line_empty_ = true;  // the current trailer line has no bytes yet
  std::array<char, 20> name_{};
  std::size_t name_len_ = 0;
  std::size_t max_line_;
  std::string_view error_;
};

/// Calls f(name, value) for each field of a trailer section kept by
/// chunked_decoder::keep_trailers (already checked by the decoder); values
/// have their surrounding whitespace trimmed.
template <class F>
void trailer_fields(std::string_view kept, F&& f) {
  while (!kept.empty()) {
    const auto end = kept.find('\r');
    std::string_view line = kept.substr(0, end);
    kept.remove_prefix(end == std::string_view::npos ? kept.size() : end + 1);
    while (!line.empty() && line.front() == '\n') line.remove_prefix(1);
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    f(line.substr(0, colon), value);
  }
}

/// What the proxy adds when it forwards a request.
struct forward_info {
  std::string_view peer_ip;  ///< the address this request came from: appended to X-Forwarded-For
  std::string_view proto = "http";
  bool tunnel = false;  ///< keep Upgrade and send "Connection: upgrade"
  /// The peer is a trusted proxy: its X-Forwarded-Proto and X-Forwarded-Host
  /// are kept (it terminated TLS, it saw the original host); from anyone
  /// else they are replaced.
  bool trusted_peer = false;
  /// Also append an RFC 7239 Forwarded element for this hop
  /// (`for=PEER;host="HOST";proto=PROTO`) after those received.
  bool forwarded_element = false;
};

/// True for a header the proxy never forwards as-is: hop-by-hop (Connection
/// and what it lists, Keep-Alive, TE, Trailer, Upgrade, Proxy-*).
bool is_hop_by_hop(std::string_view name, const header_list& h, bool tunnel);

/// is_hop_by_hop for every field of one head, its Connection lines gathered
/// once (not once per field).
class hop_by_hop_filter {
public:
  explicit hop_by_hop_filter(const header_list& h);
  bool operator()(std::string_view name, bool tunnel = false) const;

private:
  std::array<std::string_view, 4> lists_{};
  std::size_t count_ = 0;
  bool overflow_ = false;
  const header_list* all_;
};

/// Appends the request head as sent upstream (always HTTP/1.1): hop-by-hop
/// headers and Expect: 100-continue removed, X-Forwarded-For extended,
/// X-Forwarded-Proto / -Host set, Host kept.
void write_request_head(std::string& out, const request_head& req, const forward_info& info);

/// Appends the response head as sent to the client: hop-by-hop headers
/// removed, status line in the client's version, framing as `body` (a body
/// the upstream delimited by closing is re-framed as chunked for an HTTP/1.1
/// client; a chunked one is de-chunked for HTTP/1.0), Connection as `keep_alive`.
/// `extra`: complete header lines of the proxy's own (each ending CRLF) added to the head.
void write_response_head(std::string& out, const response_head& res, unsigned client_version, framing body,
                         bool keep_alive, bool tunnel, std::string_view extra = {});

/// A small response generated by the proxy itself.
void write_simple_response(std::string& out, unsigned version, unsigned status, std::string_view body, bool keep_alive,
                           std::int64_t retry_after_s = 0, std::string_view extra = {});

/// Reason phrase of the status codes the proxy generates ("" for others).
std::string_view reason_phrase(unsigned status);

}  // namespace smockron::proxy::http1
