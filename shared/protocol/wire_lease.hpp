// Concurrency leases and exact admission on the wire (wire additions; docs/architecture.md,
// "Concurrency leases"). A concurrency rule allows at most N requests of one
// identifier in flight across every gatekeeper. The master leases slots to
// each gatekeeper worker (a holder, tied to its accounting connection) so
// that the slots leased never add up to more than N; a holder admits within
// its lease with no round trip, asks for more when requests wait, and gives
// back what it does not use.
//
// Exactness rests on who may change what. Only the master grows a lease
// (GRANT), only the holder shrinks it (LEASE, counting what it gave back),
// and each GRANT carries how many give-backs the master had counted, so the
// holder subtracts those still on their way: at every instant the slots a
// holder may use are at most what the master counts for it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "shared/protocol/wire.hpp"

namespace smockron::wire {

inline constexpr std::string_view lease_status = "LEASE";
inline constexpr std::string_view grant_command = "GRANT";
inline constexpr std::string_view concurrency_command = "CONCURRENCY";
/// The largest concurrency limit, want or lease a message carries.
inline constexpr std::int64_t max_concurrency = 1'000'000;
/// Give-backs are counted from the holder's start; 15 digits never wrap in practice.
inline constexpr std::int64_t max_returned = 999'999'999'999'999;

/// Holder -> master, on the accounting stream (a status frame of its own, so
/// a spec master refuses it as unknown: a gatekeeper sends it only for a
/// domain whose CONCURRENCY a master publishes):
/// [domain\0, "LEASE", identifier, "HOLDER WANT HELD RETURNED"] where HOLDER is
/// 16 hex digits (the worker's own random name), WANT the slots it would use
/// now (in flight and waiting), HELD the slots it holds (read by the master
/// only when it knows no lease of this holder: a holder whose connection came
/// back claims what is still in flight), RETURNED how many slots of this
/// identifier it has given back since it started. An optional fifth frame
/// names the tier of the identifier's requests (wire::valid_tier_name), whose
/// concurrency rule applies unless the identifier has an override.
struct lease {
  std::string_view domain;
  std::string_view identifier;
  std::uint64_t holder = 0;
  std::int64_t want = 0;
  std::int64_t held = 0;
  std::int64_t returned = 0;
  std::string_view tier = {};  ///< empty: none (the frame is left out)
};

/// Master -> gatekeepers, on the control stream: [domain\0, "GRANT",
/// identifier, "HOLDER HELD CAP SEEN"]: the master counts HELD slots for the
/// holder once SEEN of its give-backs are counted (the holder holds HELD -
/// (its RETURNED - SEEN)); of them it may use CAP (<= HELD) for new requests:
/// a CAP below HELD asks for slots back (another holder waits).
struct grant {
  std::string_view domain;
  std::string_view identifier;
  std::uint64_t holder = 0;
  std::int64_t held = 0;
  std::int64_t cap = 0;
  std::int64_t seen = 0;
};

/// Master -> gatekeepers, on the control stream, beside POLICY and kept
/// fresh as it is: [domain\0, "CONCURRENCY", identifier, "N"]: at most N
/// requests of one identifier in flight (identifier empty: the domain's
/// rule; else that identifier's own, an override; N = 0: none for it).
struct concurrency_policy {
  std::string_view domain;
  std::string_view identifier;
  std::int64_t limit = 0;
};

result<lease> decode_lease(frames f);
result<grant> decode_grant(frames f);
result<concurrency_policy> decode_concurrency(frames f);

/// Encode; nothing when a field is outside its bound (a number below 0 or
/// over its maximum, CAP over HELD, an empty identifier in LEASE or GRANT).
std::optional<encoded> encode(const lease& m, scratch& s);
std::optional<encoded> encode(const grant& m, scratch& s);
std::optional<encoded> encode(const concurrency_policy& m, scratch& s);

// Exact admission (docs/architecture.md, "Exact admission"). A domain whose
// master publishes EXACT has every request asked for before it goes: the
// gatekeeper worker (a holder, as above) sends ASK and waits for the
// master's ANSWER. The master answers GO when the units fit with every unit
// it has said GO to and not yet seen accounted counted as used now; the
// request's ordinary accounting message, sent when it goes, settles that. So
// no gatekeeper, near or far, admits a unit the master has not counted.
inline constexpr std::string_view ask_status = "ASK";
inline constexpr std::string_view answer_command = "ANSWER";
inline constexpr std::string_view exact_command = "EXACT";
/// Sequence numbers count from the holder's start; 15 digits never wrap in practice.
inline constexpr std::int64_t max_sequence = 999'999'999'999'999;

/// Holder -> master, on the accounting stream (a status of its own: a spec
/// master refuses it as unknown; a gatekeeper sends it only for a domain
/// whose master publishes EXACT): [domain\0, "ASK", identifier, "HOLDER SEQ
/// COST LATEST_MS"] (HOLDER 16 hex digits; SEQ the ask's number at that
/// holder; COST the units, at most max_cost; LATEST_MS the latest time the
/// request may still go, its max_delay from admission), and optionally the
/// tier's name as a fifth frame.
struct ask {
  std::string_view domain;
  std::string_view identifier;
  std::uint64_t holder = 0;
  std::int64_t seq = 0;
  std::int64_t cost = 0;
  std::int64_t latest_ms = 0;
  std::string_view tier = {};  ///< empty: none (the frame is left out)
};

/// Master -> gatekeepers, on the control stream: [domain\0, "ANSWER",
/// identifier, "HOLDER SEQ VERDICT AT_MS"]. VERDICT 0: go, now (AT_MS 0) or
/// at AT_MS (the units are the request's from then: it is held until then);
/// 1: not by LATEST_MS, the units fit at AT_MS as far as the master knows
/// (ask again then, or refuse); 2: never (more than a rule's burst or a
/// quota's limit; AT_MS 0).
enum class verdict_kind : std::uint8_t { go = 0, wait = 1, never = 2 };
struct answer {
  std::string_view domain;
  std::string_view identifier;
  std::uint64_t holder = 0;
  std::int64_t seq = 0;
  verdict_kind verdict = verdict_kind::go;
  std::int64_t at_ms = 0;
};

/// Master -> gatekeepers, on the control stream, beside POLICY and kept
/// fresh as it is: [domain\0, "EXACT"]: this master answers ASK for the domain.
struct exact_policy {
  std::string_view domain;
};

result<ask> decode_ask(frames f);
result<answer> decode_answer(frames f);
result<exact_policy> decode_exact(frames f);

/// Encode; nothing when a field is outside its bound (an empty identifier,
/// a number below 0 or over its maximum, AT_MS 0 for a wait or not 0 for never).
std::optional<encoded> encode(const ask& m, scratch& s);
std::optional<encoded> encode(const answer& m, scratch& s);
std::optional<encoded> encode(const exact_policy& m, scratch& s);

}  // namespace smockron::wire
