// A UDP request/response loop: every datagram waiting is read in batches
// (recvmmsg), each is answered or not by a handler, and the answers go out in
// one batch (sendmmsg), all on the caller's thread, without blocking. The
// master's query endpoint runs on it (service.cpp, answered by ingest), and so
// does the benchmark's bare echo server, so that the two compare like with like.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "master/core/query.hpp"
#include "shared/base/net.hpp"

namespace smockron::master {

class udp_responder {
public:
  static constexpr std::size_t k_batch = 32;

  /// Binds `listen` (an IP literal; port 0: any, see port()). Throws
  /// std::runtime_error naming the address when it cannot.
  udp_responder(const host_port& listen, std::vector<cidr> allow);
  udp_responder(const udp_responder&) = delete;
  udp_responder& operator=(const udp_responder&) = delete;
  ~udp_responder();

  int fd() const { return fd_; }
  std::uint16_t port() const { return port_; }

  /// What serve() saw that got no answer from the handler's point of view.
  struct counts {
    std::uint64_t refused = 0;      ///< senders outside the allow list
    std::uint64_t too_large = 0;    ///< datagrams over query::max_datagram
    std::uint64_t send_failed = 0;  ///< answers the socket did not take (its buffer full)
  };
  const counts& seen() const { return counts_; }

  /// `handle(request, answer)`: true to send `answer` (cleared before each call) back to the sender.
  using handler = std::function<bool(std::string_view request, std::string& answer)>;
  /// Reads and answers every datagram waiting (at most `max_batches` batches,
  /// so other work on the thread gets a turn). Returns the datagrams read.
  std::size_t serve(const handler& handle, std::size_t max_batches = 16);

private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::vector<cidr> allow_;
  counts counts_;
  // One batch: datagrams in, answers out (recvmmsg / sendmmsg).
  std::array<std::array<char, query::max_datagram + 1>, k_batch> in_{};
  std::array<std::string, k_batch> out_;
  std::array<sockaddr_storage, k_batch> from_{};
  std::array<iovec, k_batch> in_iov_{}, out_iov_{};
  std::array<mmsghdr, k_batch> in_msg_{}, out_msg_{};
};

}  // namespace smockron::master
