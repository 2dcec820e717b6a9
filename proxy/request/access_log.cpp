// The access log (see access_log.hpp).
#include "proxy/request/access_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

namespace smockron::proxy {
namespace {

// RFC 3339 UTC with milliseconds: 2026-11-23T17:41:15.123Z.
std::string timestamp(std::int64_t time_us) {
  const std::time_t secs = static_cast<std::time_t>(time_us / 1'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const auto n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(time_us / 1000 % 1000));
  return buf;
}

std::string fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

// A value in a text line: as is when it is plain, else quoted with \" \\ and
// bytes outside printable ASCII as \xHH (a target is the client's choice).
void append_text_value(std::string& out, std::string_view v) {
  const bool plain = !v.empty() && std::all_of(v.begin(), v.end(),
                                               [](char c) { return c > 0x20 && c < 0x7f && c != '"' && c != '\\'; });
  if (plain) {
    out.append(v);
    return;
  }
  out.push_back('"');
  for (const char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out.append(hex);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

// A JSON string: controls, quote and backslash escaped; bytes that are not
// valid UTF-8 become U+FFFD, so every line parses.
void append_json_string(std::string& out, std::string_view v) {
  out.push_back('"');
  for (std::size_t i = 0; i < v.size();) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out.push_back('\\');
        out.push_back(static_cast<char>(c));
      } else if (c < 0x20 || c == 0x7f) {
        char esc[8];
        std::snprintf(esc, sizeof esc, "\\u%04x", c);
        out.append(esc);
      } else {
        out.push_back(static_cast<char>(c));
      }
      ++i;
      continue;
    }
    // The length of a well-formed UTF-8 sequence starting here, or 0.
    std::size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0 || i + len > v.size()) len = 0;
    for (std::size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(v[i + k]) & 0xc0) != 0x80) len = 0;
    }
    if (len >= 3) {  // no overlong forms, no surrogates, nothing over U+10FFFF
      const auto c1 = static_cast<unsigned char>(v[i + 1]);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) || (c == 0xf0 && c1 < 0x90) ||
          (c == 0xf4 && c1 >= 0x90)) {
        len = 0;
      }
    }
    if (len == 0) {
      out.append("\xef\xbf\xbd");
      ++i;
    } else {
      out.append(v.substr(i, len));
      i += len;
    }
  }
  out.push_back('"');
}

template <class F>
void fields(const access_entry& e, F&& field) {
  field("time", timestamp(e.time_us), true);
  field("client", e.client, true);
  field("peer", e.peer, true);
  field("method", e.method, true);
  field("target", e.target, true);
  field("protocol", e.protocol, true);
  field("status", std::to_string(e.status), false);
  field("bytes_in", std::to_string(e.bytes_in), false);
  field("bytes_out", std::to_string(e.bytes_out), false);
  field("duration_ms", fixed(e.duration_ms), false);
  field("held_ms", fixed(e.held_ms), false);
  field("decision", e.decision, true);
  if (!e.shadow.empty()) field("shadow", e.shadow, true);
  field("domain", e.domain, true);
  field("identifier", e.identifier, true);
  field("upstream", e.upstream, true);
}

int open_log(const std::string& path) {
  if (path.empty()) return 1;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open access log " + path + ": " + std::strerror(errno));
  return fd;
}

}  // namespace

std::string format_text(const access_entry& e) {
  std::string out;
  out.reserve(256);
  fields(e, [&](std::string_view name, std::string_view value, bool) {
    if (!out.empty()) out.push_back(' ');
    out.append(name).push_back('=');
    if (value.empty()) out.push_back('-');
    else append_text_value(out, value);
  });
  return out;
}

std::string format_json(const access_entry& e) {
  std::string out = "{";
  out.reserve(320);
  fields(e, [&](std::string_view name, std::string_view value, bool quoted) {
    if (out.size() > 1) out.push_back(',');
    append_json_string(out, name);
    out.push_back(':');
    if (quoted) append_json_string(out, value);
    else out.append(value);
  });
  out.push_back('}');
  return out;
}

access_log::access_log(std::string path, format f) : path_(std::move(path)), format_(f), fd_(open_log(path_)) {}

access_log::~access_log() {
  if (fd_ > 2) ::close(fd_);
}

void access_log::write(const access_entry& e) {
  std::lock_guard lock(mutex_);
  std::string line = format_ == format::json ? format_json(e) : format_text(e);
  line.push_back('\n');
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk or a closed stdout loses the line, never the request
    done += static_cast<std::size_t>(n);
  }
}

bool access_log::reopen(std::string& error) {
  std::lock_guard lock(mutex_);
  if (path_.empty()) return true;
  try {
    const int fresh = open_log(path_);
    if (fd_ > 2) ::close(fd_);
    fd_ = fresh;
    return true;
  } catch (const std::exception& ex) {
    error = ex.what();
    return false;
  }
}

bool access_log::configure(const std::string& path, format f, std::string& error) {
  std::lock_guard lock(mutex_);
  format_ = f;
  if (path == path_) return true;
  try {
    const int fresh = open_log(path);
    if (fd_ > 2) ::close(fd_);
    fd_ = fresh;
    path_ = path;
    return true;
  } catch (const std::exception& ex) {
    error = ex.what();
    return false;
  }
}

}  // namespace smockron::proxy
