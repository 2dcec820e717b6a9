// The master's decisions, with no sockets: an accounting message is decoded,
// checked against the owned domains, applied to the limiter (the rules), and
// turned into the DELAY_UNTIL to publish, if any. Also the sweep of expired
// states and the per-domain counters. The loop (service.hpp) feeds it from
// the accounting subscriber and publishes what it returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "master/core/query.hpp"
#include "master/core/rules.hpp"
#include "master/engine/asks.hpp"
#include "master/engine/leases.hpp"
#include "master/engine/limiter.hpp"
#include "master/engine/pace_share.hpp"
#include "master/engine/reservations.hpp"
#include "master/engine/shares.hpp"
#include "master/engine/top.hpp"
#include "shared/base/clock.hpp"
#include "shared/base/enum_array.hpp"
#include "shared/base/log.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/string_hash.hpp"
#include "shared/config/config.hpp"
#include "shared/protocol/ratelimit_fields.hpp"
#include "shared/protocol/wire.hpp"
#include "shared/protocol/wire_lease.hpp"

namespace smockron::master {

class ingest {
public:
  /// Entries examined per sweep tick (see config sweep_interval), in slices
  /// of k_sweep_slice between which the loop serves what arrived: a
  /// thousand erasures at once (~250 us) showed in the query p99.
  static constexpr std::size_t k_sweep_batch = 1000;
  static constexpr std::size_t k_sweep_slice = 100;

  struct domain {
    std::string name;
    rules::limits limits;
    enum_array<wire::status, metrics::counter*, wire::status_count> messages;  ///< by status
    metrics::gauge* tracked = nullptr;
    metrics::counter* units = nullptr;     ///< cost units charged (ACCEPTED, DELAYED and adjustments up)
    metrics::counter* refunded = nullptr;  ///< cost units given back (adjustments down)
    metrics::counter* adjustments = nullptr;
    /// `admission = "exact"`: the domain's gatekeepers ask before each request (ASK, asks.hpp).
    bool exact = false;
  };

  ingest(const config::master_config& cfg, const clock& clk, metrics::registry& reg);

  /// Applies one accounting message given as frames (`truncated`: it had
  /// more than the receiver keeps) at wall time `now_us`. Returns the
  /// DELAY_UNTIL to publish (views into the message and the domain list,
  /// valid until the next call), or nothing.
  /// `peer`: the accounting connection it came on (0: none known): a
  /// reservation ("reserve=N") is held open for that connection until its
  /// correction ("adjust=N") arrives on it. `gatekeeper`: the name that
  /// connection gave (0: none; not counted): a DELAY_UNTIL's interval is
  /// the rule's times the gatekeepers holding the client (pace_share.hpp).
  std::optional<wire::delay_until> handle(std::span<const std::string_view> frames, bool truncated, std::int64_t now_us,
                                          std::uint64_t peer = 0, std::uint64_t gatekeeper = 0);

  /// The accounting connection `peer` closed: its gatekeeper's open
  /// reservations are given back (their units refunded), and its
  /// concurrency slots freed. `gatekeeper_gone`: the gatekeeper whose last
  /// connection this was (0: none), no longer counted as holding a client
  /// (pace_share.hpp). Returns how many reservations.
  std::size_t peer_closed(std::uint64_t peer, std::int64_t now_us, std::uint64_t gatekeeper_gone = 0);
  /// Reservations held open now.
  std::size_t open_reservations() const { return reservations_.size(); }
  const reservations& reservation_book() const { return reservations_; }
  /// Tells `log` (none: nullptr) of every reservation opened and closed from now on.
  void log_reservations(reservation_log* log) { reservation_log_ = log; }
  /// Holds open a reservation an earlier run left open (read from the
  /// store): closed by its correction, or given back at the timeout from
  /// when it was first opened. False: not tracked (the book is full).
  bool restore_reservation(reservations::reservation r);

