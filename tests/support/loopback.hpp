// A TCP socket of a test on 127.0.0.1, at a port the kernel chose: fake
// servers (a Redis node, an OTLP collector, a ZMTP peer) listen on it, and a
// socket bound but not listening is a port whose connects are refused.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace smockron::test_support {

/// The socket (its port in `port`), listening unless `listen` is false; -1 on failure.
inline int bind_loopback(std::uint16_t& port, bool listen = true) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || (listen && ::listen(fd, 8) != 0) ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  port = ntohs(a.sin_port);
  return fd;
}

}  // namespace smockron::test_support
