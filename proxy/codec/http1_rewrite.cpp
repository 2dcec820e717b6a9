// HTTP/1.1 header rewriting for forwarding (see http1.hpp): hop-by-hop
// fields removed, X-Forwarded-* added, framing chosen per side.
#include "proxy/codec/http1.hpp"

#include <array>
#include <charconv>
#include <cstdio>

namespace smockron::proxy::http1 {

namespace {

// Connection header values of a head, gathered once per rewrite.
struct connection_lists {
  std::array<std::string_view, 4> values{};
  std::size_t count = 0;
  bool overflow = false;
  const header_list* all = nullptr;

  connection_lists() = default;
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
    case 14:
      // The h2c upgrade's settings (RFC 7540 3.2.1): for this hop alone, and h2c is never relayed.
      if (iequals(name, "HTTP2-Settings")) return true;
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

hop_by_hop_filter::hop_by_hop_filter(const header_list& h) : all_(&h) {
  const connection_lists c(h);
  lists_ = c.values;
  count_ = c.count;
  overflow_ = c.overflow;
}

bool hop_by_hop_filter::operator()(std::string_view name, bool tunnel) const {
  connection_lists c;
  c.values = lists_;
  c.count = count_;
  c.overflow = overflow_;
  c.all = all_;
  return hop_by_hop(name, c, tunnel);
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
      if ((iequals(f.name, "X-Forwarded-Proto") || iequals(f.name, "X-Forwarded-Host")) && !info.trusted_peer) continue;
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
  out.append(info.peer_ip).append("\r\n");
  // A trusted proxy's own are kept (above); ours only where it sent none.
  if (!info.trusted_peer || !req.headers.first("X-Forwarded-Proto")) append_line(out, "X-Forwarded-Proto", info.proto);
  if (!req.host.empty() && (!info.trusted_peer || !req.headers.first("X-Forwarded-Host"))) {
    append_line(out, "X-Forwarded-Host", req.host);
  }
  if (info.forwarded_element) {
    // An IPv6 node is bracketed and quoted (RFC 7239 6); host is a quoted-string.
    out.append("Forwarded: for=");
    if (info.peer_ip.find(':') != std::string_view::npos) {
      out.append("\"[").append(info.peer_ip).append("]\"");
    } else {
      out.append(info.peer_ip);
    }
    if (!req.host.empty()) {
      out.append(";host=\"");
      for (const char c : req.host) {
        if (c == '"' || c == '\\') out.push_back('\\');
        out.push_back(c);
      }
      out.push_back('"');
    }
    out.append(";proto=").append(info.proto).append("\r\n");
  }
  // HTTP/1.0 allows a request without Host; the HTTP/1.1 it goes on as does
  // not: an empty one is what a target without authority calls for (RFC 9112 3.2).
  if (req.version < 11 && !req.has_host) out.append("Host: \r\n");
  if (info.tunnel) out.append("Connection: upgrade\r\n");
  out.append("\r\n");
}

void write_response_head(std::string& out, const response_head& res, unsigned client_version, framing body,
                         bool keep_alive, bool tunnel, std::string_view extra) {
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
  out.append(extra);
  if (tunnel) out.append("Connection: upgrade\r\n");
  else if (!keep_alive) out.append("Connection: close\r\n");
  else if (client_version < 11) out.append("Connection: keep-alive\r\n");
  out.append("\r\n");
}

void write_simple_response(std::string& out, unsigned version, unsigned status, std::string_view body, bool keep_alive,
                           std::int64_t retry_after_s, std::string_view extra) {
  out.append(version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ").append(std::to_string(status)).append(" ");
  out.append(reason_phrase(status)).append("\r\nServer: smockron\r\nContent-Type: text/plain; charset=utf-8\r\n");
  out.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
  if (retry_after_s > 0) out.append("Retry-After: ").append(std::to_string(retry_after_s)).append("\r\n");
  out.append(extra);
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
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 420: return "Enhance Your Calm";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

}  // namespace smockron::proxy::http1
