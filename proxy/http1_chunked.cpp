// HTTP/1.1 chunked framing (see http1.hpp).
#include "proxy/http1.hpp"

namespace smockron::proxy::http1 {
namespace {
constexpr unsigned char lower(unsigned char c) { return c >= 'A' && c <= 'Z' ? static_cast<unsigned char>(c + 32) : c; }
}  // namespace

bool chunked_decoder::fail(std::string_view why) {
  state_ = state::failed;
  error_ = why;
  return false;
}

std::optional<std::size_t> chunked_decoder::feed(std::string_view in, std::string_view& data) {
  data = {};
  std::size_t i = 0;
  while (i < in.size()) {
    const auto c = static_cast<unsigned char>(in[i]);
    switch (state_) {
      case state::size: {
        int v = -1;
        if (c >= '0' && c <= '9') v = c - '0';
        else if (lower(c) >= 'a' && lower(c) <= 'f') v = lower(c) - 'a' + 10;
        if (v >= 0) {
          if (++digits_ > 15) return fail("chunk size too large"), std::nullopt;
          remaining_ = remaining_ * 16 + static_cast<std::uint64_t>(v);
        } else if (digits_ == 0) {
          return fail("invalid chunk size"), std::nullopt;
        } else if (c == ';') {
          state_ = state::ext;
        } else if (c == ' ' || c == '\t') {
          state_ = state::size_ws;  // RFC 9112 7.1.1: only BWS, then ";", may follow the size
        } else if (c == '\r') {
          state_ = state::size_lf;
        } else {
          return fail("invalid chunk size"), std::nullopt;
        }
        ++i;
        break;
      }
      case state::size_ws:
        if (c == ';') state_ = state::ext;
        else if (c == '\r') state_ = state::size_lf;
        else if (c != ' ' && c != '\t') return fail("invalid chunk size line"), std::nullopt;
        else if (++line_ > max_line_) return fail("chunk size line too long"), std::nullopt;
        ++i;
        break;
      case state::ext:
        if (c == '\r') {
          state_ = state::size_lf;
        } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
          return fail("invalid chunk extension"), std::nullopt;
        } else if (++line_ > max_line_) {
          return fail("chunk extension too long"), std::nullopt;
        }
        ++i;
        break;
      case state::size_lf:
        if (c != '\n') return fail("invalid chunk size line"), std::nullopt;
        ++i;
        digits_ = 0;
        line_ = 0;
        if (remaining_ == 0) {
          state_ = state::trailer;
          line_empty_ = true;
        } else {
          state_ = state::data;
        }
        break;
      case state::data: {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, in.size() - i));
        data = in.substr(i, n);
        i += n;
        remaining_ -= n;
        if (remaining_ == 0) state_ = state::data_cr;
        return i;  // one run of data per call
      }
      case state::data_cr:
        if (c != '\r') return fail("chunk data longer than its size"), std::nullopt;
        state_ = state::data_lf;
        ++i;
        break;
      case state::data_lf:
        if (c != '\n') return fail("chunk data longer than its size"), std::nullopt;
        state_ = state::size;
        ++i;
        break;
      case state::trailer:
        if (c == '\r') {
          state_ = state::trailer_lf;
        } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
          return fail("invalid trailer"), std::nullopt;
        } else {
          line_empty_ = false;
          if (++trailer_bytes_ > max_line_) return fail("trailers too large"), std::nullopt;
        }
        ++i;
        break;
      case state::trailer_lf:
        if (c != '\n') return fail("invalid trailer"), std::nullopt;
        ++i;
        if (line_empty_) {
          state_ = state::done;
          return i;
        }
        line_empty_ = true;
        state_ = state::trailer;
        break;
      case state::done: return i;
      case state::failed: return std::nullopt;
    }
  }
  return i;
}

}  // namespace smockron::proxy::http1
