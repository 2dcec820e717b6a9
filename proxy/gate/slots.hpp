// Concurrency on the gatekeeper's side (shared/protocol/wire_lease.hpp).
//
// concurrency_policies: the CONCURRENCY limits masters publish, kept fresh
// as POLICY is (a limit not refreshed for wire::policy_fresh_ms is dropped:
// a silent master means no limit). Written by the control thread, read by
// every worker.
//
// slot_table: one worker's leases, on its own thread, nothing locked. A
// request of an identifier under a concurrency rule takes a slot before it
// is forwarded and gives it back when its exchange ends (response done,
// client gone, upstream failed). It goes at once while the worker holds a
// free slot of its lease; otherwise it waits, first come first served, and
// the worker asks its master for more (LEASE). Slots come with GRANTs; the
// ones not needed are given back: at once when the master asks for them (its
// cap below what is held), else after k_linger without use, so a steady
// client costs no round trip per request. With no master delivering for the
// domain, requests go (fail-open) and are counted in flight, so that a
// worker whose connection comes back claims what it still has running.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "shared/base/clock.hpp"
#include "shared/base/string_hash.hpp"
#include "shared/protocol/wire_lease.hpp"

namespace smockron::proxy {

class concurrency_policies {
public:
  /// Sets (domain, identifier)'s limit (identifier empty: the domain's; `limit` 0 for an identifier: none).
  void set(std::string_view domain, std::string_view identifier, std::int64_t limit, std::int64_t now_us);
  /// Sets a tier's limit (TIER; 0: none for the tier's clients).
  void set_tier(std::string_view domain, std::string_view tier, std::int64_t limit, std::int64_t now_us);
  /// The limit of one identifier now, whose request names `tier` (empty:
  /// none): its override's, else its tier's, else the domain's; 0: none (no
  /// fresh policy, or the rules that apply have none).
  std::int64_t limit(std::string_view domain, std::string_view identifier, std::int64_t now_us,
                     std::string_view tier = {}) const;
  /// True once some master has published a CONCURRENCY (the per-request check is skipped until then).
  bool any() const { return any_.load(std::memory_order_relaxed); }

private:
  struct item {
    std::int64_t limit = 0;
    std::int64_t updated_us = 0;
  };
  struct domain_items {
    item own;
    string_map<item> overrides;
    string_map<item> tiers;
  };
  mutable std::mutex mutex_;
  string_map<domain_items> domains_;
  std::atomic<bool> any_{false};
};

class slot_table {
public:
  /// Slots not used for this long are given back (unless asked for sooner).
  static constexpr std::int64_t k_linger_us = 2'000'000;
  /// What still waits is asked for again this often (a LEASE lost on the way).
  static constexpr std::int64_t k_ask_again_us = 1'000'000;
  /// An identifier with nothing held, wanted or in flight is forgotten after
  /// this long: by then no GRANT for it is on its way, and the master has
  /// forgotten this worker's lease too (its give-back count starts over).
  static constexpr std::int64_t k_forget_us = 30'000'000;
  /// Identifiers one worker tracks at most; beyond, requests go unlimited (counted).
  static constexpr std::size_t k_max_entries = 100'000;

  struct entry;
  /// A request waiting for a slot; owned by the request, which must outlive
  /// its wait (cancel() before it goes away). `wake` runs when the slot is
  /// its (it is then in flight: release() it when its exchange ends).
  struct waiter {
    std::function<void()> wake;
    entry* on = nullptr;
    waiter* prev = nullptr;
    waiter* next = nullptr;
    entry* granted = nullptr;  ///< set before wake: the slot is of this entry
  };
  struct entry {
    std::string domain, identifier;
    std::int64_t in_use = 0;    ///< requests of this worker in flight
    std::int64_t held = 0;      ///< slots the master counts for this worker
    std::int64_t cap = 0;       ///< of them, usable for new requests
    std::int64_t returned = 0;  ///< slots given back since the start
    std::int64_t sent_want = 0;
    std::int64_t sent_returned = 0;
    std::int64_t idle_since_us = 0;   ///< since when more is held than wanted (0: not)
    std::int64_t asked_us = 0;        ///< when the last LEASE left
    std::int64_t quiet_since_us = 0;  ///< since when nothing is held, wanted or in flight (0: not)
    std::string tier;                 ///< the tier the last request named (LEASE carries it)
    std::size_t waiting = 0;
    std::int64_t counted[3] = {};  ///< in_use, held, waiting as added to the table's totals
    waiter* head = nullptr;
    waiter* tail = nullptr;
  };

