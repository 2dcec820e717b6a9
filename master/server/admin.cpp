// The master's admin endpoint (see admin.hpp).
#include "master/server/admin.hpp"

#include "smockron/master_status_page.hpp"  // status_page.html, compiled in

#include "shared/base/text.hpp"

namespace smockron::master {

std::optional<std::string> decode_path_identifier(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
    } else if (i + 2 < text.size() && hex_digit(text[i + 1]) >= 0 && hex_digit(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_digit(text[i + 1]) * 16 + hex_digit(text[i + 2])));
      i += 2;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

namespace {

// GET /status/DOMAIN/IDENTIFIER: the identifier percent-encoded as needed
// (identifiers may hold '/', ':' and any byte).
admin_server::response identifier_status(service& svc, std::string_view rest) {
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == rest.size()) {
    return {400, "text/plain", "use /status/DOMAIN/IDENTIFIER (the identifier percent-encoded)\n"};
  }
  const auto identifier = decode_path_identifier(rest.substr(slash + 1));
  if (!identifier) return {400, "text/plain", "invalid percent-encoding in the identifier\n"};
  const auto json = svc.identifier_status(rest.substr(0, slash), *identifier, std::chrono::seconds(2));
  if (!json) return {503, "text/plain", "the accounting loop did not answer in time\n"};
  if (json->empty()) return {404, "text/plain", "unknown domain\n"};
  return {200, "application/json", *json + "\n"};
}

// GET /top[?domain=NAME][&n=N]: who is limited now.
admin_server::response top(service& svc, std::string_view query) {
  std::string domain;
  std::size_t n = 10;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query.remove_prefix(amp == std::string_view::npos ? query.size() : amp + 1);
    const auto eq = pair.find('=');
    const std::string_view key = pair.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    if (key == "domain") {
      domain.clear();
      for (std::size_t i = 0; i < value.size(); ++i) {
        if (value[i] == '%' && i + 2 < value.size() && hex_digit(value[i + 1]) >= 0 && hex_digit(value[i + 2]) >= 0) {
          domain.push_back(static_cast<char>(hex_digit(value[i + 1]) * 16 + hex_digit(value[i + 2])));
          i += 2;
        } else {
          domain.push_back(value[i]);
        }
      }
    } else if (key == "n") {
      n = 0;
      for (const char c : value) {
        if (c < '0' || c > '9' || n > 100'000) return {400, "text/plain", "n is a number of identifiers\n"};
        n = n * 10 + static_cast<std::size_t>(c - '0');
      }
    } else {
      return {400, "text/plain", "use /top, /top?n=N, /top?domain=NAME&n=N\n"};
    }
  }
  const auto json = svc.top(domain, n, std::chrono::seconds(2));
  if (!json) return {503, "text/plain", "the accounting loop did not answer in time\n"};
  if (json->empty()) return {404, "text/plain", "unknown domain\n"};
  return {200, "application/json", *json + "\n"};
}

}  // namespace

admin_server::response admin_response(service& svc, metrics::registry& registry, std::string_view path,
                                      std::string_view query) {
  if (path == "/") return {200, "text/html; charset=utf-8", std::string(smockron::master_status_page)};
  if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", registry.render()};
  if (path == "/livez") {
    return svc.alive(std::chrono::seconds(5)) ? admin_server::response{200, "text/plain", "ok\n"}
                                              : admin_server::response{503, "text/plain", "accounting loop stalled\n"};
  }
  if (path == "/readyz") return {200, "text/plain", svc.readiness()};
  if (path == "/status") return {200, "application/json", svc.status_json() + "\n"};
  if (path.starts_with("/status/")) return identifier_status(svc, path.substr(8));
  if (path == "/top") return top(svc, query);
  return {404, "text/plain", "not found (try /metrics, /livez, /readyz, /status, /status/DOMAIN/IDENTIFIER, /top)\n"};
}

}  // namespace smockron::master