  /// Calls f(const wire::grant&) for each GRANT to publish now: the leases
  /// that changed since the last call (ingest_leases.cpp).
  template <class F>
  void take_grants(F&& f) {
    leases_.take_changed([&](std::string_view d, std::string_view id, const leases::holder& h) {
      f(wire::grant{d, id, h.id, h.held, h.cap, h.seen});
    });
    for (const auto& u : untracked_grants_) f(wire::grant{u.domain, u.identifier, u.holder, u.want, u.want, u.seen});
    untracked_grants_.clear();
  }
  /// Calls f(const wire::grant&) for every lease: the periodic GRANT that heals one lost on the way.
  template <class F>
  void each_grant(F&& f) const {
    leases_.each([&](std::string_view d, std::string_view id, const leases::holder& h) {
      f(wire::grant{d, id, h.id, h.held, h.cap, h.seen});
    });
  }
  const leases& lease_book() const { return leases_; }
  /// Calls f(const wire::answer&) for each ANSWER to publish now (the ASKs since the last call).
  template <class F>
  void take_answers(F&& f) {
    for (const auto& a : answers_) {
      f(wire::answer{a.domain, a.identifier, a.holder, a.seq, a.verdict, a.at_ms});
    }
    answers_.clear();
  }
  const asks& ask_book() const { return asks_; }

  /// The query protocol's answer to `r` at wall time `now_us` (query.hpp),
  /// appended to `out`; none for a domain this master does not own (ignored, counted). An
  /// over_limit use is recorded in the same state as the gatekeepers'
  /// accounting; when it leaves the identifier throttled, `publish` is the
  /// DELAY_UNTIL for the gatekeepers (views valid until the next call).
  struct query_result {
    bool answered = false;  ///< `out` holds the answer
    std::optional<wire::delay_until> publish;
  };
  query_result answer(const query::request& r, std::int64_t now_us, std::string& out);

  /// A request an external data plane asks about (Envoy's rate limit
  /// services, master/envoy/): `cost` units of (domain, identifier) at
  /// `now_us`, admitted when they fit under every rule and quota now
  /// (limiter::charge), in the same state as the gatekeepers' accounting.
  /// `mode`: limiter::charge_mode (force: charged with no verdict, `fits`
  /// true; probe: nothing recorded, counted or published).
  struct check_result {
    bool fits = false;                    ///< the units fit now (charged)
    bool never = false;                   ///< more than a rule's burst or a quota's limit: can never fit
    std::int64_t retry_us = 0;            ///< refused and not `never`: when the units fit (wall time)
    std::int64_t throttled_until_us = 0;  ///< once decided, no use is allowed before this (0: allowed now)
    /// The identifier's standing once decided: rules, then quotas (the RateLimit fields).
    quota_state standing;
    std::size_t binding = 0;  ///< the item of `standing` with the fewest units left (the one that decides)
    /// The DELAY_UNTIL to publish (the identifier is throttled now), views valid until the next call.
    std::optional<wire::delay_until> publish;
  };
  check_result check(std::size_t domain, std::string_view identifier, std::int64_t cost, std::int64_t now_us,
                     limiter::charge_mode mode = limiter::charge_mode::charge);
  /// Would `cost` units of (domain, identifier) fit now? Nothing recorded.
  bool fits(std::size_t domain, std::string_view identifier, std::int64_t cost, std::int64_t now_us) {
    return limiter_.charge(domain, identifier, cost, now_us, limiter::charge_mode::probe).fits;
  }
  /// Refusals of (domain, identifier) made elsewhere (an Envoy that enforced
  /// its assignment): counted in its stats and /top, nothing charged.
  void refused_elsewhere(std::size_t domain, std::string_view identifier, std::int64_t now_us) {
    limiter_.apply(domain, identifier, {rules::event_kind::rejected, now_us, 0}, now_us);
    shares_.refused(domain, identifier, now_us);
    top_.limited(domain, identifier, now_us);
  }
  /// The compiled limits (domain, identifier) is judged by now.
  const rules::limits& limits_now(std::size_t domain, std::string_view identifier) const {
    return limiter_.current_limits(domain, identifier);
  }

  /// Domains, rules and max_identifiers from `next`; states of domains that
  /// stay are kept. Returns the names of domains added and removed.
  struct domain_changes {
    std::vector<std::string> added, removed;
  };
  domain_changes reconfigure(const config::master_config& next);

  /// Expires a slice of states and refreshes the counters and gauges.
  void sweep(std::int64_t now_us, std::size_t budget = k_sweep_batch);

