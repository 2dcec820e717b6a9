// UDP request/response loop (see udp_responder.hpp).
#include "master/io/udp_responder.hpp"

#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace smockron::master {
namespace {

// The sender as the allow lists see it (IPv4 mapped into ::ffff:0:0/96, as parse_ip does).
ip_address sender(const sockaddr_storage& from) {
  ip_address a;
  if (from.ss_family == AF_INET) {
    a.bytes[10] = a.bytes[11] = 0xff;
    std::memcpy(a.bytes.data() + 12, &reinterpret_cast<const sockaddr_in&>(from).sin_addr, 4);
  } else {
    std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in6&>(from).sin6_addr, 16);
  }
  return a;
}

}  // namespace

udp_responder::udp_responder(const host_port& listen, std::vector<cidr> allow) : allow_(std::move(allow)) {
  sockaddr_storage addr{};
  const socklen_t len = to_sockaddr(listen, addr);
  if (len == 0) throw std::runtime_error("query endpoint " + listen.to_string() + ": not an IP address");
  fd_ = ::socket(addr.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("query endpoint " + listen.to_string() + ": " + why);
  }
  // Room for bursts: a few thousand queries queue while the loop is busy elsewhere.
  const int buf = 4 << 20;
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(bound).sin_port
                                           : reinterpret_cast<const sockaddr_in6&>(bound).sin6_port);
  for (std::size_t i = 0; i < k_batch; ++i) {
    in_iov_[i] = {in_[i].data(), in_[i].size()};
    in_msg_[i].msg_hdr.msg_iov = &in_iov_[i];
    in_msg_[i].msg_hdr.msg_iovlen = 1;
  }
}

udp_responder::~udp_responder() {
  if (fd_ >= 0) ::close(fd_);
}

std::size_t udp_responder::serve(const handler& handle, std::size_t max_batches) {
  std::size_t total = 0;
  for (std::size_t batch = 0; batch < max_batches; ++batch) {
    for (std::size_t i = 0; i < k_batch; ++i) {
      in_msg_[i].msg_hdr.msg_name = &from_[i];
      in_msg_[i].msg_hdr.msg_namelen = sizeof from_[i];
      in_msg_[i].msg_hdr.msg_flags = 0;
    }
    const int n = ::recvmmsg(fd_, in_msg_.data(), k_batch, MSG_DONTWAIT, nullptr);
    if (n <= 0) break;  // EAGAIN: all read
    total += static_cast<std::size_t>(n);
    std::size_t answers = 0;
    for (int i = 0; i < n; ++i) {
      const mmsghdr& m = in_msg_[static_cast<std::size_t>(i)];
      const auto& from = from_[static_cast<std::size_t>(i)];
      if (!allow_.empty() && (from.ss_family == AF_INET || from.ss_family == AF_INET6) &&
          !allowed(allow_, sender(from))) {
        ++counts_.refused;
        continue;
      }
      if ((m.msg_hdr.msg_flags & MSG_TRUNC) || m.msg_len > query::max_datagram) {
        ++counts_.too_large;
        continue;
      }
      std::string& out = out_[answers];
      out.clear();
      if (!handle({in_[static_cast<std::size_t>(i)].data(), m.msg_len}, out)) continue;
      out_iov_[answers] = {out.data(), out.size()};
      mmsghdr& o = out_msg_[answers];
      o.msg_hdr = {};
      o.msg_hdr.msg_name = const_cast<sockaddr_storage*>(&from);
      o.msg_hdr.msg_namelen = m.msg_hdr.msg_namelen;
      o.msg_hdr.msg_iov = &out_iov_[answers];
      o.msg_hdr.msg_iovlen = 1;
      ++answers;
    }
    for (std::size_t sent = 0; sent < answers;) {
      const int k = ::sendmmsg(fd_, out_msg_.data() + sent, static_cast<unsigned>(answers - sent), MSG_DONTWAIT);
      if (k <= 0) {
        if (k < 0 && errno == EINTR) continue;
        counts_.send_failed += answers - sent;  // the socket's send buffer is full: UDP may drop, clients retry
        break;
      }
      sent += static_cast<std::size_t>(k);
    }
    if (static_cast<std::size_t>(n) < k_batch) break;
  }
  return total;
}

}  // namespace smockron::master
