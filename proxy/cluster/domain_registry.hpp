// Stable numeric ids for domain names: the gate's keys. Routes resolve
// their domain's id once per configuration; the control subscriber resolves
// the domain of each control message. Ids only grow (a reload that drops a
// domain keeps its id, so a later reload that brings it back finds its state).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>

#include "shared/base/string_hash.hpp"

namespace smockron::proxy {

class domain_registry {
public:
  /// The id of `name`, assigned on first use. Thread-safe.
  std::uint32_t id(std::string_view name);
  /// Id of a known domain, or nothing. Thread-safe.
  std::optional<std::uint32_t> find(std::string_view name) const;

private:
  mutable std::mutex mutex_;
  string_map<std::uint32_t> ids_;
};

}  // namespace smockron::proxy
