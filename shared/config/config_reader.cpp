// Checks both daemons' configuration schemas use (config_reader.hpp).
#include <toml++/toml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "shared/config/config.hpp"
#include "shared/config/config_reader.hpp"
#include "shared/protocol/wire.hpp"

namespace smockron::config::detail {

// The level both daemons accept (checked here so that --check finds a bad one).
void check_log_level(reader& r, const std::string& level) {
  static constexpr std::array<std::string_view, 7> levels{"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (level.empty() || std::find(levels.begin(), levels.end(), level) != levels.end()) return;
  r.errors().add(*r.table().get("log_level"), r.key("log_level"),
                 "unknown level \"" + level + "\" (use trace, debug, info, warn, error, critical or off)");
}

// Accounting and control travel on the master's own ZMTP code
// (master/io/zmtp_server.hpp): a stream socket, so in-process ZeroMQ
// endpoints cannot carry them.
std::string check_stream_endpoint(std::string_view e, std::string_view what) {
  if (e.starts_with("inproc://")) return std::string(what) + " travels on tcp:// or ipc:// endpoints, not inproc://";
  if (parse_stream_endpoint(e)) return {};
  if (e.starts_with("ipc://") && e.size() - 6 > 107)
    return "ipc path longer than 107 bytes in \"" + std::string(e) + "\"";
  return "invalid endpoint \"" + std::string(e) + "\" (expected tcp://host:port or ipc://path)";
}

void check_trace(reader& r, trace_config& t) {
  if (!t.endpoint.empty()) {
    if (auto to = parse_http_url(t.endpoint, "/v1/traces")) {
      t.to = std::move(*to);
    } else {
      r.errors().add(*r.table().get("trace_endpoint"), r.key("trace_endpoint"),
                     "expected an OTLP/HTTP URL http://host[:port][/path], got \"" + t.endpoint + "\"");
    }
    return;
  }
  for (const char* k : {"trace_sample", "trace_max_queued", "trace_interval"}) {
    if (const toml::node* n = r.table().get(k)) r.errors().add(*n, r.key(k), "has no effect without trace_endpoint");
  }
}

std::string check_domain_name(std::string_view name) {
  if (name.empty()) return "domain name must not be empty";
  if (name.size() > 255) return "domain name longer than 255 bytes";
  if (name.find('\0') != std::string_view::npos) return "domain name must not contain \\0";
  return {};
}

bool both_or_neither(reader& r, const char* a, const char* b) {
  const toml::node* na = r.get(a);
  const toml::node* nb = r.get(b);
  if (na && nb) return true;
  if (na || nb) r.errors().add(na ? *na : *nb, r.key(na ? a : b), std::string("needs ") + (na ? b : a) + " too");
  return false;
}

// Two keys that go together (a certificate and its key): both or neither.
void check_pair(reader& r, const char* a, const std::string& a_value, const char* b, const std::string& b_value) {
  if (a_value.empty() == b_value.empty()) return;
  const char* set = a_value.empty() ? b : a;
  const char* missing = a_value.empty() ? a : b;
  r.errors().add(*r.table().get(set), r.key(set), std::string("needs ") + missing + " too");
}

// Files the keys name exist and can be read (whether they parse is checked
// where they are used: the proxy's --check loads them).
void check_readable(reader& r, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    const toml::node* n = r.table().get(key);
    const auto* v = n ? n->as_string() : nullptr;
    if (v && !v->get().empty() && !std::ifstream(v->get())) {
      r.errors().add(*n, r.key(key), "cannot read \"" + v->get() + "\"");
    }
  }
}

}  // namespace smockron::config::detail
