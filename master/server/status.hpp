// The master's /status document (JSON): the store, and per domain its
// algorithm, rules and tracked identifiers; one identifier's standing; and
// who is limited now (/top).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "master/core/rules.hpp"
#include "master/engine/ingest.hpp"
#include "shared/base/metrics.hpp"
#include "shared/config/config.hpp"

namespace smockron::master {

struct store_status {
  bool connected = false;
  std::size_t unwritten_states = 0;
};

/// `store`: nothing for the memory store. Tracked identifiers are read from
/// the per-domain gauges in `reg` (thread-safe). `rls_port`: the port of
/// Envoy's rate limit services as bound (0: off), shown as "rls".
std::string status_json(const config::master_config& cfg, const std::optional<store_status>& store,
                        metrics::registry& reg, std::uint16_t rls_port = 0);

/// JSON for GET /status/<domain>/<identifier>: the rules that apply
/// (`overridden`: the identifier's own, from the domain's overrides), the
/// recorded uses (sliding log) or theoretical arrival times (GCRA), and
/// whether the identifier is throttled now and until when. `st`: its state,
/// nothing when none is tracked (never seen, or expired limiter::k_late_us ago).
/// What /status/DOMAIN/IDENTIFIER shows beside the rules: the tier whose
/// rules they are, its share of the domain's shared rate, and its concurrency
/// slots (held now, and the limit in force: its own or its share of the
/// domain's shared limit).
struct identifier_extras {
  std::string_view tier;  ///< empty: none
  std::optional<shares::view> share;
  std::int64_t slots_held = -1;   ///< -1: no lease
  std::int64_t slots_limit = -1;  ///< -1: none
};
std::string identifier_status_json(std::string_view domain, std::string_view identifier, const rules::limits& limits,
                                   bool overridden, const rules::state* st, std::int64_t now_us,
                                   const identifier_extras& extras = {});

/// JSON for GET /top: per domain (every domain when `domain` is empty), the
/// `n` identifiers limited most in the last 30 to 60 s (top.hpp), each with
/// its limited uses (and the summary's possible error), whether it is
/// throttled now and until when, and its uses and refusals in that window.
/// Empty when `domain` names no domain.
std::string top_json(const ingest& in, std::string_view domain, std::size_t n, std::int64_t now_us);

}  // namespace smockron::master
