// Body relay (see body_relay.hpp).
#include "proxy/codec/body_relay.hpp"

#include <algorithm>
#include <cstdio>

namespace smockron::proxy {

void buffer_list::consume(std::size_t n) {
  for (; first < count && n >= items[first].size(); ++first) n -= items[first].size();
  if (first < count) items[first] += n;
}

body_relay::body_relay(http1::framing in, http1::framing out, std::uint64_t length, std::size_t max_line)
    : in_framing(in),
      dechunk(in == http1::framing::chunked && out != http1::framing::chunked),
      rechunk(in == http1::framing::until_close && out == http1::framing::chunked),
      remaining(length),
      dec(max_line),
      done(in == http1::framing::none) {}

std::optional<std::size_t> body_relay::step(std::string_view in, buffer_list& out) {
  using http1::framing;
  std::size_t n = 0;
  switch (in_framing) {
    case framing::none: break;
    case framing::length:
      n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining, in.size()));
      remaining -= n;
      data_bytes += n;
      done = remaining == 0;
      if (n > 0) out.add(in.data(), n);
      break;
    case framing::chunked:
      while (n < in.size() && !dec.done() && !out.full()) {
        std::string_view data;
        const auto used = dec.feed(in.substr(n), data);
        if (!used) return std::nullopt;
        if (dechunk && !data.empty()) out.add(data.data(), data.size());
        n += *used;
        data_bytes += data.size();
      }
      done = dec.done();
      if (!dechunk && n > 0) out.add(in.data(), n);
      break;
    case framing::until_close:
      n = in.size();
      data_bytes += n;
      if (rechunk && n > 0) {
        const auto len = std::snprintf(size_line_.data(), size_line_.size(), "%zx\r\n", n);
        out.add(size_line_.data(), static_cast<std::size_t>(len));
        out.add(in.data(), n);
        out.add("\r\n", 2);
      } else if (n > 0) {
        out.add(in.data(), n);
      }
      if (rechunk && eof) out.add("0\r\n\r\n", 5);
      done = eof;
      break;
  }
  return n;
}

}  // namespace smockron::proxy
