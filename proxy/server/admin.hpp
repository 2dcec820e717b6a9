// The proxy's admin endpoint: /metrics, /livez, /readyz (draining, masters
// connected, what happens without one) and /status (the routes, domains and
// their policy, held requests, control memory, identifier overrides, masters).
#pragma once

#include <string>
#include <string_view>

#include "proxy/request/worker.hpp"
#include "shared/daemon/admin_server.hpp"

namespace smockron::proxy {

class control_subscriber;

/// What the admin endpoint answers for `path`.
admin_server::response admin_response(shared_state& shared, control_subscriber& control, std::string_view path);

/// /status: what this gatekeeper is configured with and what it knows now (JSON).
std::string status_json(shared_state& shared, control_subscriber& control);

}  // namespace smockron::proxy
