// The reservations the gatekeepers hold open: uses reported at an estimate
// ("reserve=N") not yet corrected ("adjust=N"), each tied to the accounting
// connection it came on. The reservation dies with its gatekeeper: when the
// connection closes, or once it is older than the reservation timeout, its
// units are given back (by the caller, ingest). Bounded: at most `max_open`
// (more are not tracked, counted by the caller). Single-threaded, like ingest.
//
// A reservation read back from Redis after a restart (restore()) belongs to
// no connection (k_restored): its gatekeeper's correction closes it, whatever
// connection that comes on now, and the timeout ends it otherwise.
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
  /// The peer of a reservation restored from Redis (no connection of this run).
  static constexpr std::uint64_t k_restored = ~0ULL;

  struct reservation {
    std::uint64_t peer = 0;  ///< the accounting connection (its gatekeeper worker), or k_restored
    std::string domain;
    std::string identifier;
    std::int64_t at_ms = 0;      ///< the use's time (what the correction names)
    std::int64_t units = 0;      ///< the estimate charged
    std::int64_t opened_us = 0;  ///< when the master received it
    std::uint64_t tag = 0;       ///< unique among the reservations of every run (names its Redis record)
  };

  explicit reservations(std::size_t max_open) : max_open_(max_open) {}

  /// Holds a reservation open: the one held, or nullptr (not tracked) when
  /// max_open are already (valid until it is closed).
  const reservation* open(reservation r);
  /// Holds open a reservation of an earlier run (its peer becomes
  /// k_restored), in the order of its opened_us among those restored; false
  /// when max_open are already.
  bool restore(reservation r);
  /// The correction of (peer, domain, identifier, at_ms) arrived: the
  /// reservation is closed (of several such, the first opened; else a
  /// restored one of that use); what it was, or nothing when none is open
  /// (closed already by its gatekeeper's departure or the timeout, or never
  /// tracked).
  std::optional<reservation> close(std::uint64_t peer, std::string_view domain, std::string_view identifier,
                                   std::int64_t at_ms);
  /// Closes and returns every reservation of `peer` (its connection closed).
  std::vector<reservation> take_peer(std::uint64_t peer);
  /// Closes and returns reservations opened before `before_us`, at most `budget`, oldest first.
  std::vector<reservation> take_older(std::int64_t before_us, std::size_t budget);

  /// A reservation given back (its gatekeeper gone, or the timeout) whose
  /// correction may still come: a gatekeeper whose connection dropped and
  /// came back, a response longer than the timeout. Remembered, at most
  /// k_max_released, the oldest forgotten first.
  void remember_released(const reservation& r);
  /// The units given back for the use (domain, identifier, at_ms), once (of
  /// several, the oldest): its late correction charges them again.
  std::optional<std::int64_t> take_released(std::string_view domain, std::string_view identifier, std::int64_t at_ms);
  static constexpr std::size_t k_max_released = 65536;

  std::size_t size() const { return order_.size(); }
  /// Calls `f` with each open reservation, oldest first.
  template <class F>
  void each(F&& f) const {
    for (const auto& r : order_) f(r);
  }
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
  // Given back, remembered for a late correction: in release order, indexed by
  // (domain, identifier, at_ms) with peer 0 (a correction may come on any connection).
  list released_;
  std::unordered_multimap<key, list::iterator, key_hash> released_index_;
};

/// Told of every reservation the book opens and closes, however it closes
/// (a correction, its gatekeeper gone, the timeout): a store that keeps a
/// copy of the book, so that a restarted master knows what is still open.
class reservation_log {
public:
  virtual void opened(const reservations::reservation& r) = 0;
  virtual void closed(const reservations::reservation& r) = 0;

protected:
  ~reservation_log() = default;
};

}  // namespace smockron::master
