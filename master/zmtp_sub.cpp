// The master's accounting receiver (see zmtp_sub.hpp).
#include "master/zmtp_sub.hpp"

#include "smockron/zmtp.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace smockron::master {
namespace {

/// Input buffer per peer: twice the largest message, so after the complete
/// messages are consumed a read always has at least k_max_message of room.
constexpr std::size_t k_buffer = 2 * zmtp_subscriber::k_max_message;
/// Output we queue for a peer that does not read (subscriptions, PONGs).
constexpr std::size_t k_max_output = 64 * 1024;

struct bound_socket {
  int fd = -1;
  std::string endpoint;
  std::string unlink_path;
};

[[noreturn]] void fail(const std::string& endpoint, const std::string& what) {
  throw std::runtime_error("accounting endpoint \"" + endpoint + "\": " + what);
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

bound_socket bind_tcp(const std::string& endpoint, std::string_view rest, int rcvbuf) {
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) fail(endpoint, "expected tcp://host:port");
  std::string host(rest.substr(0, colon));
  std::string port(rest.substr(colon + 1));
  if (port == "*") port = "0";
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(port) > 65535) {
    fail(endpoint, "invalid port \"" + port + "\"");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
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
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (path.front() == '@' ? 0 : 1));
  b.fd = open_listener(AF_UNIX, reinterpret_cast<const sockaddr*>(&addr), len, endpoint, rcvbuf);
  b.endpoint = endpoint;
  return b;
}

bound_socket bind_endpoint(const std::string& endpoint, int rcvbuf) {
  const std::string_view e = endpoint;
  if (e.starts_with("tcp://")) return bind_tcp(endpoint, e.substr(6), rcvbuf);
  if (e.starts_with("ipc://")) return bind_ipc(endpoint, e.substr(6), rcvbuf);
  fail(endpoint, "the master accepts accounting on tcp:// or ipc:// endpoints");
}

}  // namespace

struct zmtp_subscriber::peer {
  enum class phase : std::uint8_t { greeting, handshake, messages };
  int fd = -1;
  phase ph = phase::greeting;
  bool closed = false;
  bool want_output = false;  ///< EPOLLOUT registered
  std::unique_ptr<char[]> in = std::make_unique<char[]>(k_buffer);
  std::size_t len = 0;
  std::uint64_t skip = 0;       ///< bytes of an oversized message still to discard
  std::uint64_t skipped = 0;    ///< bytes of it discarded or due so far
  bool skip_more = false;       ///< the message being discarded has more frames
  std::string out;
  std::chrono::steady_clock::time_point since;
};

std::string_view zmtp_subscriber::to_string(fault f) {
  switch (f) {
    case fault::greeting: return "greeting";
    case fault::mechanism: return "mechanism";
    case fault::handshake: return "handshake";
    case fault::framing: return "framing";
    case fault::peer_error: return "peer_error";
    case fault::timeout: return "timeout";
    case fault::peer_limit: return "peer_limit";
    case fault::stalled: return "stalled";
  }
  return "unknown";
}

zmtp_subscriber::zmtp_subscriber(const std::string& endpoint, options o, const clock& clk, metrics::registry& reg)
    : clock_(clk),
      opt_(o),
      connections_(reg.add_counter("smockron_master_accounting_connections_total",
                                   "Gatekeeper connections accepted on the accounting endpoint")),
      oversized_(reg.add_counter("smockron_master_accounting_oversized_total",
                                 "Accounting messages over 32 KiB, skipped (the connection stays)")),
      log_(log::get("master.accounting")) {
  for (std::size_t i = 0; i < fault_count; ++i) {
    faults_[i] = &reg.add_counter("smockron_master_accounting_disconnects_total",
                                  "Accounting connections closed for breaking the protocol or a bound, by reason",
                                  metrics::labels({{"reason", to_string(static_cast<fault>(i))}}));
  }
  bound_socket b = bind_endpoint(endpoint, opt_.rcvbuf);
  listen_fd_ = b.fd;
  endpoint_ = std::move(b.endpoint);
  unlink_path_ = std::move(b.unlink_path);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    const int e = errno;
    ::close(listen_fd_);
    if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
    throw std::system_error(e, std::generic_category(), "epoll_create1");
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the listener
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  // Last: a constructor that threw must not leave a callback to a dead object.
  reg.add_callback("smockron_master_accounting_peers", "Gatekeepers connected to the accounting endpoint", "",
                   [this] { return static_cast<double>(ready_peers_.load(std::memory_order_relaxed)); });
}

