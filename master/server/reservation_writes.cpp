// The reservation book's copy in Redis (see reservation_writes.hpp).
#include "master/server/reservation_writes.hpp"

namespace smockron::master {

void reservation_writes::opened(const reservations::reservation& r) {
  pending_[r.tag] = {reservation_key(owner_, r.domain, r.identifier, r.tag),
                     encode_reservation({owner_, r.domain, r.identifier, r.tag, r.at_ms, r.units, r.opened_us})};
}

void reservation_writes::closed(const reservations::reservation& r) {
  const auto it = pending_.find(r.tag);
  if (it != pending_.end() && it->second.value) {
    pending_.erase(it);  // opened since the last flush: Redis never had it
    return;
  }
  // Written before (or read back from Redis at start): deleted there.
  pending_[r.tag] = {reservation_key(owner_, r.domain, r.identifier, r.tag), std::nullopt};
}

void reservation_writes::drain(std::vector<redis_store::write>& batch, std::chrono::microseconds timeout) {
  const auto ttl_ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout + k_reservation_keep).count();
  for (auto& [tag, w] : pending_) {
    if (w.value) batch.push_back({std::move(w.key), std::move(*w.value), ttl_ms});
    else batch.push_back({std::move(w.key), {}, 0, true});
  }
  pending_.clear();
}

}  // namespace smockron::master
