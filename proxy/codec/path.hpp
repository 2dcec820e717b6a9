// Request path normalization before route matching (RFC 3986 section 6.2.2,
// as Envoy's normalize_path / merge_slashes), without I/O: percent-encoded
// unreserved characters decoded, other escapes upper-cased, dot-segments
// removed, repeated slashes merged. What cannot be normalized safely is
// refused: an invalid escape, an encoded NUL, a backslash, and (by default)
// an encoded slash, which backends disagree about.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace smockron::proxy::path {

/// What to do with %2F and %5C (an encoded "/" or "\"): Envoy's
/// path_with_escaped_slashes_action.
enum class escaped_slash : std::uint8_t {
  reject,    ///< 400 (the default: a backend may decode it into a separator the routes never saw)
  keep,      ///< leave it encoded (upper-cased): the routes see one segment, as most backends do
  unescape,  ///< decode it (both to "/"): the routes and the backend see a separator
};

struct options {
  bool merge_slashes = true;
  escaped_slash slashes = escaped_slash::reject;
};

/// The normalized form of `path` (the part of an origin-form target before
/// any '?', starting with '/'), or the reason it cannot be normalized
/// (`why` set, result empty). A path that needs no change is returned as is.
std::string normalize(std::string_view path, const options& o, std::string_view& why);

/// True when `path` certainly needs no change (no '%', '\', "//" or dot
/// segment): the common case, decided without allocating.
bool already_normal(std::string_view path, const options& o);

/// `path` without the parameters of its segments (RFC 3986 3.3: from a ';' to
/// the end of its segment): "/api;jsessionid=1/a;v=2" is "/api/a", what
/// Tomcat, Jetty and Spring serve for it. Routes match this form, so a
/// parameter cannot carry a request past a route's prefix ("/api;x/a" is
/// inside "/api", "/api/..;/admin" is "/admin").
std::string strip_parameters(std::string_view path);

/// True when a segment with parameters is a dot-segment without them
/// ("..;x", ".;", "%2e%2E;v=1"): the servers that strip parameters resolve
/// it, the others serve it as a name, so the gate and the backend would see
/// different paths (routes match the stripped form). Forwarded unchanged,
/// such a path is refused.
bool hides_dot_segment(std::string_view path);

/// Whether `path` is under the route prefix `prefix` on a segment boundary:
/// "/api" matches "/api" and "/api/x", not "/apiary"; "/api/" matches
/// "/api/x"; "/" matches everything.
bool under(std::string_view path, std::string_view prefix);

}  // namespace smockron::proxy::path
