// The master's side of exact admission (see ingest.hpp, asks.hpp).
#include <limits>

#include "master/engine/ingest.hpp"

namespace smockron::master {
namespace {
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
  // GO when the units fit behind every GO not settled yet, each counted as
  // used when its request is expected to go (asks.hpp): whatever those
  // requests' accounting charges later, at their time, was counted from the
  // moment they could go.
  const std::int64_t alone = limiter_.fits_at(d, msg->identifier, msg->cost, now_us, msg->tier);
  asks_.pending(msg->domain, msg->identifier, pending_);
  const std::int64_t fits =
      pending_.empty() ? alone : limiter_.fits_after(d, msg->identifier, pending_, msg->cost, now_us, msg->tier);
  // A GO for now goes when the answer reaches the gatekeeper: counted from then.
  const std::int64_t arrives = now_us + asks_.lag_us(peer);
  if (alone == k_never || fits == k_never) {
    // (More than a rule's burst or a quota's limit: behind other GOs too.)
    out.verdict = wire::verdict_kind::never;
  } else if (fits <= now_us) {
    out.verdict = wire::verdict_kind::go;
    // (Held open even at 0 units: each request that went settles one GO.)
    if (!asks_.open(peer, msg->domain, msg->identifier, msg->seq, msg->cost, now_us, 0, arrives)) {
      asks_untracked_.inc();
    }
  } else if (fits <= msg->latest_ms * 1000 &&
             limiter_.fits_after(d, msg->identifier, pending_, msg->cost, fits, msg->tier) <= fits) {
    // (Checked at that time: the times fits_at names are checked, but for
    // its last resort.)
    // Not now, but before the request's latest time: the units are its from
    // then, and it is held until then, with no second question.
    out.verdict = wire::verdict_kind::go;
    out.at_ms = (fits + 999) / 1000;
    if (!asks_.open(peer, msg->domain, msg->identifier, msg->seq, msg->cost, now_us, out.at_ms * 1000,
                    std::max(out.at_ms * 1000, arrives))) {
      asks_untracked_.inc();
    }
  } else {
    // Not in time (past its max_delay: the gatekeeper refuses it, Retry-After
    // that time), or at a time not sure yet (asked again then).
    out.verdict = wire::verdict_kind::wait;
    out.at_ms = std::max<std::int64_t>(1, (fits + 999) / 1000);
  }
  asks_answered_[static_cast<int>(out.verdict)]->inc();
  std::optional<wire::delay_until> throttled;
  // A time the rules set (not merely the place behind GOs still on their
  // way, nor before the answer arrives): every gatekeeper holds the client
  // until then (the gate's pacing, one rule interval apart), rather than
  // each asking again.
  const std::int64_t behind = pending_.empty() ? now_us : std::max(now_us, pending_.back().at_us);
  if (out.at_ms > 0 && (out.verdict != wire::verdict_kind::go || fits > std::max(behind, arrives))) {
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
