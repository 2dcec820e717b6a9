// Route table: (host, path prefix) -> route, first match wins. Domains and
// upstreams are resolved to indices when the table is built (config time).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "shared/config/config.hpp"

namespace smockron::proxy {

struct route {
  enum class host_match : std::uint8_t { any, exact, suffix };
  host_match host_kind = host_match::any;
  std::string host;                ///< lower-case; for suffix: ".example.com"
  std::string path;                ///< prefix, matched on a segment boundary (path::under)
  std::size_t index = 0;           ///< in route_table::routes()
  std::string domain;              ///< empty: not limited (exempt)
  std::size_t domain_index = 0;    ///< index into route_table::domains() (when limited)
  std::size_t upstream_index = 0;  ///< index into proxy_config::upstreams
  std::vector<config::identifier_source> identify;
  config::route_config::unidentified_action unidentified = config::route_config::unidentified_action::shared;
  unsigned status = 503;                   ///< of a limit rejection
  bool shadow = false;                     ///< decide and count, never hold or reject
  std::vector<cidr> exempt;                ///< clients forwarded unlimited
  bool ratelimit_headers = false;          ///< rate-limit fields on every response, not only limited ones
  bool explain = false;                    ///< the Smockron-Decision field
  unsigned grpc_status = 8;                ///< of a gRPC call refused for its limit
  config::route_config::cost_source cost;  ///< what one request uses, in units
  std::int64_t cost_max = 1'000'000;
  std::int64_t cost_default = 1;
  /// What a response-charged request reserves at admission (nothing: cost_default).
  std::optional<config::route_config::cost_source> cost_estimate;
  /// Where the request's tier comes from (`tier`): empty, or one source
  /// (kept as a list for identify()).
  std::vector<config::identifier_source> tier;
};

class route_table {
public:
  explicit route_table(const config::proxy_config& cfg);

  /// First route whose host and path prefix match; nullptr = no route (404).
  /// `host` is the Host header as sent (port and case are ignored).
  const route* match(std::string_view host, std::string_view path) const;

  const std::vector<route>& routes() const { return routes_; }
  /// Distinct domains used by the routes, in first-use order.
  const std::vector<std::string>& domains() const { return domains_; }

private:
  std::vector<route> routes_;
  std::vector<std::string> domains_;
};

/// Host header without port, lower-cased ("Example.COM:8080" -> "example.com", "[::1]:80" -> "[::1]").
std::string normalize_host(std::string_view host);

}  // namespace smockron::proxy
