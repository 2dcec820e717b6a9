// The access log: one line per request, as text (key=value) or JSON (one
// object per line), to stdout or a file that is reopened on SIGUSR1 for log
// rotation. Formatting is pure; the writer is shared by the workers.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace smockron::proxy {

/// What one request's line says. Strings are copies: the request's buffers
/// are reused before the line is written.
struct access_entry {
  std::int64_t time_us = 0;  ///< wall clock when the request head was complete
  std::string client;        ///< resolved client (trusted proxies, PROXY protocol)
  std::string peer;          ///< the socket's (or PROXY header's) address
  std::string method, target;
  std::string_view protocol = "HTTP/1.1";  ///< HTTP/1.1 (1.0 included) or HTTP/2
  unsigned status = 0;                     ///< sent to the client; 0: none (the client or upstream went away first)
  std::uint64_t bytes_in = 0;              ///< request body bytes relayed upstream
  std::uint64_t bytes_out = 0;             ///< response body bytes relayed to the client
  double duration_ms = 0;                  ///< head complete to response done
  double held_ms = 0;                      ///< of which held by the gate
  std::string_view decision;               ///< accepted, delayed, rejected, unidentified, exempt
  std::string_view shadow;                 ///< a shadow route's would-be decision (else empty)
  std::string domain, identifier;          ///< identifier as the gate saw it (credentials hashed)
  std::string upstream;                    ///< server "host:port" (empty: not forwarded)
};

/// `time=... client=... "GET /x" status=200 ...`: one line, no newline.
std::string format_text(const access_entry& e);
/// One JSON object, every string escaped (RFC 8259), no newline.
std::string format_json(const access_entry& e);

class access_log {
public:
  enum class format : std::uint8_t { text, json };

  /// `path` empty: stdout. Throws std::runtime_error when the file cannot be opened.
  access_log(std::string path, format f);
  ~access_log();
  access_log(const access_log&) = delete;
  access_log& operator=(const access_log&) = delete;

  /// Appends one line (under a lock: lines of concurrent workers never interleave).
  void write(const access_entry& e);
  /// Reopens the file (after a rotation moved it); false with `error` set if it cannot be.
  bool reopen(std::string& error);
  /// Switches path and format (a reload); false with `error` set if the new file cannot be opened.
  bool configure(const std::string& path, format f, std::string& error);

private:
  std::mutex mutex_;
  std::string path_;
  format format_;
  int fd_ = 1;
};

}  // namespace smockron::proxy
