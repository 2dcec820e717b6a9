// The UDP query protocol (see query.hpp).
#include "master/core/query.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace smockron::query {
namespace {

constexpr std::size_t k_max_domain = 255;
constexpr std::size_t k_max_identifier = 1024;
constexpr std::size_t k_max_id_digits = 20;  // std::uint64_t's; larger values are refused by from_chars

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// No control bytes (NUL, CR, LF, DEL...): what could not have come from one line of text.
bool printable(std::string_view s) {
  return std::none_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

}  // namespace

std::string_view to_string(ignored i) {
  switch (i) {
    case ignored::malformed: return "malformed";
    case ignored::unknown_command: return "unknown_command";
    case ignored::too_large: return "too_large";
  }
  return "malformed";
}

parse_result parse(std::string_view d) {
  parse_result out;
  if (d.size() > max_datagram) {
    out.why = ignored::too_large;
    return out;
  }
  if (d.ends_with("\r\n")) d.remove_suffix(2);
  else if (d.ends_with('\n')) d.remove_suffix(1);
  request r;
  std::size_t space = d.find(' ');
  if (all_digits(d.substr(0, space))) {
    // An ID, which needs a command after it.
    const std::string_view digits = d.substr(0, space);
    std::uint64_t id = 0;
    if (space == std::string_view::npos || digits.size() > k_max_id_digits ||
        std::from_chars(digits.data(), digits.data() + digits.size(), id).ec != std::errc()) {
      return out;
    }
    r.id = id;
    d.remove_prefix(space + 1);
    space = d.find(' ');
  }
  const std::string_view cmd = d.substr(0, space);
  const std::string_view args = space == std::string_view::npos ? std::string_view() : d.substr(space + 1);
  if (cmd == "get_size") {
    if (space != std::string_view::npos) return out;
    r.cmd = command::get_size;
    out.req = r;
    return out;
  }
  if (cmd == "over_limit") r.cmd = command::over_limit;
  else if (cmd == "get_stats") r.cmd = command::get_stats;
  else {
    out.why = printable(cmd) && !cmd.empty() ? ignored::unknown_command : ignored::malformed;
    return out;
  }
  const std::size_t split = args.find(' ');
  if (split == std::string_view::npos) return out;
  r.domain = args.substr(0, split);
  r.identifier = args.substr(split + 1);
  if (r.domain.empty() || r.domain.size() > k_max_domain || r.identifier.empty() ||
      r.identifier.size() > k_max_identifier || !printable(r.domain) || !printable(r.identifier)) {
    return out;
  }
  out.req = r;
  return out;
}

namespace {

void append_number(std::string& out, std::uint64_t v) {
  char buf[24];
  out.append(buf, static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf));
}

void append_prefix(std::string& out, const std::optional<std::uint64_t>& id) {
  if (!id) return;
  append_number(out, *id);
  out += ' ';
}

// "%.1f" (round to nearest, as printf does), without printf's parsing.
void append_one_decimal(std::string& out, double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 1);
  out.append(buf, static_cast<std::size_t>(r.ptr - buf));
}

}  // namespace

void append(std::string& out, const std::optional<std::uint64_t>& id, const over_limit_answer& a) {
  append_prefix(out, id);
  out += a.over ? "ok Y " : "ok N ";
  append_one_decimal(out, a.rate);
  out += ' ';
  append_one_decimal(out, a.limit);
  out += ' ';
  if (a.period_s < 0) out += '-';
  append_number(out, static_cast<std::uint64_t>(a.period_s < 0 ? -a.period_s : a.period_s));
}

void append(std::string& out, const std::optional<std::uint64_t>& id, const stats_answer& s, std::string_view domain,
            std::string_view identifier) {
  append_prefix(out, id);
  out += "n_req=";
  append_number(out, s.n_req);
  out += " n_over=";
  append_number(out, s.n_over);
  out += " last_max_rate=";
  append_number(out, s.last_max_rate);
  out += " key=";
  out += domain;
  out += ' ';
  out += identifier;
}

void append_size(std::string& out, const std::optional<std::uint64_t>& id, std::uint64_t bytes, std::uint64_t keys) {
  append_prefix(out, id);
  out += "size=";
  append_number(out, bytes);
  out += " keys=";
  append_number(out, keys);
}

std::string format(const std::optional<std::uint64_t>& id, const over_limit_answer& a) {
  std::string out;
  append(out, id, a);
  return out;
}

std::string format(const std::optional<std::uint64_t>& id, const stats_answer& s, std::string_view domain,
                   std::string_view identifier) {
  std::string out;
  append(out, id, s, domain, identifier);
  return out;
}

std::string format_size(const std::optional<std::uint64_t>& id, std::uint64_t bytes, std::uint64_t keys) {
  std::string out;
  append_size(out, id, bytes, keys);
  return out;
}

response split_response(std::string_view d) {
  response r;
  if (d.ends_with('\n')) d.remove_suffix(1);
  const std::size_t space = d.find(' ');
  const std::string_view first = d.substr(0, space);
  std::uint64_t id = 0;
  if (space != std::string_view::npos && all_digits(first) && first.size() <= k_max_id_digits &&
      std::from_chars(first.data(), first.data() + first.size(), id).ec == std::errc()) {
    r.id = id;
    d.remove_prefix(space + 1);
  }
  r.body = d;
  return r;
}

client::client(const host_port& server) {
  sockaddr_storage addr{};
  const socklen_t len = to_sockaddr(server, addr);
  if (len == 0) throw std::runtime_error("query server " + server.to_string() + ": not an IP address");
  fd_ = ::socket(addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  // connect(): only the server's datagrams arrive, and send() needs no address.
  if (fd_ < 0 || ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("query server " + server.to_string() + ": " + why);
  }
}

client::~client() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::string> client::ask(std::string_view request, int timeout_ms) {
  const std::uint64_t id = next_id_++;
  const std::string datagram = std::to_string(id) + " " + std::string(request);
  if (::send(fd_, datagram.data(), datagram.size(), 0) < 0) return std::nullopt;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::array<char, max_datagram> buf;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
    const auto n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::nullopt;  // e.g. ECONNREFUSED: nothing listens there
    }
    const response r = split_response({buf.data(), static_cast<std::size_t>(n)});
    if (r.id == id) return std::string(r.body);  // others answer requests that timed out earlier
  }
}

}  // namespace smockron::query
