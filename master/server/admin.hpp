// The master's admin endpoint: /metrics, /livez (the accounting loop turns),
// /readyz, /status (domains, rules, overrides, store) and
// /status/DOMAIN/IDENTIFIER (one identifier's state, percent-encoded).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "master/server/service.hpp"
#include "shared/base/metrics.hpp"
#include "shared/daemon/admin_server.hpp"

namespace smockron::master {

/// What the admin endpoint answers for `path` and its `query` (called on the
/// admin thread; the service answers through its own thread-safe calls).
admin_server::response admin_response(service& svc, metrics::registry& registry, std::string_view path,
                                      std::string_view query);

/// An identifier as written in an admin path (percent-encoded as needed:
/// identifiers may hold '/', ':' and any byte); nothing when an escape is malformed.
std::optional<std::string> decode_path_identifier(std::string_view text);

/// The override API (overrides_api.cpp): PUT, GET and DELETE
/// /overrides/DOMAIN/IDENTIFIER (the identifier percent-encoded; PUT's body a
/// TOML `rules = [ ... ]`), GET /overrides[/DOMAIN]; every one needs
/// `Authorization: Bearer TOKEN` (admin_token_file), and none exists without
/// it (404). Nothing for another path.
std::optional<admin_server::response> overrides_api(service& svc, const admin_server::request_view& req);

/// With admin_token_file set, what reveals identifiers (/status/DOMAIN/IDENTIFIER,
/// /top) needs the same bearer token: 401 without it. Nothing otherwise
/// (/metrics, /livez, /readyz, /status and the page stay open to scrapers).
std::optional<admin_server::response> admin_guard(service& svc, const admin_server::request_view& req);

}  // namespace smockron::master
