// One end of a ZMTP 3.0 connection (see zmtp_session.hpp).
#include "shared/protocol/zmtp_session.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include "shared/protocol/zmtp.hpp"

namespace smockron::zmtp {
namespace {

constexpr std::array<std::string_view, fault_count> k_fault_names = {
    "greeting", "mechanism",  "handshake", "framing", "peer_error", "subscriptions",
    "timeout",  "peer_limit", "stalled",   "connect", "closed",     "io"};

const std::string& hello_for(std::string_view socket_type) {
  static const std::string pub = std::string(greeting()) + ready("PUB");
  static const std::string sub = std::string(greeting()) + ready("SUB");
  return socket_type == "PUB" ? pub : sub;
}

}  // namespace

std::string_view to_string(fault f) { return k_fault_names[static_cast<std::size_t>(f)]; }

session::session(role r, limits l) : role_(r), limits_(l) {}

std::string_view session::hello(role r) { return hello_for(r == role::pub ? "PUB" : "SUB"); }

bool session::fail(fault f, std::string detail) {
  phase_ = phase::failed;
  fault_ = f;
  detail_ = std::move(detail);
  return false;
}

bool session::greet(std::string_view in) {
  std::string detail;
  switch (check_greeting(in, detail)) {
    case greeting_status::need_more: return false;
    case greeting_status::ok: phase_ = phase::handshake; return true;
    case greeting_status::mechanism: return fail(fault::mechanism, detail);
    default: return fail(fault::greeting, detail);
  }
}

bool session::skip_frame(const frame& f, std::size_t before, session_events& ev) {
  if (phase_ != phase::messages) return fail(fault::handshake, "message before READY");
  if (!skip_more_) skipped_ = before;  // its frames already here count too
  skipped_ += f.size;
  if (skipped_ > limits_.max_skip) {
    const auto bound = std::max<std::uint64_t>(limits_.max_skip, limits_.max_message);
    return fail(fault::framing, "message over " + std::to_string(bound) + " bytes");
  }
  skip_ = f.size;
  skip_more_ = f.more();
  if (!skip_more_) ev.on_oversized(skipped_);
  return true;
}

std::size_t session::feed(std::string_view in, session_events& ev, std::string& out) {
  if (phase_ == phase::failed) return 0;
  std::size_t pos = 0;
  if (phase_ == phase::greeting) {
    if (!greet(in)) return 0;
    pos = greeting_size;
  }
  // Frames of the message being read (views into `in`).
  std::array<std::string_view, 16> frames;
  const std::size_t max_frames = std::min(limits_.max_frames, frames.size());
  std::size_t count = 0;
  bool truncated = false;
  std::size_t message_start = pos;
  // A fault ends the parse; what came before it stays consumed.
  const auto stop = [&](fault f, std::string detail) {
    fail(f, std::move(detail));
    return message_start;
  };
  for (;;) {
    if (skip_ > 0) {  // discarding an oversized message by length
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(skip_, in.size() - pos));
      pos += n;
      skip_ -= n;
      message_start = pos;
      served_ = 0;
      if (skip_ > 0) break;  // the rest has not arrived yet
      continue;
    }
    frame f;
    // The bound is on the whole message, so a message of many frames is capped too.
    const auto st = next_frame(in.substr(pos), limits_.max_message - (pos - message_start), f);
    if (st == frame_status::need_more) break;
    if (st == frame_status::reserved_flags) return stop(fault::framing, "reserved flag bits set");
    const bool over = st == frame_status::too_large || pos - message_start + f.size > limits_.max_message;
    const bool is_command = f.flags & flag_command;
    // A message over the bound, and every later frame of it, is consumed by
    // length and skipped on its own; commands between its frames are served.
    if ((over || skip_more_) && !is_command) {
      if (!skip_frame(f, pos - message_start, ev)) return message_start;
      count = 0;
      truncated = false;
      continue;
    }
    if (over) return stop(fault::framing, "command over " + std::to_string(limits_.max_message) + " bytes");
    pos += f.size;
    if (is_command) {
      if (f.more()) return stop(fault::framing, "command frame with MORE set");
      // libzmq sends a heartbeat PING whenever it is due, even between the
      // frames of a message. Such a command is served at once, but its bytes
      // stay with the unfinished message and are parsed again with the rest
      // of it: `served_` makes sure it is served only once.
      const std::size_t at = pos - message_start;
      if (at > served_ && !command(f.body, ev, out)) return message_start;
      if (count == 0) {
        message_start = pos;
        served_ = 0;
      } else {
        served_ = std::max(served_, at);
      }
      continue;
    }
    if (phase_ != phase::messages) return stop(fault::handshake, "message before READY");
    if (count < max_frames) frames[count++] = f.body;
    else truncated = true;
    if (!f.more()) {
      if (!data({frames.data(), count}, truncated, ev)) return message_start;
      count = 0;
      truncated = false;
      message_start = pos;
      served_ = 0;
    }
  }
  return message_start;
}