zmtp_subscriber::~zmtp_subscriber() {
  for (auto& p : peers_) {
    if (!p->closed) ::close(p->fd);
  }
  ::close(epoll_fd_);
  ::close(listen_fd_);
  if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
}

void zmtp_subscriber::subscribe(std::string_view topic) {
  if (std::find(topics_.begin(), topics_.end(), topic) != topics_.end()) return;
  topics_.emplace_back(topic);
  subscription_bytes_ += topic.size() + 10;
  std::string body = "\x01" + std::string(topic);
  for (auto& p : peers_) {
    if (!p->closed && p->ph == peer::phase::messages) {
      std::string frame;
      zmtp::append_frame(frame, 0, body);
      send(*p, frame);
    }
  }
}

void zmtp_subscriber::unsubscribe(std::string_view topic) {
  const auto it = std::find(topics_.begin(), topics_.end(), topic);
  if (it == topics_.end()) return;
  topics_.erase(it);
  subscription_bytes_ -= topic.size() + 10;
  std::string body = std::string(1, '\0') + std::string(topic);
  for (auto& p : peers_) {
    if (!p->closed && p->ph == peer::phase::messages) {
      std::string frame;
      zmtp::append_frame(frame, 0, body);
      send(*p, frame);
    }
  }
}

std::size_t zmtp_subscriber::peers() const { return ready_peers_.load(std::memory_order_relaxed); }

std::size_t zmtp_subscriber::poll(std::chrono::milliseconds timeout, const message_fn& on_message) {
  std::array<epoll_event, 64> events;
  const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                             static_cast<int>(std::clamp<std::int64_t>(timeout.count(), 0, 60'000)));
  if (n < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "epoll_wait");
  std::size_t delivered = 0;
  for (int i = 0; i < n; ++i) {
    auto* p = static_cast<peer*>(events[i].data.ptr);
    if (!p) {
      accept_all();
      continue;
    }
    if (!p->closed && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(*p, on_message, delivered);
    if (!p->closed && (events[i].events & EPOLLOUT)) flush(*p);
  }
  const auto now = clock_.steady_now();
  if (accept_paused_ && now >= accept_paused_until_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    accept_paused_ = false;
  }
  if (now >= next_expiry_check_) {
    expire_handshakes();
    next_expiry_check_ = now + std::chrono::milliseconds(100);
  }
  std::erase_if(peers_, [](const auto& p) { return p->closed; });
  return delivered;
}

void zmtp_subscriber::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
      // Out of descriptors (or similar): stop listening for a moment rather
      // than spin on a listener that stays readable.
      std::uint64_t suppressed = 0;
      if (fault_log_.allow(clock_.steady_now(), suppressed)) log_->error("accept: {}", std::strerror(errno));
      epoll_event ev{};
      ev.data.ptr = nullptr;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      accept_paused_ = true;
      accept_paused_until_ = clock_.steady_now() + std::chrono::milliseconds(100);
      return;
    }
    if (peers_.size() >= opt_.max_peers) {
      ::close(fd);
      faults_[static_cast<int>(fault::peer_limit)]->inc();
      std::uint64_t suppressed = 0;
      if (fault_log_.allow(clock_.steady_now(), suppressed)) {
        log_->warn("accounting connection refused: {} connections already (max_accounting_peers)", peers_.size());
      }
      continue;
    }
    // TCP only (fail harmlessly on ipc): subscriptions leave at once, and a
    // gatekeeper whose host vanished is noticed (~90 s) and frees its place.
    const int one = 1, idle = 60, interval = 10, probes = 3;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
    if (opt_.sndbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &opt_.sndbuf, sizeof opt_.sndbuf);
    auto p = std::make_unique<peer>();
    p->fd = fd;
    p->since = clock_.steady_now();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = p.get();
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      continue;
    }
    connections_.inc();
    peer& ref = *p;
    peers_.push_back(std::move(p));
    // Greeting and READY at once: the NULL mechanism needs nothing from the
    // peer first, and a libzmq peer reads exactly its greeting before READY.
    static const std::string hello = std::string(zmtp::greeting()) + zmtp::ready("SUB");
    send(ref, hello);
  }
}

