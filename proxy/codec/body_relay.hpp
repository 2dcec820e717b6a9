// Relaying one message body, without I/O: which received bytes belong to the
// body and how they go out (as received, de-chunked for an HTTP/1.0 client,
// or re-framed as chunked when the upstream delimits by closing and the
// client speaks HTTP/1.1). The caller reads, hands the bytes to step(),
// writes the buffer list and drops what step() used.
#pragma once

#include <boost/asio/buffer.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "proxy/codec/http1.hpp"

namespace smockron::proxy {

/// The buffers of one write (a head, body bytes, chunk framing); what was
/// sent is dropped from the front. Holds views: the bytes must outlive it.
struct buffer_list {
  std::array<boost::asio::const_buffer, 16> items;
  std::size_t first = 0, count = 0;

  void add(const void* p, std::size_t n) { items[count++] = boost::asio::const_buffer(p, n); }
  /// No room for another step's worst case (size line, data, CRLF).
  bool full() const { return count + 3 > items.size(); }
  bool empty() const { return first == count; }
  void clear() { first = count = 0; }
  std::span<const boost::asio::const_buffer> span() const { return {items.data() + first, count - first}; }
  void consume(std::size_t n);
};

struct body_relay {
  /// `in`: how the sender frames the body; `out`: how it is to be framed
  /// for the receiver; `length`: the Content-Length when `in` is length;
  /// `max_line`: the longest chunk-size or trailer line accepted.
  body_relay(http1::framing in, http1::framing out, std::uint64_t length, std::size_t max_line);

  /// Adds to `out` what to send for the received bytes `in`; returns how
  /// many bytes of `in` that used (bytes past the end of the body are not
  /// used: they are the next message), or nothing on malformed chunked
  /// framing (`dec.error()` says why).
  std::optional<std::size_t> step(std::string_view in, buffer_list& out);

  http1::framing in_framing;
  bool dechunk, rechunk;
  std::uint64_t remaining;  ///< of a Content-Length body
  http1::chunked_decoder dec;
  std::uint64_t data_bytes = 0;  ///< payload bytes so far
  bool eof = false;              ///< set by the caller when the sender closed (until_close bodies end so)
  bool done;                     ///< the whole body has been stepped over

private:
  std::array<char, 24> size_line_{};
};

}  // namespace smockron::proxy
