// The concurrency leases the master has handed out (shared/protocol/wire_lease.hpp):
// for each (domain, identifier) under a concurrency rule of N, the slots each
// holder (a gatekeeper worker, on one accounting connection) may use, never
// adding up to more than N. Single-threaded, like ingest; no sockets: the
// caller publishes the GRANTs take_changed() names.
//
// How slots move:
// - A holder reports what it wants (in flight plus waiting) and what it gave
//   back (LEASE). Give-backs free slots at once; free slots go to holders
//   that want more, first to those that asked first, each up to its fair
//   share, then beyond it while slots are left.
// - Fair share: max-min over the wants (a holder that wants less than an
//   equal split gets what it wants; the rest is split among the others).
//   While a holder waits and none are free, each holder above its share is
//   asked to come down to it (its cap), and gives slots back as its requests
//   end: demand that moves between gatekeepers takes the time of the
//   requests in flight plus one round trip.
// - A holder's slots are freed when its connection closes; one that comes
//   back claims what it still has in flight (its first LEASE on the new
//   connection), even beyond N, and nothing more is granted until the total
//   is under N again.
// - A domain's shared limit S (all its identifiers together) is a pool: each
//   identifier's limit becomes the lower of its own and its max-min share of
//   S among the identifiers that want slots (weighted: an identifier of
//   weight w counts as w even ones), and no grant takes the pool
//   past S (an identifier above its share gives back as its requests end).
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/string_hash.hpp"
#include "shared/protocol/wire_lease.hpp"

namespace smockron::master {

class leases {
public:
  struct holder {
    std::uint64_t peer = 0;     ///< the accounting connection
    std::uint64_t id = 0;       ///< the holder's own name (LEASE, GRANT)
    std::int64_t held = 0;      ///< slots counted for it
    std::int64_t cap = 0;       ///< of them, usable for new requests (below held: asked to give some back)
    std::int64_t want = 0;      ///< last reported: in flight plus waiting
    std::int64_t seen = 0;      ///< its give-backs counted so far
    std::int64_t asked_us = 0;  ///< since when it wants more than it holds (0: it does not)
    bool changed = false;       ///< held or cap changed since its last GRANT
  };

  explicit leases(std::size_t max_entries) : max_entries_(max_entries) {}

  /// The limits of one identifier: its own (0: none) and its domain's shared one (0: none).
  struct limits {
    std::int64_t own = 0;
    std::int64_t shared = 0;
    std::int64_t weight = 1;  ///< its weight in the shared limit's split
  };
  /// Applies a LEASE from connection `peer` for an identifier under `l`
  /// (neither: every want is granted). False: not tracked (max_entries
  /// identifiers hold leases already).
  bool on_lease(std::uint64_t peer, const wire::lease& m, limits l, std::int64_t now_us);
  /// Connection `peer` closed: its slots are free (given to those waiting). Returns how many.
  std::int64_t peer_closed(std::uint64_t peer, std::int64_t now_us);
  /// New limits (a reload): `limits_of(domain, identifier, tier)` is what
  /// applies now (tier: the one its holders' last LEASE named).
  template <class F>
  void relimit(F&& limits_of, std::int64_t now_us) {
    std::vector<entry*> all;
    for (auto& [key, e] : entries_) all.push_back(&e);
    for (entry* e : all) {
      const auto [domain, identifier] = split(*e->key);
      set_limits(*e, limits_of(domain, identifier, std::string_view(e->tier)));
    }
    for (entry* e : all) settle(*e, now_us);
  }

  /// Calls f(domain, identifier, holder) for every holder whose grant
  /// changed since the last call (each once), and forgets the ones with
  /// nothing held or wanted.
  template <class F>
  void take_changed(F&& f) {
    for (const std::string& key : changed_) {
      const auto it = entries_.find(key);
      if (it == entries_.end()) continue;
      const auto [domain, identifier] = split(it->first);
      for (holder& h : it->second.holders) {
        if (h.changed) f(domain, identifier, static_cast<const holder&>(h));
        h.changed = false;
      }
      prune(it);
    }
    changed_.clear();
  }
  /// Calls f(domain, identifier, holder) for every holder (the periodic GRANT that heals a lost one).
  template <class F>
  void each(F&& f) const {
    for (const auto& [key, e] : entries_) {
      const auto [domain, identifier] = split(key);
      for (const holder& h : e.holders) f(domain, identifier, h);
    }
  }

  /// Identifiers with leases, and slots held in all.
  std::size_t size() const { return entries_.size(); }
  std::int64_t held() const { return held_; }
  /// The slots one identifier's holders hold (the `/status` view; -1: none).
  std::int64_t held_by(std::string_view domain, std::string_view identifier) const;
  /// The limit in force for one identifier with leases: its own, or lower,
  /// its max-min share of its domain's shared limit (-1: none, or no lease).
  std::int64_t limit_of(std::string_view domain, std::string_view identifier) const;
  void set_max_entries(std::size_t n) { max_entries_ = n; }

private:
  static constexpr std::int64_t k_unlimited = INT64_MAX;
  struct pool;
  struct entry {
    const std::string* key = nullptr;  ///< its key in entries_ (nodes never move)
    std::int64_t own = k_unlimited;    ///< its own limit
    std::int64_t limit = k_unlimited;  ///< in force: its own, or lower, its share of the pool
    pool* in = nullptr;                ///< its domain's shared limit, if any
    std::string tier;                  ///< the tier the last LEASE named (its limit's, on a reload)
    std::int64_t weight = 1;           ///< in its pool's split
    std::vector<holder> holders;
  };
  /// A domain's shared limit and the identifiers under it.
  struct pool {
    std::int64_t limit = 0;
    std::int64_t held = 0;
    std::vector<entry*> members;
  };
  using map = string_map<entry>;
  static std::string key_of(std::string_view domain, std::string_view identifier);
  static std::pair<std::string_view, std::string_view> split(std::string_view key);
  /// Sets an entry's own limit and pool (not its share: settle() does).
  void set_limits(entry& e, limits l);
  /// Rebalances the entry, or its whole pool (the shares move), and notes what changed.
  void settle(entry& e, std::int64_t now_us);
  /// Hands free slots out and sets the caps (no more than `*pool_free` more
  /// when under a pool); marks what changed.
  void rebalance(entry& e, std::int64_t now_us, std::int64_t* pool_free = nullptr);
  void rebalance_pool(pool& p, std::int64_t now_us);
  /// Drops holders with nothing held or wanted, and the entry when none is left.
  void prune(map::iterator it);
  void erase(map::iterator it);

  std::size_t max_entries_;
  map entries_;
  string_map<pool> pools_;            ///< by domain
  std::vector<std::string> changed_;  ///< keys of entries with a changed holder
  std::int64_t held_ = 0;
};

}  // namespace smockron::master
