// The UDP rate limiter's query protocol (../shared/spec/peer-udp-rate-limiter.txt),
// as the master answers it: one datagram each way, an optional request ID,
// unknown requests ignored. Keys are read as the protocol's own examples use
// them: "over_limit ws ip=74.11.99.155" is domain "ws", identifier
// "ip=74.11.99.155". Pure functions: parsing requests (untrusted bytes,
// fuzzed) and formatting responses, shared by the master and the client.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shared/base/net.hpp"

namespace smockron::query {

/// The largest datagram read: a domain (255 bytes), an identifier (1,024)
/// and the words around them fit. Larger ones are ignored (counted).
inline constexpr std::size_t max_datagram = 2048;

enum class command : std::uint8_t { over_limit, get_stats, get_size };
inline constexpr std::size_t command_count = 3;

struct request {
  std::optional<std::uint64_t> id;  ///< echoed before the response
  command cmd = command::get_size;
  std::string_view domain;      ///< over_limit, get_stats
  std::string_view identifier;  ///< the rest of the line after the domain and one space
};

/// Why a datagram gets no answer (a metrics label).
enum class ignored : std::uint8_t { malformed, unknown_command, too_large };
std::string_view to_string(ignored i);

/// Parses one datagram: "[ID ]COMMAND[ ARGS]", a trailing "\n" or "\r\n"
/// allowed. An ID is a non-negative decimal that fits 64 bits. over_limit
/// and get_stats need "DOMAIN IDENTIFIER" (domain at most 255 bytes,
/// identifier at most 1,024, neither empty nor holding a control byte);
/// get_size takes nothing. Anything else is the reason it is ignored.
struct parse_result {
  std::optional<request> req;
  ignored why = ignored::malformed;
};
parse_result parse(std::string_view datagram);

/// "ok Y|N RATE LIMIT PERIOD": over the limit or not; uses in the binding
/// rule's window, its burst, and the window in whole seconds.
struct over_limit_answer {
  bool over = false;
  double rate = 0;
  double limit = 0;
  std::int64_t period_s = 0;
};
struct stats_answer {
  std::uint64_t n_req = 0, n_over = 0, last_max_rate = 0;
};

/// Responses as the protocol specifies them, each preceded by "ID " when the
/// request had one, appended to `out` (the server reuses one buffer per answer).
void append(std::string& out, const std::optional<std::uint64_t>& id, const over_limit_answer& a);
void append(std::string& out, const std::optional<std::uint64_t>& id, const stats_answer& s, std::string_view domain,
            std::string_view identifier);
void append_size(std::string& out, const std::optional<std::uint64_t>& id, std::uint64_t bytes, std::uint64_t keys);
/// The same, as new strings.
std::string format(const std::optional<std::uint64_t>& id, const over_limit_answer& a);
std::string format(const std::optional<std::uint64_t>& id, const stats_answer& s, std::string_view domain,
                   std::string_view identifier);
std::string format_size(const std::optional<std::uint64_t>& id, std::uint64_t bytes, std::uint64_t keys);

/// A blocking client (scripts, tests, smockron-query): one UDP socket,
/// requests numbered 1, 2, ...; answers to other IDs are skipped.
class client {
public:
  /// `server`: an IP literal and port. Throws std::runtime_error when no socket can be made.
  explicit client(const host_port& server);
  client(const client&) = delete;
  client& operator=(const client&) = delete;
  ~client();
  /// Sends "ID request" and waits up to `timeout` for its answer (the text
  /// after the ID); nothing when none came (the protocol's client then
  /// behaves as if "N" had been answered).
  std::optional<std::string> ask(std::string_view request, int timeout_ms);

private:
  int fd_ = -1;
  std::uint64_t next_id_ = 1;
};

/// A response's request ID, and the text after it (client side).
struct response {
  std::optional<std::uint64_t> id;
  std::string_view body;
};
response split_response(std::string_view datagram);

}  // namespace smockron::query
