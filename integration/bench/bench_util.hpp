// Small helpers the C++ benchmarks share.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace smockron::bench {

/// Runs the calling thread (and what it forks) on `cpu` only.
inline void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

/// A port free on 127.0.0.1 for `type` (SOCK_STREAM or SOCK_DGRAM) a moment ago.
inline int free_port(int type = SOCK_STREAM) {
  const int fd = ::socket(AF_INET, type, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Blocking HTTP GET on 127.0.0.1; returns the body ("" on failure).
inline std::string http_get(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

/// Sum of every sample of a metric family (all label sets), or of the samples
/// whose line starts with `name` when it holds labels (`x{domain="a"`).
inline double metric_sum(const std::string& text, const std::string& name) {
  double sum = 0;
  std::size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || text[pos - 1] == '\n';
    const char next = text[pos + name.size()];
    const auto eol = text.find('\n', pos);
    if (line_start && (next == '{' || next == ' ' || name.find('{') != std::string::npos)) {
      const auto space = text.rfind(' ', eol);
      sum += std::atof(text.substr(space + 1, eol - space - 1).c_str());
    }
    pos = eol == std::string::npos ? text.size() : eol;
  }
  return sum;
}

}  // namespace smockron::bench
