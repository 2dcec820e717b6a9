// HTTP/2 field sections (see h2_fields.hpp).
#include "proxy/codec/h2_fields.hpp"

#include <algorithm>
#include <array>
#include <charconv>

namespace smockron::proxy::h2 {
namespace {

constexpr std::size_t k_field_overhead = 32;  // RFC 9113 6.5.2, SETTINGS_MAX_HEADER_LIST_SIZE

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// Reserves room for `n` more bytes and appends `s` lower-cased; returns where it starts.
std::uint32_t put(std::string& arena, std::string_view s, bool lowercase = false) {
  const auto at = static_cast<std::uint32_t>(arena.size());
  arena.append(s);
  if (lowercase) std::transform(arena.begin() + at, arena.end(), arena.begin() + at, lower);
  return at;
}

// Bytes and fields of a head, for reserving once.
std::pair<std::size_t, std::size_t> measure(const http1::header_list& h, std::string_view extra) {
  std::size_t bytes = extra.size() + 64;
  for (const auto& f : h) bytes += f.name.size() + f.value.size();
  return {h.size() + 8, bytes};
}

struct pending_field {
  std::uint32_t name_at, name_len, value_at, value_len;
};

// Fields whose bytes go into `arena` first and become views at the end (the arena grows meanwhile).
struct field_builder {
  std::string& arena;
  std::vector<pending_field> items;