  const std::vector<domain>& domains() const { return domains_; }
  std::optional<std::size_t> find(std::string_view name) const;
  limiter& states() { return limiter_; }
  const limiter& states() const { return limiter_; }
  const top_limited& top() const { return top_; }
  /// The domains' shared rates and each identifier's share.
  const shares& shared_rates() const { return shares_; }

private:
  void install(const config::master_config& cfg);
  /// An ASK message (ingest_asks.cpp): answered GO when its units fit with
  /// the GOs not yet settled. A WAIT is also told to every gatekeeper as a
  /// DELAY_UNTIL (returned: views into the frames and the domain list), so
  /// that they hold the client until then instead of asking again.
  std::optional<wire::delay_until> handle_ask(std::span<const std::string_view> frames, std::int64_t now_us,
                                              std::uint64_t peer);
  /// A LEASE message (ingest_leases.cpp): the lease book's, or granted untracked when it is full.
  void handle_lease(std::span<const std::string_view> frames, std::int64_t now_us, std::uint64_t peer);
  /// Gives back the units of reservations that died (`why`: gatekeeper_gone, timeout).
  void release(const std::vector<reservations::reservation>& gone, metrics::counter& why, std::int64_t now_us);
  void log_bad(std::string_view what, std::string_view detail);

  const clock& clock_;
  metrics::registry& metrics_;
  limiter limiter_;
  top_limited top_;
  std::vector<domain> domains_;
  string_map<std::size_t> index_;
  metrics::counter* decode_errors_[wire::decode_error_count] = {};
  metrics::counter& unknown_domain_;
  enum_array<query::command, metrics::counter*, query::command_count> queries_;  ///< by command
  metrics::counter& query_unknown_domain_;
  metrics::counter& evictions_;
  metrics::counter& expirations_;
  metrics::histogram& latency_;
  reservations reservations_;
  std::chrono::microseconds reservation_timeout_;
  metrics::counter& reservations_opened_;
  metrics::counter& reservations_untracked_;  ///< more than max_identifiers open: not tracked
  metrics::counter& released_gone_;
  metrics::counter& released_timeout_;
  metrics::counter& late_corrections_;
  reservation_log* reservation_log_ = nullptr;
  leases leases_;
  shares shares_;
  std::int64_t rebalanced_us_ = 0;  ///< when the shares were last computed
  pace_share pacers_;               ///< the gatekeepers holding each held client
  bool pace_share_ = false;         ///< `pace_share`: DELAY_UNTIL's interval shared among them
  /// Applies a use to its identifier's share of its domain's shared rate: the later of the two decisions.
  rules::decision share(std::size_t domain, std::string_view identifier, const rules::event& e, rules::decision dec,
                        std::int64_t now_us);
  /// False when the time `dec` carries is an exactly logged rule's (a
  /// sliding log, burst up to k_exact_burst): its gatekeepers do not share
  /// its pace (ingest.cpp says why).
  bool pace_shareable(std::size_t domain, std::string_view identifier, const rules::decision& dec) const;
  /// The limit that set `dec` as gatekeepers know the client's limits (LIMIT,
  /// wire_limit.hpp); kind none when it has only one, or the limit is not
  /// published to them.
  wire::limit_ref limit_named(std::size_t domain, std::string_view identifier, const rules::decision& dec) const;
  /// LEASEs not kept (the book full): granted what they want, published by take_grants().
  struct untracked_grant {
    std::string domain, identifier;
    std::uint64_t holder = 0;
    std::int64_t want = 0, seen = 0;
  };
  std::vector<untracked_grant> untracked_grants_;
  metrics::counter& lease_messages_;
  metrics::counter& leases_untracked_;
  metrics::counter& lease_slots_released_;
  asks asks_;
  /// ANSWERs not published yet (take_answers).
  struct pending_answer {
    std::string domain, identifier;
    std::uint64_t holder = 0;
    std::int64_t seq = 0;
    wire::verdict_kind verdict = wire::verdict_kind::go;
    std::int64_t at_ms = 0;
  };
  std::vector<pending_answer> answers_;
  metrics::counter* asks_answered_[3] = {};  ///< by verdict
  metrics::counter& asks_untracked_;
  metrics::counter& asks_settled_;
  metrics::counter& asks_dropped_gone_;
  metrics::counter& asks_dropped_timeout_;
  std::int64_t asks_expired_us_ = 0;  ///< when the GOs were last examined for their timeout
  std::uint64_t next_tag_;            ///< the next reservation's tag: random at start, so no earlier run's is met again
  std::uint64_t reported_evictions_ = 0;
  std::uint64_t handled_ = 0;
  std::shared_ptr<spdlog::logger> log_;
  log::rate_limiter bad_input_log_;
};

}  // namespace smockron::master
