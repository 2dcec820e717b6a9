// The Smockron wire protocol (docs/architecture.md, "The wire"): accounting messages
// (gatekeeper -> master) and control messages (master -> gatekeepers).
// Pure functions over frames; decoding is strict and total, never throws and
// never allocates; encoding writes into caller-owned scratch space.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "shared/base/calendar.hpp"

namespace smockron::wire {

/// Bounds on frame sizes. Anything larger is rejected as frame_too_large.
inline constexpr std::size_t max_domain_bytes = 255;
inline constexpr std::size_t max_identifier_bytes = 1024;
inline constexpr std::size_t max_loginfo_bytes = 4096;
/// Largest timestamp accepted: 9999-12-31T23:59:59.999Z in ms.
inline constexpr std::int64_t max_timestamp_ms = 253'402'300'799'999;
/// Longest decimal we accept in a numeric frame (more digits is out of range).
inline constexpr std::size_t max_number_digits = 15;

enum class status : std::uint8_t { accepted, delayed, rejected };
inline constexpr std::size_t status_count = 3;

/// "ACCEPTED", "DELAYED", "REJECTED".
std::string_view to_string(status s);

/// Every way a message can be malformed.
enum class decode_error : std::uint8_t {
  frame_count,             ///< wrong number of frames
  frame_too_large,         ///< a frame exceeds its bound
  domain_not_terminated,   ///< domain frame lacks the trailing "\0"
  domain_empty,            ///< domain frame is just "\0"
  domain_contains_null,    ///< a "\0" inside the domain name
  identifier_empty,        ///< identifier frame is empty
  unknown_status,          ///< status is not ACCEPTED/DELAYED/REJECTED
  unknown_command,         ///< control command other than DELAY_UNTIL
  timestamp_empty,         ///< a required numeric frame is empty
  timestamp_not_numeric,   ///< a numeric frame has a non-digit
  timestamp_out_of_range,  ///< a numeric frame is beyond max_timestamp_ms
  delayed_missing,         ///< DELAYED without a delayed timestamp
  delayed_unexpected,      ///< ACCEPTED/REJECTED with a non-empty delayed frame
  interval_invalid,        ///< DELAY_UNTIL interval frame not a positive number
  policy_invalid,          ///< POLICY rules frame malformed
  cost_invalid,            ///< loginfo starts with "cost=" but no valid cost follows
  quota_invalid,           ///< QUOTA quotas frame malformed
  adjust_invalid,          ///< a REJECTED message's loginfo starts with "adjust=" but no valid adjustment follows
  reserve_invalid,         ///< loginfo starts with "reserve=" but no valid cost follows
  lease_invalid,           ///< a LEASE, GRANT or CONCURRENCY numbers frame malformed
  tier_invalid,            ///< a "tier=" in the loginfo, or a TIER message's name, that is no tier name
  limit_invalid,           ///< a LIMIT message's limit frame malformed
  ask_invalid,             ///< an ASK, ANSWER or EXACT message, or an accounting "ask=", malformed
};
inline constexpr std::size_t decode_error_count = 23;

/// Stable snake_case name of an error (used as a metrics label).
std::string_view to_string(decode_error e);

/// The cost of a request (wire addition, carried in the loginfo frame, whose
/// format the spec leaves open): a loginfo frame that starts with "cost=N"
/// (N decimal, at most max_cost, then the end or a space and free text) says
/// the request used N units; no such prefix: one unit, as the spec counts.
/// A master that does not know it logs the frame and counts one use. N = 0:
/// the request used nothing yet (its cost is charged by a later message);
/// the master only decides.
inline constexpr std::string_view cost_prefix = "cost=";
inline constexpr std::int64_t max_cost = 1'000'000'000'000;

/// A reservation (wire addition, in the loginfo frame as the cost is): an
/// ACCEPTED or DELAYED message whose loginfo starts with "reserve=N" instead
/// of "cost=N" is a use of N units, as "cost=N" is, whose N is an estimate
/// (a request whose cost is known only from its response). The gatekeeper
/// that sent it corrects it later with an adjustment on the same connection;
/// until then the master holds it open, and gives its units back when that
/// gatekeeper's connection closes or the reservation is older than the
/// master's reservation_timeout.
inline constexpr std::string_view reserve_prefix = "reserve=";

/// A correction of a reservation (wire addition): a REJECTED message whose
/// loginfo starts with "adjust=N" (N a signed decimal, |N| at most max_cost,
/// then the end or a space and free text) closes the reservation of the
/// identifier whose use was at received_ms (a DELAYED one's delayed_ms): its
/// use cost N units more than reserved (N < 0: -N units fewer, given back;
/// 0: as reserved). A spec master records nothing for a REJECTED message, so
/// it still counts one use per request; smockron-master charges or gives
/// back the units and never counts it as a refusal.
inline constexpr std::string_view adjust_prefix = "adjust=";

/// The tier of a request (wire addition, in the loginfo frame after the
/// cost): an ACCEPTED or DELAYED message whose loginfo goes on (after any
/// "cost=N " or "reserve=N ", else at its start) with "tier=NAME" (then the
/// end or a space and free text) was for a request naming tier NAME, whose
/// rules the master applies to the identifier unless it has an override.
/// NAME: 1 to max_tier_bytes of [A-Za-z0-9._-]; "tier=" alone names none (a
/// free text that starts with "tier=" is sent behind it). A spec master logs
/// the frame and counts one use, as it does with the cost.
inline constexpr std::string_view tier_prefix = "tier=";
/// The question a use answers (wire addition, exact admission, wire_lease.hpp):
/// an ACCEPTED or DELAYED message whose loginfo goes on (after any cost,
/// before any tier) with "ask=SEQ" (SEQ decimal, at most max_cost) is the
/// use of the request whose ASK, from the same connection, had that number:
/// it settles that ASK's GO. A free text that starts with "ask=" is sent
/// behind an empty "tier= ".
inline constexpr std::string_view ask_prefix = "ask=";
inline constexpr std::size_t max_tier_bytes = 64;
/// True for a tier name: 1 to max_tier_bytes of [A-Za-z0-9._-].
bool valid_tier_name(std::string_view name);

/// Accounting message: [domain\0, status, identifier, received_ms, delayed_ms|"", (loginfo)].
struct accounting {
  std::string_view domain;
  status state = status::accepted;
  std::string_view identifier;
  std::int64_t received_ms = 0;
  std::int64_t delayed_ms = 0;  ///< meaningful only when state == delayed
  std::string_view loginfo;     ///< optional, empty = frame omitted on encode (decoded: the text after the cost)
  std::int64_t cost = 1;        ///< units used; not 1: encoded as the loginfo's "cost=N" prefix
  bool reserve = false;         ///< ACCEPTED or DELAYED: `cost` is an estimate ("reserve=N")
  std::optional<std::int64_t> adjust = std::nullopt;  ///< REJECTED only: a reservation's correction ("adjust=N")
  std::string_view tier = {};  ///< ACCEPTED or DELAYED: the request's tier ("tier=NAME"); empty: none
  std::int64_t ask = -1;       ///< ACCEPTED or DELAYED: the ASK it settles ("ask=SEQ"); -1: none
};

/// Which of a client's limits set its next allowed time: what a refusal
/// names (LIMIT, wire_limit.hpp).
struct limit_ref {
  enum class kind : std::uint8_t { none, rule, quota, share };
  kind by = kind::none;
  std::uint8_t index = 0;  ///< rule: its place in the client's POLICY; quota: in the domain's QUOTA (from 0)
  /// share: the client's part of the domain's shared rate, as a POLICY rule
  std::int64_t share_interval_us = 0;
  std::int64_t share_burst = 0;
};

/// Control message DELAY_UNTIL: [domain\0, "DELAY_UNTIL", identifier, next_ms, (interval_ms)].
struct delay_until {
  std::string_view domain;
  std::string_view identifier;
  std::int64_t next_ms = 0;
  std::int64_t interval_ms = 0;  ///< 0 = frame 4 omitted (wire addition, optional)
  /// Not a frame of DELAY_UNTIL: the limit that set next_ms, which the master
  /// publishes as a LIMIT message right after it (kind none: no LIMIT).
  limit_ref limit = {};
};

/// Control message POLICY (wire addition; a gatekeeper that does not know it
/// drops it as an unknown command, counting and logging it, and works as
/// before): [domain\0, "POLICY", identifier, rules], where rules is
/// "INTERVAL_US/BURST" per rule (interval = 1/rate in microseconds), separated
/// by one space, at most max_policy_rules of them; burst at most
/// max_policy_burst and interval x burst (the window) at most
/// max_policy_span_us, so a gatekeeper's arithmetic cannot overflow. An empty
/// rules frame: the master owns the domain and it has no rules (a fresh
/// POLICY also tells a gatekeeper that a master covers the domain). The master publishes it for
/// every domain with rules each policy_interval_ms, so that a gatekeeper can
/// bound a client on its own until the master's first DELAY_UNTIL for it
/// arrives (the first round trip); a policy not refreshed for
/// policy_fresh_ms is dropped (a silent master means fail-open).
/// The identifier frame is empty for the domain's own rules; an identifier
/// names one client with rules of its own (a master's per-identifier
/// override), published at the same pace and kept fresh the same way, and
/// used by a gatekeeper instead of the domain's rules for that client.
inline constexpr std::string_view policy_command = "POLICY";
inline constexpr std::size_t max_policy_rules = 4;
inline constexpr std::int64_t max_policy_burst = 1'000'000;
inline constexpr std::int64_t max_policy_span_us = std::int64_t{1} << 47;  // ~4.5 years, 15 digits
inline constexpr std::int64_t policy_interval_ms = 1000;
inline constexpr std::int64_t policy_fresh_ms = 3500;
/// True when a rule travels in POLICY: within its bounds (a rule that does
/// not is left out of it: fewer rules bound less, never more).
inline bool policy_fits(std::int64_t interval_us, std::int64_t burst) {
  return interval_us >= 1 && burst >= 1 && burst <= max_policy_burst && interval_us <= max_policy_span_us / burst;
}
struct policy {
  struct rule {
    std::int64_t interval_us = 0;
    std::int64_t burst = 0;
  };
  std::string_view domain;
  std::string_view identifier;  ///< empty: the domain's rules; else this client's own
  std::array<rule, max_policy_rules> rules{};
  std::size_t count = 0;
};

/// Control message QUOTA (wire addition, as POLICY: a gatekeeper that does
/// not know it drops it as an unknown command, counted, and works as
/// before): [domain\0, "QUOTA", identifier, quotas], where quotas is
/// "LIMIT/PER/OFFSET_S" per quota, separated by one space, at most
/// max_quota_items: LIMIT units per window, PER "day", "week", "month" or
/// the length of a fixed window in whole seconds, OFFSET_S the windows'
/// offset from UTC in seconds (signed, at most 14 hours). The identifier
/// frame is empty (the domain's quotas; an override's are not published).
/// The master publishes it beside each domain's POLICY when the domain has
/// quotas; gatekeepers describe them in the RateLimit-Policy field and drop
/// them when not refreshed for policy_fresh_ms.
inline constexpr std::string_view quota_command = "QUOTA";
inline constexpr std::size_t max_quota_items = 4;
inline constexpr std::int64_t max_quota_limit = 1'000'000'000'000;
inline constexpr std::int64_t max_quota_offset_s = 14 * 3600;
inline constexpr std::int64_t max_quota_length_s = max_policy_span_us / 1'000'000;
struct quota_policy {
  struct item {
    std::int64_t limit = 0;
    calendar::period per = calendar::period::month;
    std::int64_t offset_s = 0;
    std::int64_t length_s = 0;  ///< period::fixed
    calendar::window_spec window() const { return {per, offset_s * 1'000'000, length_s * 1'000'000}; }
  };
  std::string_view domain;
  std::string_view identifier;
  std::array<item, max_quota_items> items{};
  std::size_t count = 0;
};

/// Either a decoded value or an error. A tiny expected<> for C++20.
template <class T>
class result {
public:
  result(T v) : value_(v), ok_(true) {}
  result(decode_error e) : error_(e), ok_(false) {}
  explicit operator bool() const { return ok_; }
  const T& value() const { return value_; }
  const T* operator->() const { return &value_; }
  decode_error error() const { return error_; }

private:
  T value_{};
  decode_error error_{};
  bool ok_;
};

/// Frames of one message as views; at most 8 frames are ever examined.
using frames = std::span<const std::string_view>;

result<accounting> decode_accounting(frames f);
result<delay_until> decode_delay_until(frames f);
result<policy> decode_policy(frames f);
result<quota_policy> decode_quota(frames f);
/// The command frame of a control message ("" when there is none).
inline std::string_view control_command(frames f) { return f.size() >= 2 ? f[1] : std::string_view{}; }

/// Parses an ASCII decimal timestamp frame (shared with tests and tools).
result<std::int64_t> parse_timestamp(std::string_view frame);
/// A domain frame ("name\0") read strictly: the name (wire_lease.cpp shares it).
result<std::string_view> decode_domain_frame(std::string_view frame);

/// Storage for an encoded message: the frames point into this object and the
/// caller's input strings, so it must outlive the frames' use.
struct scratch {
  std::array<char, max_domain_bytes + 1> domain{};
  std::array<char, 20> number_a{};
  std::array<char, 20> number_b{};
  std::array<char, max_policy_rules * 32> text{};   ///< POLICY's rules frame
  std::array<char, max_loginfo_bytes> loginfo{};    ///< an accounting message's "cost=N" and loginfo
  std::array<char, max_quota_items * 48> quotas{};  ///< QUOTA's quotas frame
  std::array<char, 80> numbers{};                   ///< LEASE's, GRANT's and CONCURRENCY's numbers frame
};

/// Up to six frames and how many are used.
struct encoded {
  std::array<std::string_view, 6> frame{};
  std::size_t count = 0;
  std::span<const std::string_view> view() const { return {frame.data(), count}; }
};

/// Encodes; returns nothing if a field exceeds its bound (a cost outside
/// [0, max_cost], an adjustment outside [-max_cost, max_cost] or on a message
/// not REJECTED, a reservation on a REJECTED one included) or the domain has a "\0".
std::optional<encoded> encode(const accounting& m, scratch& s);
std::optional<encoded> encode(const delay_until& m, scratch& s);
/// Refuses more than max_policy_rules rules, or an interval or burst below 1 or over 15 digits.
std::optional<encoded> encode(const policy& m, scratch& s);
/// Refuses more than max_quota_items quotas, or a value outside its bound.
std::optional<encoded> encode(const quota_policy& m, scratch& s);
/// The domain frame ("name\0", in `s`); nothing for an empty name, one over
/// max_domain_bytes or one with a "\0".
std::optional<std::string_view> encode_domain_frame(std::string_view domain, scratch& s);

}  // namespace smockron::wire