  field_builder(std::string& a, std::size_t fields, std::size_t bytes) : arena(a) {
    arena.clear();
    arena.reserve(bytes);
    items.reserve(fields);
  }
  void add(std::string_view name, std::string_view value, bool lowercase_name) {
    const auto n = put(arena, name, lowercase_name);
    const auto v = put(arena, value);
    items.push_back({n, static_cast<std::uint32_t>(name.size()), v, static_cast<std::uint32_t>(value.size())});
  }
  // `extra`: "Name: value\r\n" lines of the proxy's own.
  void add_lines(std::string_view extra) {
    while (!extra.empty()) {
      const auto eol = extra.find("\r\n");
      const std::string_view line = extra.substr(0, eol);
      extra.remove_prefix(eol == std::string_view::npos ? extra.size() : eol + 2);
      const auto colon = line.find(':');
      if (colon == std::string_view::npos) continue;
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      add(line.substr(0, colon), value, true);
    }
  }
  void done(std::vector<field>& out) const {
    out.clear();
    out.reserve(items.size());
    for (const auto& p : items) {
      out.push_back({{arena.data() + p.name_at, p.name_len}, {arena.data() + p.value_at, p.value_len}});
    }
  }
};

std::string_view status_text(unsigned status, std::array<char, 4>& buf) {
  const auto r = std::to_chars(buf.data(), buf.data() + 3, status % 1000);
  return {buf.data(), static_cast<std::size_t>(r.ptr - buf.data())};
}

}  // namespace

bool connection_specific(std::string_view name) {
  return http1::iequals(name, "connection") || http1::iequals(name, "keep-alive") ||
         http1::iequals(name, "proxy-connection") || http1::iequals(name, "transfer-encoding") ||
         http1::iequals(name, "upgrade");
}

bool request_fields::add(std::string_view name, std::string_view value) {
  if (too_large_) return false;
  bytes_ += name.size() + value.size() + k_field_overhead;
  if (bytes_ > max_bytes_) {
    too_large_ = true;
    return false;
  }
  if (!error_.empty()) return true;  // malformed already: the rest does not matter
  // RFC 9113 8.2.1 (nghttp2 checks it too; the codec does not lean on that).
  if (std::any_of(name.begin(), name.end(), [](char c) { return c >= 'A' && c <= 'Z'; })) {
    error_ = "upper-case field name";
    return true;
  }
  const auto span_of = [&] {
    const auto n = put(arena_, name);
    const auto v = put(arena_, value);
    return span{n, static_cast<std::uint32_t>(name.size()), v, static_cast<std::uint32_t>(value.size())};
  };
  if (!name.empty() && name.front() == ':') {
    if (pseudo_done_) {
      error_ = "pseudo-header after a regular field";
      return true;
    }
    // Pseudo-headers are kept as regular spans with a marker: finish() picks them out.
    static constexpr std::array<std::string_view, 4> k_pseudo = {":method", ":scheme", ":authority", ":path"};
    bool known = false;
    for (const auto p : k_pseudo) known = known || name == p;
    if (!known) {
      error_ = "unknown pseudo-header";
      return true;
    }
    for (const auto& s : offsets_) {
      if (at(s.name_at, s.name_len) == name) {
        error_ = "repeated pseudo-header";
        return true;
      }
    }
    offsets_.push_back(span_of());
    return true;
  }
  pseudo_done_ = true;
  if (connection_specific(name)) {
    error_ = "connection-specific field";
    return true;
  }
  if (name == "te" && value != "trailers") {
    error_ = "te other than trailers";
    return true;
  }
  if (name == "cookie") {
    if (!cookie_.empty()) cookie_.append("; ");
    cookie_.append(value);
    return true;
  }
  if (name == "content-length") {
    if (has_content_length_) {
      error_ = "repeated content-length";
      return true;
    }
    has_content_length_ = true;
  }
  offsets_.push_back(span_of());
  return true;
}

std::string_view request_fields::finish(bool end_stream, http1::request_head& out) {
  if (!error_.empty()) return error_;
  // Room was reserved for a typical section; a held stream keeps only what was used.
  arena_.shrink_to_fit();
  offsets_.shrink_to_fit();
  out = http1::request_head{};
  std::string_view host_field, content_length;
  for (const auto& s : offsets_) {
    const std::string_view n = at(s.name_at, s.name_len), v = at(s.value_at, s.value_len);
    if (n == ":method") method_ = v;
    else if (n == ":scheme") scheme_ = v;
    else if (n == ":authority") authority_ = v;
    else if (n == ":path") path_ = v;
    else {
      if (n == "host") host_field = v;
      else if (n == "content-length") content_length = v;
      else if (n == "content-type") content_type_ = v;
      else if (n == "grpc-timeout") grpc_timeout_ = v;
    }
  }
  if (method_.empty()) return "missing :method";
  if (method_ == "CONNECT") return "CONNECT is not supported";
  if (scheme_.empty()) return "missing :scheme";
  if (path_.empty()) return "missing :path";
  if (path_.front() != '/' && !(path_ == "*" && method_ == "OPTIONS")) return "invalid :path";
  if (authority_.empty()) {
    authority_ = host_field;
  } else if (!host_field.empty() && !http1::iequals(host_field, authority_)) {
    return "host differs from :authority";
  }
  if (!http1::valid_host(authority_)) return "invalid :authority";  // userinfo, paths (RFC 9113 8.3.1)
  out.method = method_;
  out.target = path_;
  out.host = authority_;
  out.has_host = !authority_.empty();
  out.version = 11;
  out.head = method_ == "HEAD";
  if (!authority_.empty()) out.headers.insert("host", authority_);
  for (const auto& s : offsets_) {
    const std::string_view n = at(s.name_at, s.name_len);
    if (n.front() == ':' || n == "host") continue;
    out.headers.insert(n, at(s.value_at, s.value_len));
  }
  if (!cookie_.empty()) out.headers.insert("cookie", cookie_);
  if (!content_length.empty()) {
    std::uint64_t n = 0;
    const auto r = std::from_chars(content_length.data(), content_length.data() + content_length.size(), n);
    if (r.ec != std::errc() || r.ptr != content_length.data() + content_length.size()) return "invalid content-length";
    out.body = http1::framing::length;
    out.content_length = n;
    if (end_stream && n != 0) return "content-length with no body";
  } else if (!end_stream) {
    // A body of unknown length goes to an HTTP/1.1 server chunked.
    out.body = http1::framing::chunked;
    out.headers.insert("transfer-encoding", "chunked");
  }
  return {};
}

void response_fields(const http1::response_head& res, std::string_view extra, bool keep_length, std::string& arena,
                     std::vector<field>& out) {
  const auto [fields, bytes] = measure(res.headers, extra);
  field_builder b(arena, fields, bytes);
  std::array<char, 4> buf{};
  b.add(":status", status_text(res.status, buf), false);
  const http1::hop_by_hop_filter hop_by_hop(res.headers);
  for (const auto& f : res.headers) {
    if (hop_by_hop(f.name) || connection_specific(f.name)) continue;
    if (!keep_length && http1::iequals(f.name, "content-length")) continue;
    b.add(f.name, f.value, true);
  }
  b.add_lines(extra);
  b.done(out);
}

void simple_response_fields(unsigned status, std::int64_t retry_after_s, std::string_view extra, std::string& arena,
                            std::vector<field>& out) {
  field_builder b(arena, 8, extra.size() + 64);
  std::array<char, 4> buf{};
  b.add(":status", status_text(status, buf), false);
  b.add("content-type", "text/plain", false);
  if (retry_after_s > 0) b.add("retry-after", std::to_string(retry_after_s), false);
  b.add_lines(extra);
  b.done(out);
}

void copy_fields(const std::vector<field>& in, std::string& arena, std::vector<field>& out) {
  std::size_t bytes = 0;
  for (const auto& f : in) bytes += f.name.size() + f.value.size();
  field_builder b(arena, in.size(), bytes);
  for (const auto& f : in) b.add(f.name, f.value, false);
  b.done(out);
}

void line_fields(std::string_view extra, std::string& arena, std::vector<field>& out) {
  field_builder b(arena, 4, extra.size());
  b.add_lines(extra);
  std::vector<field> more;
  b.done(more);
  out.insert(out.end(), more.begin(), more.end());
}

void upstream_request_fields(const http1::request_head& req, const http1::forward_info& info, std::string_view scheme,
                             std::string& arena, std::vector<field>& out) {
  const auto [fields, bytes] = measure(req.headers, req.target);
  field_builder b(arena, fields, bytes + req.host.size() * 2 + info.peer_ip.size());
  b.add(":method", req.method, false);
  b.add(":scheme", scheme, false);
  if (!req.host.empty()) b.add(":authority", req.host, false);
  b.add(":path", req.target, false);
  std::string xff;
  bool has_proto = false, has_host = false;
  const http1::hop_by_hop_filter hop_by_hop(req.headers);
  for (const auto& f : req.headers) {
    if (http1::iequals(f.name, "host") || connection_specific(f.name) || hop_by_hop(f.name)) {
      // TE is hop-by-hop, but "te: trailers" says the client takes trailers (gRPC needs it).
      if (http1::iequals(f.name, "te") && f.value == "trailers") b.add("te", "trailers", false);
      continue;
    }
    if (http1::iequals(f.name, "x-forwarded-for")) {
      xff.append(f.value).append(", ");
      continue;
    }
    if (http1::iequals(f.name, "x-forwarded-proto")) {
      if (!info.trusted_peer) continue;
      has_proto = true;
    }
    if (http1::iequals(f.name, "x-forwarded-host")) {
      if (!info.trusted_peer) continue;
      has_host = true;
    }
    b.add(f.name, f.value, true);
  }
  xff.append(info.peer_ip);
  b.add("x-forwarded-for", xff, false);
  if (!has_proto) b.add("x-forwarded-proto", info.proto, false);
  if (!has_host && !req.host.empty()) b.add("x-forwarded-host", req.host, false);
  b.done(out);
}

namespace grpc {

bool is_grpc(std::string_view ct) {
  constexpr std::string_view k = "application/grpc";
  if (ct.size() < k.size() || !http1::iequals(ct.substr(0, k.size()), k)) return false;
  return ct.size() == k.size() || ct[k.size()] == '+' || ct[k.size()] == ';';
}

std::optional<std::chrono::microseconds> parse_timeout(std::string_view v) {
  if (v.size() < 2 || v.size() > 9) return std::nullopt;
  std::int64_t n = 0;
  for (const char c : v.substr(0, v.size() - 1)) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  using namespace std::chrono;
  switch (v.back()) {
    case 'H': return duration_cast<microseconds>(hours(n));
    case 'M': return duration_cast<microseconds>(minutes(n));
    case 'S': return duration_cast<microseconds>(seconds(n));
    case 'm': return duration_cast<microseconds>(milliseconds(n));
    case 'u': return microseconds(n);
    case 'n': return microseconds((n + 999) / 1000);
    default: return std::nullopt;
  }
}

unsigned status_for_http(unsigned s) {
  switch (s) {
    case 400: return 13;
    case 401: return 16;
    case 403: return 7;
    case 404: return 12;
    case 429:
    case 502:
    case 503:
    case 504: return 14;
    default: return 2;
  }
}

std::string encode_message(std::string_view text) {
  static constexpr char k_hex[] = "0123456789ABCDEF";
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c <= 0x7E && c != '%') {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(k_hex[c >> 4]);
      out.push_back(k_hex[c & 15]);
    }
  }
  return out;
}

void refusal_fields(unsigned grpc_status, std::string_view message, std::int64_t pushback_ms, std::string_view extra,
                    std::string& arena, std::vector<field>& out) {
  field_builder b(arena, 8, message.size() * 3 + extra.size() + 96);
  b.add(":status", "200", false);
  b.add("content-type", "application/grpc", false);
  b.add("grpc-status", std::to_string(grpc_status), false);
  b.add("grpc-message", encode_message(message), false);
  if (pushback_ms >= 0) b.add("grpc-retry-pushback-ms", std::to_string(pushback_ms), false);
  b.add_lines(extra);
  b.done(out);
}

}  // namespace grpc
}  // namespace smockron::proxy::h2