  /// `holder`: this worker's name in LEASE and GRANT. `send` delivers a LEASE.
  /// `clk`: the time for held_slot's release.
  slot_table(std::uint64_t holder, std::function<void(const wire::lease&)> send, const clock& clk)
      : holder_(holder), send_(std::move(send)), clock_(clk) {}
  std::int64_t now_us() const { return clock_.wall_us(); }

  /// A request of (domain, identifier) wants a slot. `online`: a master
  /// delivers for the domain. `tier`: the tier the request names (the
  /// master's limit is that tier's). Returns the entry it holds a slot of (in
  /// flight), or nullptr: it waits in `w` until woken.
  /// The untracked case (k_max_entries already): `untracked` is returned, a
  /// slot of nothing (release() ignores it).
  entry* acquire(std::string_view domain, std::string_view identifier, bool online, waiter& w, std::int64_t now_us,
                 std::string_view tier = {});
  entry* untracked() { return &untracked_; }
  /// A request holding a slot of `e` ended.
  void release(entry& e, std::int64_t now_us);
  /// A waiting request gave up (its client left, or it waited too long).
  void cancel(waiter& w, std::int64_t now_us);
  /// A GRANT naming this worker.
  void on_grant(const wire::grant& g, std::int64_t now_us);
  /// The master connection delivering for `domain` came or went: gone, the
  /// lease is void (requests go, fail-open); back, what is in flight is
  /// claimed. `online(domain)` says which now.
  void links_changed(const std::function<bool(std::string_view)>& online, std::int64_t now_us);
  /// Gives back slots idle for k_linger_us and asks again for what still waits.
  void tick(std::int64_t now_us);

  /// No LEASE leaves from now on (the worker stops: its accounting sender
  /// goes before the requests still holding slots do).
  void silence() { send_ = nullptr; }

  std::uint64_t holder() const { return holder_; }
  std::size_t entries() const { return entries_.size(); }
  /// Requests in flight and waiting, and slots held, over all entries (any thread: metrics).
  std::int64_t in_use() const { return totals_[0].load(std::memory_order_relaxed); }
  std::int64_t held() const { return totals_[1].load(std::memory_order_relaxed); }
  std::int64_t waiting() const { return totals_[2].load(std::memory_order_relaxed); }

private:
  /// Wakes waiters while a usable slot is free.
  void serve(entry& e);
  /// Gives back what is not kept and tells the master what changed; forgets an empty entry.
  void report(entry& e, std::int64_t now_us, bool force = false);
  void unlink(waiter& w);
  /// Adds the entry's changes to the totals.
  void count(entry& e);

  entry* find_or_add(std::string_view domain, std::string_view identifier);

  std::uint64_t holder_;
  std::function<void(const wire::lease&)> send_;
  const clock& clock_;
  string_map<entry> entries_;  ///< key: domain + "\0" + identifier (nodes never move)
  entry untracked_;
  std::string key_;  ///< scratch for lookups
  std::array<std::atomic<std::int64_t>, 3> totals_{};
};

/// A request's place in a slot queue, left when it is destroyed (a
/// connection torn down while it waits). Never moved while it waits.
struct slot_wait {
  slot_wait() = default;
  slot_wait(const slot_wait&) = delete;
  slot_wait& operator=(const slot_wait&) = delete;
  ~slot_wait() {
    if (table != nullptr && w.on != nullptr) table->cancel(w, table->now_us());
  }
  slot_table* table = nullptr;
  slot_table::waiter w;
};

/// A slot a request holds, given back when it ends (or is destroyed: a
/// connection torn down, a worker stopping).
class held_slot {
public:
  held_slot() = default;
  held_slot(slot_table& t, slot_table::entry* e) : table_(&t), slot_(e) {}
  held_slot(held_slot&& o) noexcept : table_(o.table_), slot_(std::exchange(o.slot_, nullptr)) {}
  held_slot& operator=(held_slot&& o) noexcept {
    if (this != &o) {
      reset();
      table_ = o.table_;
      slot_ = std::exchange(o.slot_, nullptr);
    }
    return *this;
  }
  held_slot(const held_slot&) = delete;
  held_slot& operator=(const held_slot&) = delete;
  ~held_slot() { reset(); }
  void reset() {
    if (slot_ != nullptr) table_->release(*std::exchange(slot_, nullptr), table_->now_us());
  }
  explicit operator bool() const { return slot_ != nullptr; }

private:
  slot_table* table_ = nullptr;
  slot_table::entry* slot_ = nullptr;
};

}  // namespace smockron::proxy
