// The far end of an HTTP/2 connection in the tests: libnghttp2's own client
// or server session, frames exchanged in memory (no socket).
#pragma once

#include <nghttp2/nghttp2.h>

#include <string>
#include <string_view>

#include "proxy/io/h2_pump.hpp"

namespace smockron::proxy::test {

class nghttp2_peer {
public:
  nghttp2_peer() = default;
  ~nghttp2_peer() {
    if (session) nghttp2_session_del(session);
  }
  nghttp2_peer(const nghttp2_peer&) = delete;
  nghttp2_peer& operator=(const nghttp2_peer&) = delete;

  /// What this end has to send now.
  std::string take() { return h2::take_all(session); }
  /// Bytes from the other end.
  void give(const std::string& bytes) {
    nghttp2_session_mem_recv(session, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  static nghttp2_nv field(std::string_view n, std::string_view v) {
    return {reinterpret_cast<uint8_t*>(const_cast<char*>(n.data())),
            reinterpret_cast<uint8_t*>(const_cast<char*>(v.data())), n.size(), v.size(), NGHTTP2_NV_FLAG_NONE};
  }

  nghttp2_session* session = nullptr;
};

}  // namespace smockron::proxy::test
