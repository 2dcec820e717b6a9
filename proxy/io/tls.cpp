// TLS contexts (see tls.hpp). This translation unit also compiles Asio's SSL
// support (separate compilation), which only the proxy needs.
#include "proxy/io/tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <boost/asio/ssl/impl/src.hpp>

#include <stdexcept>

#include "shared/base/net.hpp"

namespace smockron::proxy {
namespace {

// ALPN's wire form of the one protocol the proxy speaks.
constexpr unsigned char k_http11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
// The listener's preference with http2 on: h2, then http/1.1.
constexpr unsigned char k_h2_first[] = {2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
// An upstream with protocol = "h2".
constexpr unsigned char k_h2[] = {2, 'h', '2'};

// nginx's default ssl_ciphers, so that a comparison with nginx compares like with like (TLS 1.2; 1.3 has its own).
constexpr const char* k_ciphers = "HIGH:!aNULL:!MD5";

// OpenSSL's reasons for the last failure, oldest first; the queue is left empty.
std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown error" : out;
}

[[noreturn]] void fail(const std::string& what, const std::string& file) {
  throw std::runtime_error(what + " \"" + file + "\": " + openssl_errors());
}

std::unique_ptr<asio::ssl::context> base_context(asio::ssl::context::method m) {
  auto ctx = std::make_unique<asio::ssl::context>(m);
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_cipher_list(c, k_ciphers);
  // Idle keep-alive connections give their record buffers back (as nginx does): ~34 KiB each.
  SSL_CTX_set_mode(c, SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_options(c, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  return ctx;
}

void use_certificate(SSL_CTX* c, const std::string& cert, const std::string& key) {
  if (SSL_CTX_use_certificate_chain_file(c, cert.c_str()) != 1) fail("cannot load certificate", cert);
  // OpenSSL refuses a key that does not match the certificate here ("key values mismatch").
  if (SSL_CTX_use_PrivateKey_file(c, key.c_str(), SSL_FILETYPE_PEM) != 1) fail("cannot load key", key);
}

// HTTP/1.1 when the client offers it; a client that offers only other
// protocols (h2) goes on without ALPN, as nginx without http2 does.
int select_http11(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned int inlen,
                  void*) {
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, k_http11, sizeof k_http11, in, inlen) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_NOACK;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

// HTTP/2 first when the client offers it (RFC 9113 3.2), else HTTP/1.1.
int select_h2(SSL* ssl, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned int inlen,
              void* arg) {
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, k_h2_first, sizeof k_h2_first, in, inlen) == OPENSSL_NPN_NEGOTIATED) {
    *out = selected;
    return SSL_TLSEXT_ERR_OK;
  }
  return select_http11(ssl, out, outlen, in, inlen, arg);
}

}  // namespace

tls_server::tls_server(const config::proxy_config& cfg) {
  const auto add = [&](const std::string& cert, const std::string& key) {
    auto ctx = base_context(asio::ssl::context::tls_server);
    use_certificate(ctx->native_handle(), cert, key);
    SSL_CTX* c = ctx->native_handle();
    SSL_CTX_set_alpn_select_cb(c, cfg.http2 ? select_h2 : select_http11, nullptr);
    if (!cfg.tls_session_resumption) {
      SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
      SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
      SSL_CTX_set_num_tickets(c, 0);  // TLS 1.3 sends none either
    }
    contexts_.push_back(std::move(ctx));
  };
  add(cfg.tls_cert, cfg.tls_key);
  for (const auto& c : cfg.tls_sni) add(c.cert, c.key);
  if (contexts_.size() > 1) {
    SSL_CTX_set_tlsext_servername_callback(contexts_.front()->native_handle(), on_server_name);
    SSL_CTX_set_tlsext_servername_arg(contexts_.front()->native_handle(), this);
  }
}

// The first tls_sni certificate that covers the requested name (its subject
// alternative names, wildcards as RFC 6125 allows them) serves the connection.
int tls_server::on_server_name(SSL* ssl, int*, void* arg) {
  const char* name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  if (name == nullptr) return SSL_TLSEXT_ERR_OK;
  const auto& contexts = static_cast<tls_server*>(arg)->contexts_;
  for (std::size_t i = 1; i < contexts.size(); ++i) {
    X509* cert = SSL_CTX_get0_certificate(contexts[i]->native_handle());
    if (cert != nullptr && X509_check_host(cert, name, 0, 0, nullptr) == 1) {
      SSL_set_SSL_CTX(ssl, contexts[i]->native_handle());
      break;
    }
  }
  return SSL_TLSEXT_ERR_OK;
}

std::shared_ptr<asio::ssl::context> make_upstream_tls(const config::upstream_config& u) {
  std::shared_ptr<asio::ssl::context> ctx = base_context(asio::ssl::context::tls_client);
  SSL_CTX* c = ctx->native_handle();
  if (u.tls_verify) {
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
    if (u.tls_ca.empty()) {
      if (SSL_CTX_set_default_verify_paths(c) != 1) fail("cannot load the system's CA certificates", "");
    } else if (SSL_CTX_load_verify_locations(c, u.tls_ca.c_str(), nullptr) != 1) {
      fail("cannot load CA certificates", u.tls_ca);
    }
  } else {
    SSL_CTX_set_verify(c, SSL_VERIFY_NONE, nullptr);
  }
  if (!u.tls_client_cert.empty()) use_certificate(c, u.tls_client_cert, u.tls_client_key);
  const bool h2 = u.protocol == config::upstream_config::protocol_kind::h2;
  if ((h2 ? SSL_CTX_set_alpn_protos(c, k_h2, sizeof k_h2) : SSL_CTX_set_alpn_protos(c, k_http11, sizeof k_http11)) != 0)
    fail("cannot set ALPN", h2 ? "h2" : "http/1.1");
  return ctx;
}

void prepare_client_session(tls_stream& s, const config::upstream_config& u, const std::string& host) {
  const std::string& name = u.tls_server_name.empty() ? host : u.tls_server_name;
  SSL* ssl = s.native_handle();
  const bool ip = parse_ip(name).has_value();
  // SNI carries names only (RFC 6066 3); an address is checked against the certificate's IP addresses.
  if (!ip) SSL_set_tlsext_host_name(ssl, name.c_str());
  if (!u.tls_verify) return;
  if (ip) X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str());
  else SSL_set1_host(ssl, name.c_str());
}

}  // namespace smockron::proxy
