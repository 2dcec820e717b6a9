// HTTP/2 field sections as the proxy's request path sees them (RFC 9113
// 8.2-8.3), without I/O: a request's decoded fields (pseudo-headers first)
// become the same request head an HTTP/1.1 request parses into, so routing,
// identification and the gate treat both alike; an HTTP/1.1 response head
// becomes an HTTP/2 field list; and the gRPC parts the gate needs (is a
// request gRPC, its grpc-timeout, the status of a refusal). libnghttp2
// decodes HPACK and checks field syntax; this checks what it leaves to the
// application (the pseudo-header set, Host against :authority, framing and
// connection-specific fields) and bounds the section's size.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/codec/http1.hpp"

namespace smockron::proxy::h2 {

/// One field as sent on HTTP/2 (names in lower case).
struct field {
  std::string_view name, value;
};

/// A request's field section, gathered one field at a time as HPACK decodes
/// it, then turned into an http1::request_head (finish()). Bytes live in one
/// arena owned here: the head's views point into it.
class request_fields {
public:
  /// `max_bytes`: the section's size at most, each field counted as name +
  /// value + 32 (as SETTINGS_MAX_HEADER_LIST_SIZE counts).
  explicit request_fields(std::size_t max_bytes) : max_bytes_(max_bytes) {
    arena_.reserve(512);
    offsets_.reserve(16);
  }

  /// Adds one decoded field. False once the section is over its size (the
  /// rest is then ignored: too_large()).
  bool add(std::string_view name, std::string_view value);
  bool too_large() const { return too_large_; }

  /// Builds `out` (its views point into this object, which must outlive it
  /// and not be added to again). `end_stream`: the HEADERS frame ended the
  /// stream (no body). Returns an empty string, or why the request is
  /// malformed (RFC 9113 8.1.1: answered 400, the stream reset).
  std::string_view finish(bool end_stream, http1::request_head& out);

  /// The content-type (empty: none).
  std::string_view content_type() const { return content_type_; }
  std::string_view grpc_timeout() const { return grpc_timeout_; }

private:
  struct span {
    std::uint32_t name_at, name_len, value_at, value_len;
  };
  std::string_view at(std::uint32_t pos, std::uint32_t len) const { return {arena_.data() + pos, len}; }

  std::string arena_;
  std::vector<span> offsets_;  ///< regular fields, cookies joined into one
  std::size_t max_bytes_;
  std::size_t bytes_ = 0;
  bool too_large_ = false;
  std::string_view error_;
  std::string_view method_, scheme_, authority_, path_, content_type_, grpc_timeout_;
  std::string cookie_;  ///< cookie crumbs joined with "; " (RFC 9113 8.2.3)
  bool pseudo_done_ = false;
  bool has_content_length_ = false;
};

/// Whether `name` is a field HTTP/2 forbids (connection-specific, RFC 9113
/// 8.2.2): Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding, Upgrade.
bool connection_specific(std::string_view name);

/// An HTTP/1.1 response head as HTTP/2 fields: ":status", then the fields
/// without hop-by-hop ones, names in lower case, then `extra` (the proxy's
/// own "Name: value\r\n" lines). Content-Length is kept only when
/// `keep_length` (the body is relayed as framed). Views point into `arena`
/// (cleared first) and `res`'s buffer.
void response_fields(const http1::response_head& res, std::string_view extra, bool keep_length, std::string& arena,
                     std::vector<field>& out);

/// Fields for a response of the proxy's own: ":status", content-type,
/// retry-after when `retry_after_s` > 0, and `extra` lines.
void simple_response_fields(unsigned status, std::int64_t retry_after_s, std::string_view extra, std::string& arena,
                            std::vector<field>& out);

/// Copies `in` (views into bytes that may go) into `out`, whose views point into `arena`.
void copy_fields(const std::vector<field>& in, std::string& arena, std::vector<field>& out);

/// `extra` ("Name: value\r\n" lines of the proxy's own) as fields, appended to `out`; views into `arena` (cleared
/// first).
void line_fields(std::string_view extra, std::string& arena, std::vector<field>& out);

/// The fields of `req` as sent to an HTTP/2 server: pseudo-headers (":scheme"
/// `scheme`), then the fields without hop-by-hop and connection-specific ones,
/// names in lower case, X-Forwarded-* as write_request_head adds them (http1.hpp).
void upstream_request_fields(const http1::request_head& req, const http1::forward_info& info, std::string_view scheme,
                             std::string& arena, std::vector<field>& out);

/// gRPC (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md).
namespace grpc {
/// "application/grpc", alone or followed by "+proto", ";..." and the like.
bool is_grpc(std::string_view content_type);
/// "grpc-timeout": up to 8 digits and a unit (H, M, S, m, u, n). Nothing when malformed.
std::optional<std::chrono::microseconds> parse_timeout(std::string_view v);
/// The grpc-status a client sees for an HTTP status the proxy answers with
/// (the spec's mapping: 400 INTERNAL 13, 401 UNAUTHENTICATED 16, 403
/// PERMISSION_DENIED 7, 404 UNIMPLEMENTED 12, 429/502/503/504 UNAVAILABLE 14,
/// others UNKNOWN 2).
unsigned status_for_http(unsigned http_status);
/// `text` percent-encoded as grpc-message wants it (outside 0x20-0x7E, and %).
std::string encode_message(std::string_view text);
/// Fields of a trailers-only response: ":status" 200, content-type
/// application/grpc, grpc-status, grpc-message, grpc-retry-pushback-ms
/// when `pushback_ms` >= 0, then `extra` lines.
void refusal_fields(unsigned grpc_status, std::string_view message, std::int64_t pushback_ms, std::string_view extra,
                    std::string& arena, std::vector<field>& out);
}  // namespace grpc

}  // namespace smockron::proxy::h2
