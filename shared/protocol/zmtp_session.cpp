// One end of a ZMTP 3.0 connection (see zmtp_session.hpp).
#include "shared/protocol/zmtp_session.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <vector>

#include "shared/protocol/zmtp.hpp"

namespace smockron::zmtp {
namespace {

constexpr std::array<std::string_view, fault_count> k_fault_names = {
    "greeting", "mechanism", "handshake", "framing", "peer_error",  "subscriptions", "timeout", "peer_limit",
    "stalled",  "connect",   "closed",    "io",      "unknown_key", "bad_box",       "nonce"};

const std::string& hello_for(std::string_view socket_type) {
  static const std::string pub = std::string(greeting()) + ready("PUB");
  static const std::string sub = std::string(greeting()) + ready("SUB");
  return socket_type == "PUB" ? pub : sub;
}

}  // namespace

std::string_view to_string(fault f) { return k_fault_names[static_cast<std::size_t>(f)]; }

session::session(role r, limits l, security sec) : role_(r), limits_(l) {
  if (sec.server) mechanism_ = std::make_unique<curve::mechanism>(std::move(sec.server));
  else if (sec.client) mechanism_ = std::make_unique<curve::mechanism>(std::move(sec.client));
}

std::string_view session::hello(role r) { return hello_for(r == role::pub ? "PUB" : "SUB"); }

void session::start(std::string& out) {
  if (!mechanism_) {
    if (own_gatekeeper_.empty()) out += hello(role_);
    else out += std::string(greeting()) + zmtp::ready(role_ == role::pub ? "PUB" : "SUB", own_gatekeeper_);
    return;
  }
  out += curve_greeting(mechanism_->is_server());
  if (mechanism_->is_server()) return;
  const std::string hello = mechanism_->hello();
  if (hello.empty()) fail(fault::bad_box, "the server key is not a usable key");
  else append_frame(out, flag_command, hello);
}

void session::append(std::string& out, std::uint8_t flags, std::string_view body) {
  if (mechanism_) mechanism_->seal(out, flags & flag_more, flags & flag_command, body);
  else append_frame(out, flags, body);
}

void session::append_framed(std::string& out, std::string_view framed) {
  if (!mechanism_) {
    out += framed;
    return;
  }
  frame f;
  while (!framed.empty() && next_frame(framed, framed.size(), f) == frame_status::ok) {
    mechanism_->seal(out, f.more(), f.command(), f.body);
    framed.remove_prefix(f.size);
  }
}

bool session::fail(fault f, std::string detail) {
  phase_ = phase::failed;
  fault_ = f;
  detail_ = std::move(detail);
  return false;
}

bool session::greet(std::string_view in) {
  std::string detail;
  switch (check_greeting(in, detail, mechanism_ ? "CURVE" : "NULL")) {
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
  if (mechanism_) return feed_curve(in, pos, ev, out);
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
    if (!peer_type_fits(rest)) return false;
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
    if (out.size() < limits_.max_pong_backlog) append_framed(out, pong_for(rest));
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

// ---- CURVE ---------------------------------------------------------------------

bool session::curve_fail(curve::error e, std::string_view during) {
  const std::string what = std::string(during) + ": " + std::string(curve::to_string(e));
  switch (e) {
    case curve::error::bad_box: return fail(fault::bad_box, what);
    case curve::error::nonce: return fail(fault::nonce, what);
    case curve::error::unknown_key: return fail(fault::unknown_key, what + " (the client's key is not listed)");
    case curve::error::malformed: break;
  }
  return fail(phase_ == phase::messages ? fault::framing : fault::handshake, what);
}

std::string session::own_properties() const {
  return ready_properties(role_ == role::pub ? "PUB" : "SUB", own_gatekeeper_);
}

bool session::peer_type_fits(std::string_view metadata) {
  const auto type = ready_socket_type(metadata);
  if (!type) return fail(fault::handshake, "malformed READY properties");
  // (Any other value is no name: the master then does not count the connection for pace share.)
  const auto gk = ready_property(metadata, gatekeeper_property).value_or("");
  std::uint64_t id = 0;
  if (gk.size() == 16 && std::from_chars(gk.data(), gk.data() + gk.size(), id, 16).ptr == gk.data() + gk.size())
    peer_gatekeeper_ = id;
  const bool fits = role_ == role::pub ? (*type == "SUB" || *type == "XSUB") : (*type == "PUB" || *type == "XPUB");
  if (!fits) {
    return fail(fault::handshake, "peer socket type \"" + printable(*type) + "\" cannot talk to a " +
                                      (role_ == role::pub ? "PUB" : "SUB"));
  }
  return true;
}

bool session::curve_handshake(std::string_view body, std::string& out, session_events& ev) {
  const auto cmd = split_command(body);
  if (!cmd) return fail(fault::handshake, "malformed command");
  if (cmd->first == "ERROR") {
    const std::string_view rest = cmd->second;
    const std::size_t n =
        rest.empty() ? 0 : std::min<std::size_t>(static_cast<unsigned char>(rest[0]), rest.size() - 1);
    return fail(fault::peer_error, "peer sent ERROR \"" + printable(rest.substr(rest.empty() ? 0 : 1, n)) + "\"");
  }
  // Our own properties (the Socket-Type, our gatekeeper), as a READY body after its name.
  const std::string props = own_properties();
  std::string reply, metadata;
  if (mechanism_->is_server()) {
    if (cmd->first == "HELLO" && !hello_seen_) {
      if (const auto e = mechanism_->on_hello(body, reply)) return curve_fail(*e, "HELLO");
      hello_seen_ = true;
      append_frame(out, flag_command, reply);
      return true;
    }
    if (cmd->first == "INITIATE" && hello_seen_) {
      if (const auto e = mechanism_->on_initiate(body, props, metadata, reply)) return curve_fail(*e, "INITIATE");
      if (!peer_type_fits(metadata)) return false;
      append_frame(out, flag_command, reply);
      phase_ = phase::messages;
      ev.on_ready();
      return true;
    }
  } else {
    if (cmd->first == "WELCOME" && !hello_seen_) {
      if (const auto e = mechanism_->on_welcome(body, props, reply)) return curve_fail(*e, "WELCOME");
      hello_seen_ = true;
      append_frame(out, flag_command, reply);
      return true;
    }
    if (cmd->first == "READY" && hello_seen_) {
      if (const auto e = mechanism_->on_ready(body, metadata)) return curve_fail(*e, "READY");
      if (!peer_type_fits(metadata)) return false;
      phase_ = phase::messages;
      ev.on_ready();
      return true;
    }
  }
  return fail(fault::handshake, "unexpected command \"" + printable(cmd->first) + "\" in the CURVE handshake");
}

std::size_t session::feed_curve(std::string_view in, std::size_t pos, session_events& ev, std::string& out) {
  // A box holds one frame: its plaintext (the frame) plus 33 bytes.
  const std::size_t max_box = limits_.max_message + 64;
  const std::size_t max_frames = std::min(limits_.max_frames, plain_ends_.size() - 1);
  while (phase_ != phase::failed) {
    frame f;
    const auto st = next_frame(in.substr(pos), max_box, f);
    if (st == frame_status::need_more) break;
    if (st == frame_status::reserved_flags) return fail(fault::framing, "reserved flag bits set"), pos;
    if (st == frame_status::too_large)
      return fail(fault::framing, "frame over " + std::to_string(max_box) + " bytes"), pos;
    pos += f.size;
    if (phase_ == phase::handshake) {
      if (!f.command() || f.more()) return fail(fault::handshake, "a data frame in the CURVE handshake"), pos;
      curve_handshake(f.body, out, ev);
      continue;
    }
    const std::size_t before = plain_.size();
    bool more = false, is_command = false;
    if (const auto e = mechanism_->open(f.body, plain_, more, is_command)) return curve_fail(*e, "MESSAGE"), pos;
    if (is_command) {  // PING, SUBSCRIBE...: served at once, even between a message's frames
      const std::string body = plain_.substr(before);
      plain_.resize(before);
      if (more) return fail(fault::framing, "command frame with MORE set"), pos;
      command(body, ev, out);
      continue;
    }
    if (plain_.size() > limits_.max_message)
      return fail(fault::framing, "message over " + std::to_string(limits_.max_message) + " bytes"), pos;
    if (plain_count_ < max_frames) plain_ends_[plain_count_++] = plain_.size();
    else plain_truncated_ = true;
    if (more) continue;
    std::array<std::string_view, 17> frames;
    std::size_t start = 0;
    for (std::size_t i = 0; i < plain_count_; ++i) {
      frames[i] = std::string_view(plain_).substr(start, plain_ends_[i] - start);
      start = plain_ends_[i];
    }
    data({frames.data(), plain_count_}, plain_truncated_, ev);
    plain_.clear();
    plain_count_ = 0;
    plain_truncated_ = false;
  }
  return pos;
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
