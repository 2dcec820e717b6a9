// Exact admission on the master's side (shared/protocol/wire_lease.hpp: ASK,
// ANSWER): the units the master has said GO to and not yet seen accounted.
//
// A GO is counted as a use at every later decision until the request's own
// accounting message settles it: an ACCEPTED from the same connection, for
// the same identifier, naming the ASK's number ("ask=SEQ"); that message
// then charges the units, as any use, at its time or the GO's, whichever is
// later (a gatekeeper's clock behind the master's never places a use before
// it was let go). A unit is therefore counted from the moment the master
// lets it go until it is charged, never neither: no gatekeeper, however far,
// admits a unit the master has not counted.
//
// A GO whose accounting never comes is dropped when its connection closes
// (its gatekeeper died, and with it whatever it had in flight) or after
// k_ttl_us (the message was lost). Single-threaded, like ingest; no sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/string_hash.hpp"

namespace smockron::master {

class asks {
public:
  /// A GO not settled this long is dropped (its accounting message was lost).
  static constexpr std::int64_t k_ttl_us = 10'000'000;

  explicit asks(std::size_t max_entries) : max_entries_(max_entries) {}

  /// Units said GO to and not settled for (domain, identifier).
  std::int64_t open_units(std::string_view domain, std::string_view identifier) const;
  /// Notes a GO of `cost` units given to connection `peer` for its ASK
  /// number `seq`. False: not kept (max_entries identifiers have GOs open already).
  bool open(std::uint64_t peer, std::string_view domain, std::string_view identifier, std::int64_t seq,
            std::int64_t cost, std::int64_t now_us);
  /// The request of (domain, identifier) whose ASK on `peer` was number
  /// `seq` went: its GO is settled. Returns when the GO was given; nothing
  /// when none is open (dropped, or never given).
  std::optional<std::int64_t> settle(std::uint64_t peer, std::string_view domain, std::string_view identifier,
                                     std::int64_t seq);
  /// Connection `peer` closed: its GOs are dropped. Returns how many.
  std::size_t peer_closed(std::uint64_t peer);
  /// Drops the GOs older than k_ttl_us. Returns how many.
  std::size_t expire(std::int64_t now_us);

  /// Identifiers with GOs open, and their units in all.
  std::size_t size() const { return entries_.size(); }
  std::int64_t units() const { return units_; }
  void set_max_entries(std::size_t n) { max_entries_ = n; }

private:
  struct item {
    std::uint64_t peer = 0;
    std::int64_t seq = 0;
    std::int64_t cost = 0;
    std::int64_t since_us = 0;
  };
  struct entry {
    std::int64_t units = 0;
    std::vector<item> items;  ///< in the order the GOs were given
  };
  /// Drops the items `drop` selects; forgets the entry when none is left. Returns how many.
  template <class F>
  std::size_t drop_if(F&& drop);
  const std::string& key(std::string_view domain, std::string_view identifier) const;

  std::size_t max_entries_;
  string_map<entry> entries_;  ///< key: domain + "\0" + identifier
  std::int64_t units_ = 0;
  mutable std::string key_;  ///< scratch for lookups
};

}  // namespace smockron::master
