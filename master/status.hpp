// The master's /status document (JSON): the store, and per domain its
// algorithm, rules and tracked identifiers.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "smockron/config.hpp"
#include "smockron/metrics.hpp"

namespace smockron::master {

struct store_status {
  bool connected = false;
  std::size_t unwritten_states = 0;
};

/// `store`: nothing for the memory store. Tracked identifiers are read from
/// the per-domain gauges in `reg` (thread-safe).
std::string status_json(const config::master_config& cfg, const std::optional<store_status>& store,
                        metrics::registry& reg);

}  // namespace smockron::master
