// The master's side of exact admission (see ingest.hpp, asks.hpp).
#include <limits>

#include "master/engine/ingest.hpp"

namespace smockron::master {
namespace {
/// A WAIT for units that would fit but for GOs not settled yet: ask again
/// this long after (their accounting is one gatekeeper's round trip away).
constexpr std::int64_t k_settle_wait_us = 5'000;
constexpr std::int64_t k_never = std::numeric_limits<std::int64_t>::max();
}  // namespace

std::optional<wire::delay_until> ingest::handle_ask(std::span<const std::string_view> frames, std::int64_t now_us,
                                                    std::uint64_t peer) {
  const auto msg = wire::decode_ask(frames);
  if (!msg) {
    decode_errors_[static_cast<int>(msg.error())]->inc();
    log_bad("malformed ASK message", wire::to_string(msg.error()));
    return std::nullopt;
  }
  const auto it = index_.find(msg->domain);
  if (it == index_.end()) {
    unknown_domain_.inc();
    log_bad("ASK message for unknown domain", msg->domain);
    return std::nullopt;
  }
  const std::size_t d = it->second;
  pending_answer out{std::string(msg->domain), std::string(msg->identifier), msg->holder, msg->seq};
  if (!domains_[d].exact) {
    // Not exact (any more: a reload, before the gatekeeper's EXACT lapsed):
    // it goes, and its accounting is charged as anyone's.
    asks_answered_[static_cast<int>(out.verdict)]->inc();
    answers_.push_back(std::move(out));
    return std::nullopt;
  }
  // GO when the units fit with every GO not settled yet counted as used now
  // (asks.hpp): whatever those requests' accounting charges later, at their
  // time, was counted from the moment they could go.
  const std::int64_t open = asks_.open_units(msg->domain, msg->identifier);
  const std::int64_t alone = limiter_.fits_at(d, msg->identifier, msg->cost, now_us, msg->tier);
  // (Saturated: GOs of an identifier with no limits add up with no bound.)
  const std::int64_t with_open =
      open == 0 ? alone
                : limiter_.fits_at(d, msg->identifier, open > k_never - msg->cost ? k_never : open + msg->cost, now_us,
                                   msg->tier);
  if (alone == k_never) {
    out.verdict = wire::verdict_kind::never;
  } else if (with_open <= now_us) {
    out.verdict = wire::verdict_kind::go;
    // (Held open even at 0 units: each request that went settles one GO.)
    if (!asks_.open(peer, msg->domain, msg->identifier, msg->seq, msg->cost, now_us)) asks_untracked_.inc();
  } else if (with_open != k_never && with_open <= msg->latest_ms * 1000 &&
             limiter_.fits_at(d, msg->identifier, open + msg->cost, with_open, msg->tier) <= with_open) {
    // (Checked at that time: a sliding-window counter's fits_at may name a
    // time at which the units are not yet sure to fit.)
    // Not now, but before the request's latest time: the units are its from
    // then, held open from now (counted before they are used: the safe
    // side), and it is held until then, with no second question.
    out.verdict = wire::verdict_kind::go;
    out.at_ms = (with_open + 999) / 1000;
    if (!asks_.open(peer, msg->domain, msg->identifier, msg->seq, msg->cost, out.at_ms * 1000)) {
      asks_untracked_.inc();
    }
  } else {
    // Not in time: when the units fit, or, when only GOs still open stand in
    // the way, shortly after they fit alone (by then those are settled).
    out.verdict = wire::verdict_kind::wait;
    const std::int64_t at = with_open != k_never ? with_open : std::max(alone, now_us) + k_settle_wait_us;
    out.at_ms = std::max<std::int64_t>(1, (at + 999) / 1000);
  }
  asks_answered_[static_cast<int>(out.verdict)]->inc();
  std::optional<wire::delay_until> throttled;
  if (out.at_ms > 0) {
    // Every gatekeeper holds the client until then (the gate's pacing, one
    // rule interval apart), rather than each asking again.
    const rules::limits& l = limiter_.limits_of(d, msg->identifier, msg->tier);
    throttled.emplace();
    throttled->domain = domains_[d].name;
    throttled->identifier = msg->identifier;
    throttled->next_ms = out.at_ms;
    throttled->interval_ms = l.rules.empty() ? 1 : std::max<std::int64_t>(1, (l.rules[0].interval_us + 500) / 1000);
    top_.limited(d, msg->identifier, now_us);
  }
  answers_.push_back(std::move(out));
  return throttled;
}

}  // namespace smockron::master
