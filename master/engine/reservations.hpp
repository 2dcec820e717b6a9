// The reservations the gatekeepers hold open: uses reported at an estimate
// ("reserve=N") not yet corrected ("adjust=N"), each tied to the accounting
// connection it came on. The reservation dies with its gatekeeper: when the
// connection closes, or once it is older than the reservation timeout, its
// units are given back (by the caller, ingest). Bounded: at most `max_open`
// (more are not tracked, counted by the caller). Single-threaded, like ingest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace smockron::master {

class reservations {
public:
  struct reservation {
    std::uint64_t peer = 0;  ///< the accounting connection (its gatekeeper worker)
    std::string domain;
    std::string identifier;
    std::int64_t at_ms = 0;      ///< the use's time (what the correction names)
    std::int64_t units = 0;      ///< the estimate charged
    std::int64_t opened_us = 0;  ///< when the master received it
  };

  explicit reservations(std::size_t max_open) : max_open_(max_open) {}

  /// Holds a reservation open; false (not tracked) when max_open are already.
  bool open(reservation r);
  /// The correction of (peer, domain, identifier, at_ms) arrived: the
  /// reservation is closed (of several such, the first opened); its units, or nothing when none is open (closed
  /// already by its gatekeeper's departure or the timeout, or never tracked).
  std::optional<std::int64_t> close(std::uint64_t peer, std::string_view domain, std::string_view identifier,
                                    std::int64_t at_ms);
  /// Closes and returns every reservation of `peer` (its connection closed).
  std::vector<reservation> take_peer(std::uint64_t peer);
  /// Closes and returns reservations opened before `before_us`, at most `budget`, oldest first.
  std::vector<reservation> take_older(std::int64_t before_us, std::size_t budget);

  std::size_t size() const { return order_.size(); }
  void set_max_open(std::size_t n) { max_open_ = n; }

private:
  struct key {
    std::uint64_t peer;
    std::string_view domain;
    std::string_view identifier;
    std::int64_t at_ms;
    bool operator==(const key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const key& k) const;
  };
  using list = std::list<reservation>;
  static key key_of(const reservation& r) { return {r.peer, r.domain, r.identifier, r.at_ms}; }
  reservation take(list::iterator it);

  std::size_t max_open_;
  list order_;  ///< in the order they were opened (keys view into these nodes, which never move)
  struct slot {
    std::uint64_t seq;  ///< the order it was opened in
    list::iterator it;
  };
  std::unordered_multimap<key, slot, key_hash> index_;
  std::uint64_t seq_ = 0;
};

}  // namespace smockron::master
