// The proxy's admin endpoint (see admin.hpp).
#include "proxy/server/admin.hpp"

#include "smockron/proxy_status_page.hpp"  // status_page.html, compiled in

#include <nlohmann/json.hpp>

#include "proxy/cluster/control_subscriber.hpp"

namespace smockron::proxy {

admin_server::response admin_response(shared_state& shared, control_subscriber& control, std::string_view path) {
  if (path == "/") return {200, "text/html; charset=utf-8", std::string(smockron::proxy_status_page)};
  if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", shared.registry.render()};
  if (path == "/livez") return {200, "text/plain", "ok\n"};
  if (path == "/readyz") {
    if (shared.draining) return {503, "text/plain", "draining\n"};
    const int up = control.connected(), all = control.endpoints();
    std::string body = "ready\nmasters connected: " + std::to_string(up) + "/" + std::to_string(all) + "\n";
    if (up == 0) {
      body += shared.current()->cfg.fail_closed ? "no master reachable: requests are refused with 503 (fail_closed)\n"
                                                : "no master reachable: every request passes (fail-open)\n";
    }
    return {200, "text/plain", body};
  }
  if (path == "/status") return {200, "application/json", status_json(shared, control) + "\n"};
  return {404, "text/plain", "not found (try /, /metrics, /livez, /readyz, /status)\n"};
}

std::string status_json(shared_state& shared, control_subscriber& control) {
  const auto rt = shared.current();
  const std::int64_t now = shared.clk.wall_us();
  nlohmann::ordered_json doc;
  doc["masters"] = {{"connected", control.connected()},
                    {"endpoints", control.endpoints()},
                    {"mechanism", rt->cfg.curve.empty() ? "NULL" : "CURVE"}};  // the links: plaintext or CURVE
  if (rt->cfg.discovers_masters()) {
    // What each DNS name of the control endpoints stands for now (its last good answer).
    nlohmann::ordered_json found = nlohmann::ordered_json::object();
    for (const auto& [configured, list] : control.masters()) {
      if (parse_dns_endpoint(configured)) found[configured] = list;
    }
    doc["masters"]["discovered"] = std::move(found);
  }
  doc["held_requests"] = shared.gate.held();
  doc["max_held"] = rt->cfg.max_held;
  doc["control_entries"] = shared.gate.entries();
  doc["max_control_entries"] = rt->cfg.max_control_entries;
  doc["identifier_overrides"] = shared.gate.overrides();  // identifiers with rules of their own, from the masters
  doc["domains"] = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < rt->routes.domains().size(); ++i) {
    const auto q = shared.gate.quota(rt->gate_domain[i], {}, now);  // the rules, as a fresh client sees them
    nlohmann::ordered_json rules = nlohmann::ordered_json::array();
    for (std::size_t k = 0; k < q.count; ++k)
      rules.push_back({{"burst", q.items[k].quota}, {"window_s", q.items[k].window_s}});
    // How long ago a master last published the domain's POLICY (null: never).
    const std::int64_t updated = shared.gate.policy_updated_us(rt->gate_domain[i]);
    doc["domains"].push_back({{"name", rt->routes.domains()[i]},
                              {"covered_by_a_master", shared.gate.covered(rt->gate_domain[i], now)},
                              {"policy_age_ms", updated == 0 ? nlohmann::ordered_json(nullptr)
                                                             : nlohmann::ordered_json((now - updated) / 1000)},
                              {"rules", std::move(rules)}});
  }
  doc["routes"] = nlohmann::ordered_json::array();
  for (const auto& r : rt->cfg.routes) {
    nlohmann::ordered_json route{{"host", r.host}, {"path", r.path}, {"domain", r.domain}, {"upstream", r.upstream}};
    if (!r.domain.empty()) {
      route["mode"] = r.mode == config::route_config::route_mode::shadow ? "shadow" : "enforce";
      route["status"] = r.status;
      nlohmann::ordered_json ids = nlohmann::ordered_json::array();
      for (const auto& src : r.identify) ids.push_back(config::to_string(src));
      route["identify"] = std::move(ids);
    }
    doc["routes"].push_back(std::move(route));
  }
  return doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace smockron::proxy
