// One side of a proxied exchange as a byte stream: a TCP socket, or a TLS
// session over one. Plain links keep every fast path of conn_io.hpp (bare
// system calls, reads that remember a drained socket); TLS links go through
// Asio's SSL stream (OpenSSL), which buffers records of its own.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>

#include <memory>
#include <optional>
#include <utility>

#include "proxy/io/asio_types.hpp"

namespace smockron::proxy {

using tls_stream = asio::ssl::stream<tcp_socket>;

class link {
public:
  using executor_type = executor_t;

  explicit link(tcp_socket s) : plain_(std::move(s)) {}

  /// Turns a plain link into a TLS one over the same socket (no handshake
  /// yet). `keep` holds what the context's callbacks refer to, for as long as
  /// the session lives (a reload builds new contexts; old sessions go on).
  void start_tls(asio::ssl::context& ctx, std::shared_ptr<const void> keep) {
    keep_ = std::move(keep);
    tls_ = std::make_unique<tls_stream>(std::move(*plain_), ctx);
    plain_.reset();
  }

  tcp_socket& socket() { return tls_ ? tls_->next_layer() : *plain_; }
  /// The TLS session, or nullptr for a plain link.
  tls_stream* tls() const { return tls_.get(); }
  executor_type get_executor() { return socket().get_executor(); }

  // AsyncReadStream / AsyncWriteStream: both branches return the same type
  // for a given token (the proxy's tokens are awaitables).
  template <class Buffers, class Token>
  auto async_read_some(const Buffers& b, Token&& token) {
    if (tls_) return tls_->async_read_some(b, std::forward<Token>(token));
    return plain_->async_read_some(b, std::forward<Token>(token));
  }
  template <class Buffers, class Token>
  auto async_write_some(const Buffers& b, Token&& token) {
    if (tls_) return tls_->async_write_some(b, std::forward<Token>(token));
    return plain_->async_write_some(b, std::forward<Token>(token));
  }

private:
  std::optional<tcp_socket> plain_;
  std::shared_ptr<const void> keep_;
  std::unique_ptr<tls_stream> tls_;  // on the heap: a link moves (pooled upstreams) and the stream stays put
};

}  // namespace smockron::proxy
