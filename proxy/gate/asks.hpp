// Exact admission on the gatekeeper's side (shared/protocol/wire_lease.hpp:
// ASK, ANSWER, EXACT).
//
// exact_domains: the domains whose master publishes EXACT, kept fresh as
// POLICY is (one not refreshed for wire::policy_fresh_ms is dropped: a
// silent master means the gatekeeper decides alone again). Written by the
// control thread, read by every worker.
//
// ask_table: one worker's questions to its masters, on its own thread,
// nothing locked. A request of an exact domain asks before it goes (ASK) and
// waits for the ANSWER: go (its accounting message, sent as it goes, settles
// the master's GO), wait until a time (it is held and asks again, or is
// refused when that is past max_delay), or never. A request that stops
// waiting (its client left, or no answer came in time and it went without
// one, charged by its own accounting) leaves its question behind: a GO that
// still comes for it is settled at once with a use of no units naming it, so
// the master does not count its units until the GO's timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "shared/base/string_hash.hpp"
#include "shared/protocol/wire_lease.hpp"

namespace smockron::proxy {

class exact_domains {
public:
  /// A master published EXACT for `domain` at `now_us`.
  void set(std::string_view domain, std::int64_t now_us);
  /// True when a master's EXACT for `domain` is fresh at `now_us`.
  bool exact(std::string_view domain, std::int64_t now_us) const;
  /// True once some master has published EXACT (the per-request check is skipped until then).
  bool any() const { return any_.load(std::memory_order_relaxed); }

private:
  mutable std::mutex mutex_;
  string_map<std::int64_t> updated_us_;  ///< by domain (a master's domains are bounded by its configuration)
  std::atomic<bool> any_{false};
};

class ask_table {
public:
  /// A question with no answer is forgotten after this long (its GO, if it
  /// comes later still, is left to the master's timeout).
  static constexpr std::int64_t k_forget_us = 30'000'000;
  /// Questions one worker keeps open at most; beyond, requests go without asking (counted).
  static constexpr std::size_t k_max_open = 100'000;

  /// A request waiting for its ANSWER; owned by the request, which must
  /// outlive its wait (leave() before it goes away). `wake` runs when the
  /// answer is in `verdict` and `at_ms`.
  struct waiter {
    std::function<void()> wake;
    std::int64_t seq = -1;  ///< the open question (-1: none)
    bool answered = false;
    std::int64_t answered_seq = -1;  ///< the question the answer was to (its GO is settled by "ask=" it)
    wire::verdict_kind verdict = wire::verdict_kind::go;
    std::int64_t at_ms = 0;
  };

  /// `holder`: this worker's name (as in its concurrency leases). `send`
  /// delivers an ASK; `settle` accounts a use of no units of (domain,
  /// identifier) settling ASK number `seq`: the request a late GO was for did not go.
  using settle_fn = std::function<void(std::string_view, std::string_view, std::int64_t)>;
  ask_table(std::uint64_t holder, std::function<void(const wire::ask&)> send, settle_fn settle)
      : holder_(holder), send_(std::move(send)), settle_(std::move(settle)) {}

  /// Asks for `cost` units of (domain, identifier) naming `tier`, for a
  /// request that may go until `latest_ms`; the answer wakes `w`. False: not
  /// asked (k_max_open questions open): the request goes.
  bool ask(std::string_view domain, std::string_view identifier, std::int64_t cost, std::string_view tier,
           std::int64_t latest_ms, waiter& w, std::int64_t now_us);
  /// `w` stops waiting: a GO that comes for it is settled with no units.
  void leave(waiter& w);
  /// An ANSWER naming this worker.
  void on_answer(const wire::answer& a);
  /// Forgets questions older than k_forget_us.
  void tick(std::int64_t now_us);
  /// No ASK or settling use leaves from now on (the worker stops).
  void silence() {
    send_ = nullptr;
    settle_ = nullptr;
  }

  std::uint64_t holder() const { return holder_; }
  std::size_t open() const { return open_.size(); }

private:
  struct question {
    waiter* w = nullptr;  ///< nullptr: left
    std::string domain, identifier;
    std::int64_t asked_us = 0;
  };
  std::uint64_t holder_;
  std::function<void(const wire::ask&)> send_;
  settle_fn settle_;
  std::int64_t next_seq_ = 0;
  std::unordered_map<std::int64_t, question> open_;
};

/// A request's question, left when it is destroyed (a connection torn down
/// while it waits, or a request that went). Never moved while it waits.
struct ask_wait {
  ask_wait() = default;
  ask_wait(const ask_wait&) = delete;
  ask_wait& operator=(const ask_wait&) = delete;
  ~ask_wait() { leave(); }
  void leave() {
    if (table != nullptr && w.seq >= 0) table->leave(w);
  }
  ask_table* table = nullptr;
  ask_table::waiter w;
};

}  // namespace smockron::proxy
