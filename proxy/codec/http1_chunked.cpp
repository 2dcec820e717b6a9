// HTTP/1.1 chunked framing (see http1.hpp).
#include <algorithm>

#include "proxy/codec/http1.hpp"
#include "proxy/codec/http1_chars.hpp"

namespace smockron::proxy::http1 {

using chars::is_ctl;
using chars::is_tchar;
using chars::lower;

bool chunked_decoder::fail(std::string_view why) {
  state_ = state::failed;
  error_ = why;
  return false;
}

bool chunked_decoder::forbidden_trailer() const {
  // RFC 9110 6.5.1: framing, routing and connection fields have no place in
  // trailers; a next hop that merged them into the head would be misled.
  static constexpr std::string_view forbidden[] = {
      "content-length", "transfer-encoding", "host",   "connection",      "keep-alive", "proxy-connection", "te",
      "trailer",        "upgrade",           "expect", "content-encoding"};
  if (name_len_ > name_.size()) return false;  // longer than any of them
  const std::string_view name(name_.data(), name_len_);
  return std::find(std::begin(forbidden), std::end(forbidden), name) != std::end(forbidden);
}

// One byte of a chunk size line: the size, its extensions, its CRLF.
// False: malformed (fail() said why).
bool chunked_decoder::size_line(unsigned char c) {
  // Every byte of a size line after its digits counts against max_line.
  if (state_ >= state::size_ws && state_ <= state::ext_value_end && ++line_ > max_line_) {
    return fail("chunk extension too long");
  }
  switch (state_) {
    case state::size: {
      int v = -1;
      if (c >= '0' && c <= '9') v = c - '0';
      else if (lower(c) >= 'a' && lower(c) <= 'f') v = lower(c) - 'a' + 10;
      if (v >= 0) {
        if (++digits_ > 15) return fail("chunk size too large");
        remaining_ = remaining_ * 16 + static_cast<std::uint64_t>(v);
      } else if (digits_ == 0) {
        return fail("invalid chunk size");
      } else if (c == ';') {
        state_ = state::ext_name_ws;
      } else if (c == ' ' || c == '\t') {
        state_ = state::size_ws;
      } else if (c == '\r') {
        state_ = state::size_lf;
      } else {
        return fail("invalid chunk size");
      }
      break;
    }
    // chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] ) (RFC 9112 7.1.1)
    // BWS is only ever followed by ";" or "=": none may end the line.
    case state::size_ws:
    case state::ext_value_end:
      if (c == ';') state_ = state::ext_name_ws;
      else if (c != ' ' && c != '\t') return fail("invalid chunk extension");
      break;
    case state::ext_name_ws:
      if (is_tchar(c)) state_ = state::ext_name;
      else if (c != ' ' && c != '\t') return fail("invalid chunk extension");
      break;
    case state::ext_name:
    case state::ext_name_end:
      if (c == '=') state_ = state::ext_value_ws;
      else if (c == ';') state_ = state::ext_name_ws;
      else if (c == '\r' && state_ == state::ext_name) state_ = state::size_lf;
      else if (c == ' ' || c == '\t') state_ = state::ext_name_end;
      else if (state_ != state::ext_name || !is_tchar(c)) return fail("invalid chunk extension");
      break;
    case state::ext_value_ws:
      if (c == '"') state_ = state::ext_quoted;
      else if (is_tchar(c)) state_ = state::ext_token;
      else if (c != ' ' && c != '\t') return fail("invalid chunk extension");
      break;
    case state::ext_token:
    case state::ext_quote_end:
      if (c == ';') state_ = state::ext_name_ws;
      else if (c == '\r') state_ = state::size_lf;
      else if (c == ' ' || c == '\t') state_ = state::ext_value_end;
      else if (state_ != state::ext_token || !is_tchar(c)) return fail("invalid chunk extension");
      break;
    case state::ext_quoted:  // qdtext / quoted-pair; a line end inside is malformed
      if (c == '"') state_ = state::ext_quote_end;
      else if (c == '\\') state_ = state::ext_quoted_pair;
      else if (is_ctl(c)) return fail("invalid chunk extension");
      break;
    case state::ext_quoted_pair:
      if (is_ctl(c)) return fail("invalid chunk extension");
      state_ = state::ext_quoted;
      break;
    case state::size_lf:
      if (c != '\n') return fail("invalid chunk size line");
      digits_ = 0;
      line_ = 0;
      if (remaining_ == 0) {
        state_ = state::trailer;
      } else {
        state_ = state::data;
      }
      break;
    default: break;
  }
  return true;
}

std::optional<std::size_t> chunked_decoder::feed(std::string_view in, std::string_view& data) {
  data = {};
  std::size_t i = 0;
  while (i < in.size()) {
    const auto c = static_cast<unsigned char>(in[i]);
    if (state_ <= state::size_lf) {
      if (!size_line(c)) return std::nullopt;
    } else {
      switch (state_) {
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
          break;
        case state::data_lf:
          if (c != '\n') return fail("chunk data longer than its size"), std::nullopt;
          state_ = state::size;
          break;
        // trailer-section = *( field-line CRLF ), field-line = field-name ":" OWS field-value OWS
        case state::trailer:
          if (c == '\r') {
            line_empty_ = true;
            state_ = state::trailer_lf;
          } else if (is_tchar(c)) {
            line_empty_ = false;
            name_len_ = 0;
            state_ = state::trailer_name;
            continue;  // the name's first byte is read below
          } else if (c == ' ' || c == '\t') {
            return fail("obsolete line folding in trailers"), std::nullopt;
          } else {
            return fail("invalid trailer"), std::nullopt;
          }
          break;
        case state::trailer_name:
          if (c == ':') {
            if (forbidden_trailer()) return fail("framing or connection field in trailers"), std::nullopt;
            state_ = state::trailer_value;
          } else if (!is_tchar(c)) {
            return fail("invalid trailer field name"), std::nullopt;
          } else if (name_len_++ < name_.size()) {
            name_[name_len_ - 1] = static_cast<char>(lower(c));
          }
          break;
        case state::trailer_value:
          if (c == '\r') state_ = state::trailer_lf;
          else if (is_ctl(c)) return fail("invalid trailer"), std::nullopt;
          break;
        case state::trailer_lf:
          if (c != '\n') return fail("invalid trailer"), std::nullopt;
          ++i;
          if (line_empty_) {
            state_ = state::done;
            return i;
          }
          state_ = state::trailer;
          continue;
        case state::done: return i;
        case state::failed: return std::nullopt;
        default: break;  // the size line: size_line()
      }
    }
    if (state_ >= state::trailer && state_ <= state::trailer_lf) {
      if (++trailer_bytes_ > max_line_) return fail("trailers too large"), std::nullopt;
      if (keep_trailers != nullptr) keep_trailers->push_back(in[i]);
    }
    ++i;
  }
  return i;
}

}  // namespace smockron::proxy::http1
