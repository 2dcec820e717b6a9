// Domain ids (see domain_registry.hpp).
#include "proxy/cluster/domain_registry.hpp"

#include <string>

namespace smockron::proxy {

std::uint32_t domain_registry::id(std::string_view name) {
  std::lock_guard lock(mutex_);
  auto it = ids_.find(name);
  if (it != ids_.end()) return it->second;
  const auto next = static_cast<std::uint32_t>(ids_.size());
  ids_.emplace(std::string(name), next);
  return next;
}

std::optional<std::uint32_t> domain_registry::find(std::string_view name) const {
  std::lock_guard lock(mutex_);
  auto it = ids_.find(name);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

}  // namespace smockron::proxy
