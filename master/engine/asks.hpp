// Exact admission on the master's side (shared/protocol/wire_lease.hpp: ASK,
// ANSWER): the units the master has said GO to and not yet seen accounted.
//
// A GO is counted as a use, at the time its request is expected to go, at
// every later decision until the request's own accounting message settles
// it: an ACCEPTED from the same connection, for the same identifier, naming
// the ASK's number ("ask=SEQ"); that message then charges the units, as any
// use, at its time or the expected one, whichever is later (a gatekeeper's
// clock behind the master's never places a use before it was let go). A
// unit is therefore counted from the moment the master lets it go until it
// is charged, never neither: no gatekeeper, however far, admits a unit the
// master has not counted.
//
// When a request is expected to go: a GO for a time, at that time; a GO for
// now, when the answer reaches its gatekeeper. That is its connection's lag
// (lag_us): how long after a GO its requests went lately, learnt from their
// accounting (the clocks are the protocol's, in step). Placed later than it
// went, a use costs the client a little (rules refill from its time); placed
// earlier, the rules would refill from before the units were spent and admit
// that much more, which is what a round trip of 200 ms did to GCRA's windows.
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
#include <unordered_map>
#include <vector>

#include "master/core/rules.hpp"
#include "shared/base/string_hash.hpp"

namespace smockron::master {

class asks {
public:
  /// A GO not settled this long is dropped (its accounting message was lost).
  static constexpr std::int64_t k_ttl_us = 10'000'000;

  explicit asks(std::size_t max_entries) : max_entries_(max_entries) {}

  /// The most a connection's lag is taken to be (a stall of its gatekeeper
  /// would otherwise hold every GO it is given that long).
  static constexpr std::int64_t k_max_lag_us = 1'000'000;

  /// Units said GO to and not settled for (domain, identifier).
  std::int64_t open_units(std::string_view domain, std::string_view identifier) const;
  /// The GOs not settled for (domain, identifier), as uses at the times their
  /// requests are expected to go, in time order (replacing `out`'s content).
  void pending(std::string_view domain, std::string_view identifier, std::vector<rules::event>& out) const;
  /// Notes a GO of `cost` units given at `now_us` to connection `peer` for
  /// its ASK number `seq`, its request expected to go at `expected_us`; `at_us`
  /// is the time the GO names (0: now). False: not kept (max_entries
  /// identifiers have GOs open already).
  bool open(std::uint64_t peer, std::string_view domain, std::string_view identifier, std::int64_t seq,
            std::int64_t cost, std::int64_t now_us, std::int64_t at_us, std::int64_t expected_us);
  /// The request of (domain, identifier) whose ASK on `peer` was number
  /// `seq` went at `went_us`: its GO is settled (and the connection's lag
  /// learnt from it). Returns when it was expected to go; nothing when no GO
  /// is open (dropped, or never given).
  std::optional<std::int64_t> settle(std::uint64_t peer, std::string_view domain, std::string_view identifier,
                                     std::int64_t seq, std::int64_t went_us);
  /// How long after a GO for now the requests of `peer` went lately: the
  /// largest seen, fading by 1/16 of the difference with each smaller one;
  /// 0 before any; at most k_max_lag_us.
  std::int64_t lag_us(std::uint64_t peer) const;
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
    std::int64_t given_us = 0;     ///< when the GO was given
    std::int64_t at_us = 0;        ///< the time it names (0: now)
    std::int64_t expected_us = 0;  ///< when its request is counted as going
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
  string_map<entry> entries_;                             ///< key: domain + "\0" + identifier
  std::unordered_map<std::uint64_t, std::int64_t> lags_;  ///< per connection (lag_us)
  std::int64_t units_ = 0;
  mutable std::string key_;  ///< scratch for lookups
};

}  // namespace smockron::master