bool session::command(std::string_view body, session_events& ev, std::string& out) {
  const auto cmd = split_command(body);
  if (!cmd) return fail(fault::framing, "malformed command");
  const auto [name, rest] = *cmd;
  if (name == "READY") {
    if (phase_ != phase::handshake) return fail(fault::handshake, "second READY");
    const auto type = ready_socket_type(rest);
    if (!type) return fail(fault::handshake, "malformed READY properties");
    const bool fits = role_ == role::pub ? (*type == "SUB" || *type == "XSUB") : (*type == "PUB" || *type == "XPUB");
    if (!fits) {
      return fail(fault::handshake, "peer socket type \"" + printable(*type) + "\" cannot talk to a " +
                                        (role_ == role::pub ? "PUB" : "SUB"));
    }
    phase_ = phase::messages;
    ev.on_ready();
    return true;
  }
  if (name == "ERROR") {
    const std::size_t n =
        rest.empty() ? 0 : std::min<std::size_t>(static_cast<unsigned char>(rest[0]), rest.size() - 1);
    return fail(fault::peer_error, "peer sent ERROR \"" + printable(rest.substr(rest.empty() ? 0 : 1, n)) + "\"");
  }
  if (phase_ != phase::messages)
    return fail(fault::handshake, "unexpected command \"" + printable(name) + "\" before READY");
  if (name == "PING") {
    if (out.size() < limits_.max_pong_backlog) out += pong_for(rest);
  } else if (role_ == role::pub && (name == "SUBSCRIBE" || name == "CANCEL")) {
    ev.on_subscription(name == "SUBSCRIBE", rest);
  }
  return true;  // PONG, and commands our role has no use for: ignored
}

bool session::data(std::span<const std::string_view> frames, bool truncated, session_events& ev) {
  if (role_ == role::sub) {
    ev.on_message(frames, truncated);
    return true;
  }
  // A SUB sends nothing but subscriptions: 0x01 (subscribe) or 0x00 (cancel)
  // and the topic; other first bytes are ignored, as libzmq does.
  const std::string_view body = frames.empty() ? std::string_view() : frames[0];
  if (!body.empty() && (body[0] == 0 || body[0] == 1)) ev.on_subscription(body[0] == 1, body.substr(1));
  return true;
}

bool subscription_set::apply(bool subscribe, std::string_view topic) {
  const bool open = topic.empty() || topic.back() != '\0';
  if (subscribe) {
    if (auto it = subs_.find(topic); it != subs_.end()) {
      ++it->second;
      return true;
    }
    if (subs_.size() >= max_) return false;
    subs_.emplace(std::string(topic), 1);
    open_prefixes_ += open;
    return true;
  }
  if (auto it = subs_.find(topic); it != subs_.end() && --it->second == 0) {
    subs_.erase(it);
    open_prefixes_ -= open;
  }
  return true;
}

bool subscription_set::matches(std::string_view topic) const {
  if (subs_.empty()) return false;
  if (subs_.find(topic) != subs_.end()) return true;  // the master's exact "domain\0"
  // A topic is "domain\0" and a domain holds no \0: a subscription ending in
  // \0 matches only itself. Only other prefixes ("" = everything) need a scan.
  if (open_prefixes_ == 0) return false;
  for (const auto& [prefix, n] : subs_) {
    if (topic.starts_with(prefix)) return true;
  }
  return false;
}

}  // namespace smockron::zmtp