void zmtp_subscriber::on_readable(peer& p, const message_fn& on_message, std::size_t& delivered) {
  const ssize_t n = ::recv(p.fd, p.in.get() + p.len, k_buffer - p.len, 0);
  if (n == 0) {
    close(p);
    return;
  }
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) close(p);
    return;
  }
  p.len += static_cast<std::size_t>(n);
  parse(p, on_message, delivered);
}

bool zmtp_subscriber::parse(peer& p, const message_fn& on_message, std::size_t& delivered) {
  const char* in = p.in.get();
  std::size_t pos = 0;
  if (p.ph == peer::phase::greeting) {
    std::string detail;
    switch (zmtp::check_greeting({in, p.len}, detail)) {
      case zmtp::greeting_status::need_more: return true;
      case zmtp::greeting_status::ok: break;
      case zmtp::greeting_status::mechanism: drop(p, fault::mechanism, detail); return false;
      default: drop(p, fault::greeting, detail); return false;
    }
    pos = zmtp::greeting_size;
    p.ph = peer::phase::handshake;
  }
  std::array<std::string_view, k_max_frames> frames;
  std::size_t count = 0;
  bool truncated = false;
  std::size_t message_start = pos;
  for (;;) {
    if (p.skip > 0) {  // discarding an oversized message by length
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(p.skip, p.len - pos));
      pos += n;
      p.skip -= n;
      message_start = pos;
      if (p.skip > 0) break;  // the rest has not arrived yet
      continue;
    }
    zmtp::frame f;
    // The bound is on the whole message, so a message of many frames is capped too.
    const auto st = zmtp::next_frame({in + pos, p.len - pos}, k_max_message - (pos - message_start), f);
    if (st == zmtp::frame_status::need_more) break;
    if (st == zmtp::frame_status::reserved_flags) {
      drop(p, fault::framing, "reserved flag bits set");
      return false;
    }
    const bool over = st == zmtp::frame_status::too_large || pos - message_start + f.size > k_max_message;
    // A message over the bound, and every later frame of it, is consumed by
    // length and skipped on its own; commands between its frames are served.
    if ((over || p.skip_more) && !(f.flags & zmtp::flag_command)) {
      if (p.ph != peer::phase::messages) {
        drop(p, fault::handshake, "message before READY");
        return false;
      }
      if (!p.skip_more) p.skipped = pos - message_start;  // its frames already here count too
      p.skipped += f.size;
      if (p.skipped > k_max_skip) {
        drop(p, fault::framing, "message over " + std::to_string(k_max_skip) + " bytes");
        return false;
      }
      p.skip = f.size;
      p.skip_more = f.flags & zmtp::flag_more;
      count = 0;
      truncated = false;
      if (!p.skip_more) {
        oversized_.inc();
        std::uint64_t suppressed = 0;
        if (fault_log_.allow(clock_.steady_now(), suppressed)) {
          log_->warn("accounting message of {} bytes skipped (over {}; {} similar suppressed)", p.skipped,
                     k_max_message, suppressed);
        }
      }
      continue;
    }
    if (over) {
      drop(p, fault::framing, "command over " + std::to_string(k_max_message) + " bytes");
      return false;
    }
    const std::string_view body = f.body;
    const std::uint8_t flags = f.flags;
    pos += f.size;
    if (flags & zmtp::flag_command) {
      if (flags & zmtp::flag_more) {
        drop(p, fault::framing, "command frame with MORE set");
        return false;
      }
      if (!handle_command(p, body)) return false;
      // libzmq sends a heartbeat PING whenever it is due, even between the
      // frames of a message. Then the message stays unfinished here and, if
      // it is cut by the end of the buffer, the PING is read (and answered)
      // again next time: a second PONG is harmless.
      if (count == 0) message_start = pos;
      continue;
    }
    if (p.ph != peer::phase::messages) {
      drop(p, fault::handshake, "message before READY");
      return false;
    }
    if (count < frames.size()) frames[count++] = body;
    else truncated = true;
    if (!(flags & zmtp::flag_more)) {
      on_message({frames.data(), count}, truncated);
      ++delivered;
      count = 0;
      truncated = false;
      message_start = pos;
    }
  }
  // Keep the unfinished message (at most k_max_message plus a frame header,
  // so the next read has nearly k_max_message of room).
  if (message_start > 0) {
    std::memmove(p.in.get(), in + message_start, p.len - message_start);
    p.len -= message_start;
  }
  return true;
}

