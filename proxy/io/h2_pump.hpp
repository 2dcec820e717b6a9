// What both ends of the proxy's HTTP/2 (the client connection and the
// upstream connections) do between nghttp2 and their sockets: gather the
// frames nghttp2 has to send into one write.
#pragma once

#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <string>

namespace smockron::proxy::h2 {

/// Frame bytes gathered into one write at most.
inline constexpr std::size_t k_write_batch = 65536;

/// Appends what `session` has to send to `out` until k_write_batch bytes are
/// there or it has nothing more. False: nghttp2 failed (the connection ends).
inline bool gather(nghttp2_session* session, std::string& out) {
  while (out.size() < k_write_batch) {
    const uint8_t* data = nullptr;
    const auto n = nghttp2_session_mem_send(session, &data);
    if (n < 0) return false;
    if (n == 0) return true;
    out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
  }
  return true;
}

/// Everything `session` has to send now (tests drive a session so, frames in memory).
inline std::string take_all(nghttp2_session* session) {
  std::string taken;
  gather(session, taken);
  for (std::string more; gather(session, more) && !more.empty(); more.clear()) taken += more;
  return taken;
}

}  // namespace smockron::proxy::h2
