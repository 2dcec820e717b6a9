// The master's side of concurrency leases (see ingest.hpp, leases.hpp).
#include "master/engine/ingest.hpp"

namespace smockron::master {

void ingest::handle_lease(std::span<const std::string_view> frames, std::int64_t now_us, std::uint64_t peer) {
  const auto msg = wire::decode_lease(frames);
  if (!msg) {
    decode_errors_[static_cast<int>(msg.error())]->inc();
    log_bad("malformed LEASE message", wire::to_string(msg.error()));
    return;
  }
  const auto it = index_.find(msg->domain);
  if (it == index_.end()) {
    unknown_domain_.inc();
    log_bad("LEASE message for unknown domain", msg->domain);
    return;
  }
  lease_messages_.inc();
  const rules::limits& l = limiter_.limits_of(it->second, msg->identifier, msg->tier);
  if (leases_.on_lease(peer, msg.value(), {l.concurrency, l.shared_concurrency, l.weight}, now_us)) return;
  // The book is full: fail-open, as an untracked identifier is everywhere
  // else (granted what it wants, counted against nothing).
  leases_untracked_.inc();
  untracked_grants_.push_back(
      {std::string(msg->domain), std::string(msg->identifier), msg->holder, msg->want, msg->returned});
}

}  // namespace smockron::master
