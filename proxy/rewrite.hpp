// Header rewriting between client and upstream, in one place: hop-by-hop
// headers removed (Connection and the headers it lists, Keep-Alive, TE,
// Trailer, Upgrade, Proxy-*), X-Forwarded-For/-Proto/-Host added, Host kept.
#pragma once

#include <boost/beast/http/fields.hpp>

#include <string_view>

namespace smockron::proxy {

struct forward_info {
  std::string_view client_ip;  ///< appended to X-Forwarded-For
  std::string_view proto = "http";
  bool tunnel = false;  ///< keep Upgrade/Connection: upgrade (WebSocket)
};

/// Rewrites a request header set for the upstream.
void rewrite_request(boost::beast::http::fields& f, const forward_info& info);

/// Removes hop-by-hop headers from an upstream response (keeps Upgrade for a 101 tunnel).
void rewrite_response(boost::beast::http::fields& f, bool tunnel);

}  // namespace smockron::proxy
