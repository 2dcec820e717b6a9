// TLS contexts built from the configuration: the listener's (a default
// certificate and more chosen by SNI) and one per upstream with tls = true.
// Both speak TLS 1.2 and 1.3 and HTTP/1.1 (and HTTP/2 where configured) over ALPN. Built with each
// configuration generation (start-up, SIGHUP): new connections use the new
// certificates, open ones keep theirs.
#pragma once

#include <boost/asio/ssl/context.hpp>

#include <memory>
#include <string>
#include <vector>

#include "proxy/io/link.hpp"
#include "shared/config/config.hpp"

namespace smockron::proxy {

/// The listener's contexts. Throws std::runtime_error naming the file and
/// OpenSSL's reason when a certificate or key does not load or they do not match.
class tls_server {
public:
  explicit tls_server(const config::proxy_config& cfg);
  tls_server(const tls_server&) = delete;
  tls_server& operator=(const tls_server&) = delete;

  /// The context a new connection starts with (SNI may switch it to another of ours).
  asio::ssl::context& context() { return *contexts_.front(); }

private:
  static int on_server_name(SSL* ssl, int* alert, void* arg);
  std::vector<std::unique_ptr<asio::ssl::context>> contexts_;  ///< [0]: tls_cert; then tls_sni in order
};

/// An upstream's client context (verification, CA, client certificate,
/// ALPN). Throws std::runtime_error naming the file when one does not load.
std::shared_ptr<asio::ssl::context> make_upstream_tls(const config::upstream_config& u);

/// Sets up the client session `s` (SNI and the name verified) for a server
/// given as `host` in the configuration, before its handshake.
void prepare_client_session(tls_stream& s, const config::upstream_config& u, const std::string& host);

}  // namespace smockron::proxy
