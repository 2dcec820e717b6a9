// The reservation book's copy in Redis (store = "redis"): each reservation
// opened becomes a record (reservation_record.hpp), each closed one is
// deleted, so that a restarted master reads back what is still open and
// gives it back if no correction comes. Written behind with the states: a
// reservation opened and closed between two flushes (most requests) never
// reaches Redis. Loop thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "master/engine/reservations.hpp"
#include "master/store/redis_store.hpp"

namespace smockron::master {

class reservation_writes final : public reservation_log {
public:
  /// `owner`: this master's (reservation_owner()).
  explicit reservation_writes(std::string owner) : owner_(std::move(owner)) {}

  void opened(const reservations::reservation& r) override;
  void closed(const reservations::reservation& r) override;
  /// Moves what is to be written into `batch`; a record lives in Redis for
  /// `timeout` (reservation_timeout) + k_reservation_keep.
  void drain(std::vector<redis_store::write>& batch, std::chrono::microseconds timeout);
  std::size_t pending() const { return pending_.size(); }

private:
  struct pending_write {
    std::string key;
    std::optional<std::string> value;  ///< SET it; nothing: DEL the key
  };
  std::string owner_;
  std::unordered_map<std::uint64_t, pending_write> pending_;  ///< by the reservation's tag
};

}  // namespace smockron::master
