// ZMTP 3.0 (rfc.zeromq.org/spec/23), the ZeroMQ wire protocol, as far as the
// accounting stream needs it: the greeting, the NULL mechanism's READY, and
// frames. Pure functions, no I/O; the session state machine built on them is
// zmtp_session.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace smockron::zmtp {

inline constexpr std::size_t greeting_size = 64;
inline constexpr std::uint8_t flag_more = 0x01, flag_long = 0x02, flag_command = 0x04;

/// Our greeting: signature, version 3.0, mechanism NULL, as-server 0.
std::string_view greeting();
/// The CURVE greeting: as NULL's, mechanism CURVE and as-server set on the binding end.
std::string_view curve_greeting(bool as_server);

enum class greeting_status : std::uint8_t { need_more, ok, not_zmtp, old_version, mechanism };
/// Judges a peer's greeting from the bytes received so far (decides as early
/// as the bytes allow: a ZMTP 2.0 peer sends only 12). `detail` gets the
/// reason. The peer's mechanism must be `mechanism` (NULL or CURVE).
greeting_status check_greeting(std::string_view bytes, std::string& detail, std::string_view mechanism = "NULL");

/// The property a Smockron gatekeeper names itself by in the READY (or
/// CURVE metadata) of its accounting connections (wire addition): 16 hex
/// digits, one value for every connection of one proxy process, so that the
/// master counts gatekeepers, not connections (a proxy has one per worker).
/// A peer that does not know the property ignores it, as ZMTP has it.
inline constexpr std::string_view gatekeeper_property = "X-Gatekeeper";

/// READY's properties (its body after the command name): `socket_type`, and
/// `gatekeeper` as X-Gatekeeper when it is not empty.
std::string ready_properties(std::string_view socket_type, std::string_view gatekeeper = {});
/// A complete READY command frame with those properties.
std::string ready(std::string_view socket_type, std::string_view gatekeeper = {});

/// Appends one frame (short or long form by size).
void append_frame(std::string& out, std::uint8_t flags, std::string_view body);

struct frame {
  std::uint8_t flags = 0;
  std::string_view body;
  std::size_t size = 0;  ///< bytes the frame takes, header included
  bool more() const { return flags & flag_more; }
  bool command() const { return flags & flag_command; }
};
enum class frame_status : std::uint8_t { need_more, ok, reserved_flags, too_large };
/// Parses the frame at the start of `buf`; bodies over `max_body` are refused
/// (too_large: `out` then has the frame's flags and size, header included,
/// saturated, and no body, so that the caller can skip it by its length).
frame_status next_frame(std::string_view buf, std::uint64_t max_body, frame& out);

/// A command body split into its name and the rest; nothing if malformed.
std::optional<std::pair<std::string_view, std::string_view>> split_command(std::string_view body);
/// Property `name` (case-insensitive) from READY's properties (the body
/// after the name); nothing if the properties are malformed, empty if absent.
std::optional<std::string_view> ready_property(std::string_view properties, std::string_view name);
/// Socket-Type from READY's properties: ready_property(properties, "Socket-Type").
std::optional<std::string_view> ready_socket_type(std::string_view properties);
/// The PONG frame answering a PING command's rest (TTL + context).
std::string pong_for(std::string_view ping_rest);

/// Peer-supplied text made safe for a log line: printable ASCII, at most 64 bytes.
std::string printable(std::string_view s);

}  // namespace smockron::zmtp
