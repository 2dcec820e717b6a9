// Request path normalization (see path.hpp).
#include "proxy/codec/path.hpp"
#include "shared/base/text.hpp"

namespace smockron::proxy::path {
namespace {

// RFC 3986 2.3.
bool unreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

// Decodes unreserved escapes and upper-cases the others; false (with `why`)
// for what cannot be normalized safely.
bool decode(std::string_view in, escaped_slash slashes, std::string& out, std::string_view& why) {
  constexpr char digits[] = "0123456789ABCDEF";
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '\\') {
      why = "backslash in path";
      return false;
    }
    if (c != '%') {
      out += c;
      continue;
    }
    const int hi = i + 2 < in.size() ? hex_digit(in[i + 1]) : -1, lo = i + 2 < in.size() ? hex_digit(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      why = "invalid percent-encoding in path";
      return false;
    }
    const auto v = static_cast<unsigned char>(hi * 16 + lo);
    i += 2;
    if (v == 0) {
      why = "encoded NUL in path";
      return false;
    }
    if (v == '/' || v == '\\') {
      if (slashes == escaped_slash::reject) {
        why = "encoded slash or backslash in path";
        return false;
      }
      if (slashes == escaped_slash::unescape) {
        // Both as a separator: a backend that decodes %5C treats "\\" as one
        // (and a raw backslash is refused, so the result normalizes to itself).
        out += '/';
        continue;
      }
    } else if (unreserved(v)) {
      out += static_cast<char>(v);
      continue;
    }
    out += '%';
    out += digits[v >> 4];
    out += digits[v & 15];
  }
  return true;
}

// RFC 3986 5.2.4 remove_dot_segments, on a path starting with '/'.
std::string remove_dots(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  while (!in.empty()) {
    if (in.starts_with("/./")) {
      in.remove_prefix(2);
    } else if (in == "/.") {
      in = "/";
    } else if (in.starts_with("/../")) {
      in.remove_prefix(3);
      out.erase(out.empty() ? 0 : out.rfind('/'));
    } else if (in == "/..") {
      in = "/";
      out.erase(out.empty() ? 0 : out.rfind('/'));
    } else {
      const auto next = in.find('/', 1);
      const auto seg = in.substr(0, next);
      out.append(seg);
      in.remove_prefix(seg.size());
    }
  }
  return out;
}

}  // namespace

bool already_normal(std::string_view p, const options& o) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '%' || c == '\\') return false;
    if (c == '/' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == '/' && o.merge_slashes) return false;
      // "/." followed by the end, '/' or another '.' (".." segments and "." segments).
      if (n == '.' && (i + 2 == p.size() || p[i + 2] == '/' || p[i + 2] == '.')) return false;
    }
  }
  return true;
}

std::string normalize(std::string_view p, const options& o, std::string_view& why) {
  why = {};
  if (already_normal(p, o)) return std::string(p);
  std::string decoded;
  if (!decode(p, o.slashes, decoded, why)) return {};
  // Slashes merged before dot-segments are resolved, as nginx and most
  // servers do: "/a//../b" is "/b". The result is forwarded, so the backend
  // sees exactly the path the routes matched.
  if (o.merge_slashes) {
    std::string merged;
    merged.reserve(decoded.size());
    for (const char c : decoded) {
      if (c == '/' && !merged.empty() && merged.back() == '/') continue;
      merged += c;
    }
    decoded.swap(merged);
  }
  std::string out = remove_dots(decoded);
  if (out.empty()) out.push_back('/');
  return out;
}

std::string strip_parameters(std::string_view p) {
  std::string out;
  out.reserve(p.size());
  while (!p.empty()) {
    const auto semi = p.find(';');
    out.append(p.substr(0, semi));
    if (semi == std::string_view::npos) break;
    const auto next = p.find('/', semi);  // the parameter runs to the end of its segment
    if (next == std::string_view::npos) break;
    p.remove_prefix(next);
  }
  return out;
}

namespace {
// "." or ".." with each dot spelled "." or "%2e" (either case).
bool is_dot_name(std::string_view s) {
  int dots = 0;
  while (!s.empty()) {
    if (s.front() == '.') {
      s.remove_prefix(1);
    } else if (s.size() >= 3 && s[0] == '%' && s[1] == '2' && (s[2] == 'e' || s[2] == 'E')) {
      s.remove_prefix(3);
    } else {
      return false;
    }
    ++dots;
  }
  return dots == 1 || dots == 2;
}
}  // namespace

bool hides_dot_segment(std::string_view p) {
  while (!p.empty()) {
    const auto slash = p.find('/');
    const std::string_view segment = p.substr(0, slash);
    if (const auto semi = segment.find(';'); semi != std::string_view::npos && is_dot_name(segment.substr(0, semi)))
      return true;
    if (slash == std::string_view::npos) break;
    p.remove_prefix(slash + 1);
  }
  return false;
}

bool under(std::string_view p, std::string_view prefix) {
  if (!p.starts_with(prefix)) return false;
  return prefix.empty() || prefix.back() == '/' || p.size() == prefix.size() || p[prefix.size()] == '/';
}

}  // namespace smockron::proxy::path
