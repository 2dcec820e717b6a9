// A small HTTP/1.1 admin endpoint (/metrics, /livez, /readyz, /status) served
// from an Asio io_context. One response per connection, bounded reads, deadlines.
#pragma once

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/metrics.hpp"
#include "shared/base/net.hpp"

namespace smockron {

class admin_server {
public:
  struct response {
    unsigned status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
  };
  /// Maps a request path and its query (what follows "?", or empty) to a
  /// response; runs on the io_context thread.
  using handler = std::function<response(std::string_view path, std::string_view query)>;

  /// Who may connect: peers outside `allow` (empty: anyone) are closed at
  /// accept, counted in `refused` and logged (rate-limited).
  struct access {
    std::vector<cidr> allow;
    metrics::counter* refused = nullptr;
  };

  /// A request as a filter sees it (views valid during the call).
  struct request_view {
    std::string_view method;  ///< "GET", "PUT", ...
    std::string_view path;
    std::string_view query;
    std::string_view authorization;  ///< the Authorization field ("" when absent)
    std::string_view body;           ///< at most k_max_body bytes
  };
  /// Sees every request first (any method); nothing: the handler answers (GET and HEAD only).
  using filter = std::function<std::optional<response>(const request_view&)>;
  /// Request bodies read at most (larger: 413).
  static constexpr std::size_t k_max_body = 65536;

  /// Binds `listen` (throws std::system_error at start-up if it cannot).
  admin_server(boost::asio::io_context& ioc, const host_port& listen, handler h, access a);
  /// Anyone may connect.
  admin_server(boost::asio::io_context& ioc, const host_port& listen, handler h);
  ~admin_server();
  admin_server(const admin_server&) = delete;
  admin_server& operator=(const admin_server&) = delete;

  /// Installs `f` (before requests arrive: the io_context thread reads it).
  void set_filter(filter f);

  /// The bound port (useful with port 0).
  std::uint16_t port() const;
  /// Stops accepting; open admin connections finish on their own deadlines.
  void stop();

private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace smockron
