// Pace share: how many gatekeepers hold one client.
//
// A gatekeeper holds the requests of a client the master holds
// (DELAY_UNTIL) and releases them one interval apart behind the master's
// time. G gatekeepers that each pace at the rule's interval fill the same
// slots within a round trip, G times the rate; the master charges all of it
// and holds the client as long, and the admitted stream swings around the
// limit (docs/benchmarks.md, "Weighted traffic": 0.5 s with 1,300 units,
// then none, at G = 10 and 100 ms). So the interval a DELAY_UNTIL carries
// is the rule's times the number of gatekeepers holding the client: each
// paces its share, together the rate. The master's time itself is
// untouched, and so is every decision for a client under its limit: only
// messages that leave the client held are counted.
//
// The number is an effective one, (sum n)^2 / sum n^2 over the messages n
// each gatekeeper sent in the last second (a sliding-window count): G for G
// gatekeepers that see the client alike, near 1 when one sees nearly all of
// it (90% and 10%: 1.2), so that a client pinned to one gatekeeper with a
// little spill-over is not paced at half its rate there.
//
// Gatekeepers are told apart by the name their accounting connections give
// (X-Gatekeeper, shared/protocol/zmtp.hpp): a proxy has one connection per
// worker. A connection that names none is not counted (ingest.cpp), and
// nothing is counted without the master's `pace_share = true`, nor for a
// time an exactly logged rule set (ingest::pace_shareable() says why). A
// gatekeeper whose last connection closes is forgotten at once (forget()).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/string_hash.hpp"

namespace smockron::master {

class pace_share {
public:
  /// The window the messages are counted over.
  static constexpr std::int64_t k_window_us = 1'000'000;
  /// Clients counted at most; beyond, a new one is not counted (its gatekeepers pace at the rule's interval).
  static constexpr std::size_t k_max_clients = 65'536;
  /// Gatekeepers counted per client at most (more are not counted). With
  /// k_max_clients, at most ~50 MB of counts (each 24 bytes).
  static constexpr std::size_t k_max_gatekeepers = 32;

  /// `gatekeeper` sent a message about (domain, identifier) at `now_us`
  /// that left the client held: the effective number of gatekeepers holding
  /// it, this message counted (1 when the client cannot be counted).
  double seen(std::size_t domain, std::string_view identifier, std::uint64_t gatekeeper, std::int64_t now_us);
  /// The effective number as it stands (1 for a client not counted), counting nothing.
  double count(std::size_t domain, std::string_view identifier, std::int64_t now_us);
  /// Forgets the clients no gatekeeper sent a message about for a window or
  /// more (one pass over the table: at most k_max_clients, once a second).
  void sweep(std::int64_t now_us);
  /// Forgets what `gatekeeper` sent (every connection it had closed: a
  /// proxy that exited, or was killed, is gone at once rather than counted
  /// for up to two windows while the others pace at their old share; one
  /// whose connections all dropped and come back under the same name starts
  /// its count afresh, which moves only the pace). One pass over the
  /// table, as a sweep.
  void forget(std::uint64_t gatekeeper);
  std::size_t clients() const { return clients_.size(); }

private:
  struct sighting {
    std::uint64_t gatekeeper;
    std::int64_t window_us;  ///< the start of the window `current` counts
    std::uint32_t previous;  ///< messages in the window before it
    std::uint32_t current;
  };
  /// The key of (domain, identifier), in key_.
  void make_key(std::size_t domain, std::string_view identifier);
  /// Rolls each of `seen` to the window starting at `window` and drops the silent ones.
  static void roll_all(std::vector<sighting>& seen, std::int64_t window);
  /// The effective number over `seen` (rolled to the window starting at `window`).
  static double effective(const std::vector<sighting>& seen, std::int64_t window, std::int64_t now_us);

  string_map<std::vector<sighting>> clients_;  ///< key: the domain's index (4 bytes), then the identifier
  std::string key_;                            ///< scratch for the key (no allocation per message)
};

}  // namespace smockron::master
