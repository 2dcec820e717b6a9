// The master's admin endpoint (see admin.hpp).
#include "master/admin.hpp"

#include "shared/base/text.hpp"

namespace smockron::master {

namespace {

// GET /status/DOMAIN/IDENTIFIER: the identifier percent-encoded as needed
// (identifiers may hold '/', ':' and any byte).
admin_server::response identifier_status(service& svc, std::string_view rest) {
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == rest.size()) {
    return {400, "text/plain", "use /status/DOMAIN/IDENTIFIER (the identifier percent-encoded)\n"};
  }
  std::string identifier;
  for (std::size_t i = slash + 1; i < rest.size(); ++i) {
    if (rest[i] == '%' && i + 2 < rest.size() && hex_digit(rest[i + 1]) >= 0 && hex_digit(rest[i + 2]) >= 0) {
      identifier.push_back(static_cast<char>(hex_digit(rest[i + 1]) * 16 + hex_digit(rest[i + 2])));
      i += 2;
    } else if (rest[i] == '%') {
      return {400, "text/plain", "invalid percent-encoding in the identifier\n"};
    } else {
      identifier.push_back(rest[i]);
    }
  }
  const auto json = svc.identifier_status(rest.substr(0, slash), identifier, std::chrono::seconds(2));
  if (!json) return {503, "text/plain", "the accounting loop did not answer in time\n"};
  if (json->empty()) return {404, "text/plain", "unknown domain\n"};
  return {200, "application/json", *json + "\n"};
}

}  // namespace

admin_server::response admin_response(service& svc, metrics::registry& registry, std::string_view path) {
  if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", registry.render()};
  if (path == "/livez") {
    return svc.alive(std::chrono::seconds(5)) ? admin_server::response{200, "text/plain", "ok\n"}
                                              : admin_server::response{503, "text/plain", "accounting loop stalled\n"};
  }
  if (path == "/readyz") return {200, "text/plain", svc.readiness()};
  if (path == "/status") return {200, "application/json", svc.status_json() + "\n"};
  if (path.starts_with("/status/")) return identifier_status(svc, path.substr(8));
  return {404, "text/plain", "not found (try /metrics, /livez, /readyz, /status, /status/DOMAIN/IDENTIFIER)\n"};
}

}  // namespace smockron::master
