// The override API: one identifier's rules set, read and deleted at run time
// on the admin endpoint, behind a bearer token (docs/operations.md,
// "Per-tenant limits without a reload"). The rules take effect at once in the
// master and reach the gatekeepers with the POLICY published right after; a
// reload (SIGHUP) keeps them, an API override replacing the file's for the
// same identifier.
#include <nlohmann/json.hpp>

#include "master/io/control_publisher.hpp"
#include "master/server/admin.hpp"
#include "master/store/redis_store.hpp"

namespace smockron::master {

namespace {

std::string key_of(std::string_view domain, std::string_view identifier) {
  std::string k(domain);
  k.push_back('\0');
  k.append(identifier);
  return k;
}

nlohmann::ordered_json override_json(std::string_view domain, const config::override_config& o) {
  return {{"domain", domain}, {"identifier", o.identifier}, {"rules", o.text}};
}

std::string error_json(std::string_view message) { return nlohmann::ordered_json{{"error", message}}.dump() + "\n"; }

// Compares without an early exit (the token's bytes are not timed).
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

// "/overrides/DOMAIN/IDENTIFIER" (the identifier percent-encoded), or
// "/overrides/DOMAIN" (identifier empty): false when malformed.
bool split_path(std::string_view rest, std::string& domain, std::string& identifier) {
  const auto slash = rest.find('/');
  domain = std::string(rest.substr(0, slash));
  if (slash == std::string_view::npos) return !domain.empty();
  auto decoded = decode_path_identifier(rest.substr(slash + 1));
  if (!decoded) return false;
  identifier = std::move(*decoded);
  return !domain.empty() && !identifier.empty();
}

}  // namespace

// ---- the loop's side (service) ----------------------------------------------

config::master_config service::effective(const config::master_config& file) const {
  config::master_config out = file;
  for (const auto& [key, entry] : runtime_overrides_) {
    const std::string& domain = entry.first;  // (not a structured binding: lambdas below use it)
    const config::override_config& o = entry.second;
    auto d = std::find_if(out.domains.begin(), out.domains.end(), [&](const auto& x) { return x.name == domain; });
    if (d == out.domains.end()) continue;  // its domain is gone from the file: kept, not in force
    auto same = std::find_if(d->overrides.begin(), d->overrides.end(),
                             [&](const auto& x) { return x.identifier == o.identifier; });
    if (same != d->overrides.end()) *same = o;
    else d->overrides.push_back(o);
  }
  return out;
}

void service::apply_limits() {
  config::master_config next = effective(file_cfg_);
  ingest_.reconfigure(next);
  control_->domains_changed(ingest_.domains().size());  // POLICY (and CONCURRENCY) again, now
  std::lock_guard lock(status_mutex_);
  cfg_ = std::move(next);
}

// The identifier's rules changed: what it used under the old ones is not
// debt under the new (its state starts afresh; the gatekeepers drop theirs
// when the override's POLICY changes).
void service::forget(std::string_view domain, std::string_view identifier) {
  if (const auto i = ingest_.find(domain)) ingest_.states().reset(*i, identifier);
}

void service::restore_overrides() {
  auto loaded = store_->take_loaded_overrides();
  if (loaded.empty()) return;
  std::size_t kept = 0;
  for (auto& l : loaded) {
    auto parsed = config::parse_override_rules(l.identifier, l.rules);
    auto* o = std::get_if<config::override_config>(&parsed);
    if (!o) {
      log_->warn("redis: override of {} in {} not restored: {}", l.identifier, l.domain, std::get<std::string>(parsed));
      restore_skipped_.inc();
      continue;
    }
    o->from_api = true;
    o->text = std::move(l.rules);
    // One set through the API since this master started is newer.
    if (runtime_overrides_.try_emplace(key_of(l.domain, l.identifier), l.domain, std::move(*o)).second) ++kept;
  }
  log_->info("redis: {} override(s) set through the API read back", kept);
  apply_limits();
}

std::string service::admin_token() const {
  std::lock_guard lock(status_mutex_);
  return cfg_.admin_token;
}

service::api_answer service::put_override(std::string domain, config::override_config o,
                                          std::chrono::milliseconds timeout) {
  auto status = std::make_shared<unsigned>(503);
  auto q = std::make_shared<status_query>();
  q->job = [this, status, domain = std::move(domain), o = std::move(o)]() -> std::optional<std::string> {
    if (!file_cfg_.find_domain(domain)) {
      *status = 404;
      return error_json("unknown domain");
    }
    const std::string key = key_of(domain, o.identifier);
    std::size_t count = 0;
    for (const auto& d : effective(file_cfg_).domains) count += d.overrides.size();
    if (!runtime_overrides_.contains(key) && count >= config::max_overrides) {
      *status = 409;
      return error_json("at most 10000 overrides in all (config::max_overrides)");
    }
    *status = runtime_overrides_.contains(key) ? 200 : 201;
    const auto body = override_json(domain, o).dump() + "\n";
    if (store_) override_writes_.push_back({override_key(domain, o.identifier), o.text, false});
    runtime_overrides_[key] = {domain, o};
    apply_limits();
    forget(domain, o.identifier);
    return body;
  };
  auto body = ask(std::move(q), timeout);
  if (!body) return {503, error_json("the accounting loop did not answer in time")};
  return {*status, std::move(*body)};
}

service::api_answer service::delete_override(std::string domain, std::string identifier,
                                             std::chrono::milliseconds timeout) {
  auto status = std::make_shared<unsigned>(503);
  auto q = std::make_shared<status_query>();
  q->job = [this, status, domain, identifier]() -> std::optional<std::string> {
    if (runtime_overrides_.erase(key_of(domain, identifier)) == 0) {
      *status = 404;
      return error_json("no override of this identifier was set through the API");
    }
    if (store_) override_writes_.push_back({override_key(domain, identifier), {}, true});
    apply_limits();
    forget(domain, identifier);
    *status = 200;
    return std::string("{}\n");
  };
  auto body = ask(std::move(q), timeout);
  if (!body) return {503, error_json("the accounting loop did not answer in time")};
  return {*status, std::move(*body)};
}

service::api_answer service::api_overrides(std::string domain, std::chrono::milliseconds timeout) {
  auto q = std::make_shared<status_query>();
  q->job = [this, domain = std::move(domain)]() -> std::optional<std::string> {
    auto list = nlohmann::ordered_json::array();
    for (const auto& [key, entry] : runtime_overrides_) {
      if (domain.empty() || entry.first == domain) list.push_back(override_json(entry.first, entry.second));
    }
    return nlohmann::ordered_json{{"overrides", std::move(list)}}.dump() + "\n";
  };
  auto body = ask(std::move(q), timeout);
  if (!body) return {503, error_json("the accounting loop did not answer in time")};
  return {200, std::move(*body)};
}

// ---- the admin thread's side ------------------------------------------------------

std::optional<admin_server::response> admin_guard(service& svc, const admin_server::request_view& req) {
  // What names identifiers: one identifier's state, and who is limited now.
  if (!req.path.starts_with("/status/") && req.path != "/top") return std::nullopt;
  const std::string token = svc.admin_token();
  if (token.empty()) return std::nullopt;  // no token configured: the allow list alone decides
  constexpr std::string_view bearer = "Bearer ";
  if (req.authorization.starts_with(bearer) && same_secret(req.authorization.substr(bearer.size()), token)) {
    return std::nullopt;
  }
  return admin_server::response{401, "application/json",
                                error_json("a bearer token is required (Authorization: Bearer <admin_token_file's "
                                           "token>)")};
}

std::optional<admin_server::response> overrides_api(service& svc, const admin_server::request_view& req) {
  if (req.path != "/overrides" && !req.path.starts_with("/overrides/")) return std::nullopt;
  const auto answer = [](unsigned status, std::string body) {
    return admin_server::response{status, "application/json", std::move(body)};
  };
  const std::string token = svc.admin_token();
  if (token.empty()) return answer(404, error_json("the override API is off (set admin_token_file)"));
  constexpr std::string_view bearer = "Bearer ";
  if (!req.authorization.starts_with(bearer) || !same_secret(req.authorization.substr(bearer.size()), token)) {
    return answer(401, error_json("a bearer token is required (Authorization: Bearer <admin_token_file's token>)"));
  }
  constexpr auto timeout = std::chrono::seconds(2);
  std::string domain, identifier;
  if (req.path == "/overrides") {
    if (req.method != "GET") return answer(405, error_json("GET /overrides, or /overrides/DOMAIN/IDENTIFIER"));
    auto r = svc.api_overrides({}, timeout);
    return answer(r.status, std::move(r.body));
  }
  if (!split_path(req.path.substr(11), domain, identifier)) {
    return answer(400, error_json("use /overrides/DOMAIN/IDENTIFIER (the identifier percent-encoded)"));
  }
  if (identifier.empty()) {  // GET /overrides/DOMAIN
    if (req.method != "GET") return answer(405, error_json("GET /overrides/DOMAIN lists a domain's"));
    auto r = svc.api_overrides(domain, timeout);
    return answer(r.status, std::move(r.body));
  }
  if (req.method == "PUT") {
    auto parsed = config::parse_override_rules(identifier, req.body);
    if (auto* why = std::get_if<std::string>(&parsed)) return answer(400, error_json(*why));
    auto& o = std::get<config::override_config>(parsed);
    o.from_api = true;
    o.text = std::string(req.body);
    auto r = svc.put_override(domain, std::move(o), timeout);
    return answer(r.status, std::move(r.body));
  }
  if (req.method == "DELETE") {
    auto r = svc.delete_override(domain, identifier, timeout);
    return answer(r.status, std::move(r.body));
  }
  if (req.method == "GET") {
    auto r = svc.api_overrides(domain, timeout);
    const auto list = nlohmann::json::parse(r.body, nullptr, false);
    if (r.status == 200 && list.is_object()) {
      for (const auto& o : list["overrides"]) {
        if (o["identifier"] == identifier) return answer(200, o.dump() + "\n");
      }
      return answer(404, error_json("no override of this identifier was set through the API"));
    }
    return answer(r.status, std::move(r.body));
  }
  return answer(405, error_json("PUT, GET or DELETE /overrides/DOMAIN/IDENTIFIER"));
}

}  // namespace smockron::master
