// The gate's decision arithmetic, without the concurrent map: what one
// client's entry, the guard's policy and the limits say about a request at
// `now`, and how the entry records it. Pure functions over plain values,
// table-tested (plan_test.cpp) like the master's rules; gate.cpp keeps
// the sharded map, its locks and the held counters around them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "shared/protocol/wire.hpp"

namespace smockron::proxy {

/// One rule of a domain's policy: `burst` uses, then one per `interval_us`
/// (as POLICY carries it).
using guard_rule = wire::policy::rule;
inline constexpr std::size_t k_guard_rules = wire::max_policy_rules;

/// A domain's (or one identifier's) policy as the guard applies it (count 0: no guard).
struct guard_policy {
  std::array<guard_rule, k_guard_rules> rules{};
  std::size_t count = 0;
  std::uint32_t seq = 0;  ///< changes when the rules change
  /// The rules the master judges the client by; false: the request names a
  /// tier this gatekeeper does not hold, and the domain's stand in (they
  /// guard, but say nothing of the master's times).
  bool own = true;
};

/// What the gate remembers of one client (domain, identifier).
struct client_entry {
  std::int64_t next_us = 0;        ///< from the master: not before this
  std::int64_t local_next_us = 0;  ///< this gatekeeper's next free paced slot
  std::int64_t interval_us = 0;
  std::int64_t updated_us = 0;                    ///< when the master last spoke about this client
  std::int64_t spare_us = 0;                      ///< a reported slot given back by a client that left (0 = none)
  std::array<std::int64_t, k_guard_rules> tat{};  ///< the guard's theoretical arrival time per rule
  std::uint32_t policy_seq = 0;                   ///< the policy `tat` was computed under (another one resets it)
  /// The tier the client's last request named (tier_tag()); 0: not known
  /// (the entry came with a DELAY_UNTIL). Another one forgets `next_us`.
  std::uint32_t tier = 0;
  /// The limit that set next_us, as the master named it (LIMIT): kind none
  /// when not named, or next_us moved on since. A share's burst and window
  /// (whole seconds), for the rate-limit fields.
  wire::limit_ref::kind limit = wire::limit_ref::kind::none;
  std::uint8_t limit_index = 0;
  std::uint32_t share_burst = 0;
  std::uint32_t share_window_s = 0;

  /// When keeping this entry no longer changes any decision.
  std::int64_t expires_us() const;
};

/// The mark of a tier in client_entry::tier (never 0): equal for equal names.
inline std::uint32_t tier_tag(std::string_view tier) {
  return tier.empty() ? 1u : static_cast<std::uint32_t>(std::hash<std::string_view>{}(tier)) | 2u;
}

/// Before the master's first word about a client, the guard holds it at most
/// this many of its rule's intervals (longer waits are refused).
inline constexpr std::int64_t k_guard_hold_intervals = 2;

/// What a request may do, before the held places are counted.
struct request_plan {
  bool accept = false;          ///< nothing stops it: forward now
  std::int64_t release_us = 0;  ///< otherwise: when it may go
  std::int64_t pace_us = 0;     ///< the interval the next held request of the client goes after it
  bool too_long = false;        ///< the wait is longer than this request may be held: refuse
  bool never = false;           ///< the request costs more than a rule's burst: it can never fit, refuse
  /// A slot a held client gave back, earlier than release_us, this request may take (0: none).
  std::int64_t spare_us = 0;
  /// Pace share: the request's own units are paced after it (the next held
  /// request of the client waits them), not before it.
  bool units_after = false;
};

/// Brings `e` to `guard` and `now_us`: guard state computed under other rules
/// starts afresh; a spare slot not taken by its time lapses.
void refresh(client_entry& e, const guard_policy& guard, std::int64_t now_us);

/// The plan for a request of `units` (its cost, charged before it is
/// admitted: 0 is taken as 1, a request that only checks the limit) of the
/// client at `now_us` (reads `e` only): it goes when all its units fit under
/// every rule, the master's (its next allowed time is one unit's; each unit
/// more waits one of its intervals) and the guard's. `max_delay_us`: how far
/// ahead this request may be held. `pacing_fresh_us`: this gatekeeper's own
/// queue is paced while the master spoke about the client this recently, or
/// while the domain's policy is fresh (a guard: the master is there); with
/// neither, only the master's own DELAY_UNTIL counts (fail-open when it is gone).
request_plan plan_request(const client_entry& e, const guard_policy& guard, std::int64_t max_delay_us,
                          std::int64_t pacing_fresh_us, std::int64_t now_us, std::int64_t units = 1);

/// The most units a request could use at `at_us` and still fit under every
/// rule the entry knows (each guard rule's burst left; the master's next
/// allowed time, one unit per interval after it): what a request whose size
/// is counted as it streams (a body without a length) may grow to. -1: no
/// bound known (no policy, no word from the master). `own`: units of the
/// request itself, recorded in the guard already (record_accept,
/// record_hold) but not in the master's time: the master's allowance is
/// what is left after them.
std::int64_t units_that_fit(const client_entry& e, const guard_policy& guard, std::int64_t at_us, std::int64_t own = 0);
/// The guard charges `units` used at `at` (a request's cost): each rule's
/// arrival time moves out by units x interval, so a refusal's Retry-After
/// names when the cost is paid back, as the master's DELAY_UNTIL will. Every
/// unit is charged, as the master charges it (up to wire::max_policy_span_us ahead).
void charge(client_entry& e, const guard_policy& guard, std::int64_t at, std::int64_t units);
/// The guard gives back `units` charged before (a reservation that cost less):
/// each rule's arrival time moves back units x interval, never before `now_us`,
/// and so does the master's next allowed time when a rule set it (its
/// interval is a rule's), as the master's own will, and this gatekeeper's
/// next paced slot (units paces), for the requests planned after.
void refund(client_entry& e, const guard_policy& guard, std::int64_t now_us, std::int64_t units);
/// The request was forwarded now: the guard charges its `units` at `now_us`.
void record_accept(client_entry& e, const guard_policy& guard, std::int64_t now_us, std::int64_t units = 1);
/// The request is held until `p.release_us`: charged then, and the next held
/// request of the client goes `pace_units` paces later (1: the next one's own
/// units are added when it is planned; more for a request whose cost is
/// charged only when it is done, which is paid back before the next leaves);
/// under pace share (`p.units_after`), at least `units` paces later.
void record_hold(client_entry& e, const guard_policy& guard, const request_plan& p, std::int64_t units = 1,
                 std::int64_t pace_units = 1);
/// The request takes the spare slot (already reported to the master).
void record_spare(client_entry& e);
/// A request held until `release_us` left before its time: its slot becomes
/// the client's spare, the earliest one kept.
void give_back(client_entry& e, std::int64_t release_us, std::int64_t now_us);

/// Whole seconds until `release_us`, rounded up, at least 1 (Retry-After).
inline std::int64_t retry_after_s(std::int64_t release_us, std::int64_t now_us) {
  const std::int64_t s = (release_us - now_us + 999'999) / 1'000'000;
  return s < 1 ? 1 : s;
}

}  // namespace smockron::proxy