bool zmtp_subscriber::handle_command(peer& p, std::string_view body) {
  const auto cmd = zmtp::split_command(body);
  if (!cmd) {
    drop(p, fault::framing, "malformed command");
    return false;
  }
  const auto [name, rest] = *cmd;
  if (name == "READY") {
    if (p.ph != peer::phase::handshake) {
      drop(p, fault::handshake, "second READY");
      return false;
    }
    const auto socket_type = zmtp::ready_socket_type(rest);
    if (!socket_type) {
      drop(p, fault::handshake, "malformed READY properties");
      return false;
    }
    if (*socket_type != "PUB" && *socket_type != "XPUB") {
      drop(p, fault::handshake, "peer socket type \"" + zmtp::printable(*socket_type) + "\" cannot publish to a SUB");
      return false;
    }
    p.ph = peer::phase::messages;
    ready_peers_.fetch_add(1, std::memory_order_relaxed);
    std::string subs;
    for (const auto& t : topics_) zmtp::append_frame(subs, 0, "\x01" + t);
    if (!subs.empty()) send(p, subs);
    return !p.closed;
  }
  if (name == "ERROR") {
    const std::size_t n = rest.empty() ? 0 : std::min<std::size_t>(static_cast<unsigned char>(rest[0]), rest.size() - 1);
    drop(p, fault::peer_error, "peer sent ERROR \"" + zmtp::printable(rest.substr(rest.empty() ? 0 : 1, n)) + "\"");
    return false;
  }
  if (p.ph != peer::phase::messages) {
    drop(p, fault::handshake, "unexpected command \"" + zmtp::printable(name) + "\" before READY");
    return false;
  }
  if (name == "PING") {
    send(p, zmtp::pong_for(rest));
    return !p.closed;
  }
  return true;  // PONG and commands a publisher has no reason to send: ignored
}

void zmtp_subscriber::send(peer& p, std::string_view bytes) {
  p.out.append(bytes);
  flush(p);
  // What the kernel would not take yet may be the whole subscription list
  // (one frame per domain) plus a bounded surplus (PONGs, later changes).
  if (!p.closed && p.out.size() > subscription_bytes_ + k_max_output) {
    drop(p, fault::stalled, "peer does not read what the master sends");
  }
}

void zmtp_subscriber::flush(peer& p) {
  while (!p.out.empty()) {
    const ssize_t n = ::send(p.fd, p.out.data(), p.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        close(p);
        return;
      }
      break;
    }
    p.out.erase(0, static_cast<std::size_t>(n));
  }
  if (p.out.empty() == !p.want_output) return;  // interest already right
  p.want_output = !p.out.empty();
  update_interest(p);
}

void zmtp_subscriber::update_interest(peer& p) {
  epoll_event ev{};
  ev.events = EPOLLIN | (p.want_output ? EPOLLOUT : 0u);
  ev.data.ptr = &p;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, p.fd, &ev);
}

void zmtp_subscriber::drop(peer& p, fault why, std::string_view detail) {
  faults_[static_cast<int>(why)]->inc();
  std::uint64_t suppressed = 0;
  if (fault_log_.allow(clock_.steady_now(), suppressed)) {
    if (suppressed > 0) log_->warn("accounting connection closed: {} ({} similar suppressed)", detail, suppressed);
    else log_->warn("accounting connection closed: {}", detail);
  }
  close(p);
}

void zmtp_subscriber::close(peer& p) {
  if (p.closed) return;
  if (p.ph == peer::phase::messages) ready_peers_.fetch_sub(1, std::memory_order_relaxed);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.fd, nullptr);
  ::close(p.fd);
  p.closed = true;
}

void zmtp_subscriber::expire_handshakes() {
  const auto now = clock_.steady_now();
  for (auto& p : peers_) {
    if (!p->closed && p->ph != peer::phase::messages && now - p->since >= opt_.handshake_timeout) {
      drop(*p, fault::timeout, "no handshake within " + std::to_string(opt_.handshake_timeout.count()) + " ms");
    }
  }
}

}  // namespace smockron::master
