// Listening sockets for the master's endpoints (see listener.hpp).
#include "master/io/listener.hpp"

#include "shared/base/net.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <stdexcept>

namespace smockron::master {
namespace {

[[noreturn]] void fail(const std::string& endpoint, const std::string& what) {
  throw std::runtime_error("endpoint \"" + endpoint + "\": " + what);
}

int open_listener(int family, const sockaddr* addr, socklen_t len, const std::string& endpoint, int rcvbuf) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(endpoint, std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  if (family != AF_UNIX) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Accepted connections inherit the listener's receive buffer.
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  if (::bind(fd, addr, len) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int e = errno;
    ::close(fd);
    fail(endpoint, std::strerror(e));
  }
  return fd;
}

bound_socket bind_tcp(const std::string& endpoint, const host_port& at, int rcvbuf) {
  const std::string& host = at.host;
  const std::string port = std::to_string(at.port);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (host == "*") hints.ai_family = AF_INET;  // as libzmq: "*" is every IPv4 interface
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host == "*" ? nullptr : host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    fail(endpoint, std::string("cannot resolve \"") + host + "\": " + ::gai_strerror(rc));
  }
  bound_socket b;
  try {
    b.fd = open_listener(res->ai_family, res->ai_addr, res->ai_addrlen, endpoint, rcvbuf);
  } catch (...) {
    ::freeaddrinfo(res);
    throw;
  }
  ::freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(b.fd, reinterpret_cast<sockaddr*>(&ss), &len);
  char ip[INET6_ADDRSTRLEN] = {};
  int bound_port = 0;
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    bound_port = ntohs(a->sin6_port);
    b.endpoint = "tcp://[" + std::string(ip) + "]:" + std::to_string(bound_port);
  } else {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    bound_port = ntohs(a->sin_port);
    b.endpoint = "tcp://" + std::string(ip) + ":" + std::to_string(bound_port);
  }
  return b;
}

bound_socket bind_ipc(const std::string& endpoint, std::string_view path, int rcvbuf) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) fail(endpoint, "ipc path empty or too long");
  std::memcpy(addr.sun_path, path.data(), path.size());
  bound_socket b;
  if (path.front() == '@') {
    addr.sun_path[0] = '\0';  // Linux abstract namespace, as libzmq
  } else {
    ::unlink(addr.sun_path);  // a socket file left by a previous run (libzmq does the same)
    b.unlink_path = std::string(path);
  }
  const auto len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (path.front() == '@' ? 0 : 1));
  b.fd = open_listener(AF_UNIX, reinterpret_cast<const sockaddr*>(&addr), len, endpoint, rcvbuf);
  b.endpoint = endpoint;
  return b;
}

}  // namespace

bound_socket bind_endpoint(const std::string& endpoint, int rcvbuf) {
  const auto e = parse_stream_endpoint(endpoint);
  if (!e) fail(endpoint, "expected tcp://host:port or ipc://path");
  if (e->type == stream_endpoint::kind::tcp) return bind_tcp(endpoint, e->address, rcvbuf);
  return bind_ipc(endpoint, e->path, rcvbuf);
}

}  // namespace smockron::master
