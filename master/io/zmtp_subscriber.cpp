// The master's accounting receiver (see zmtp_subscriber.hpp).
#include "master/io/zmtp_subscriber.hpp"

#include "shared/base/net.hpp"
#include "shared/protocol/zmtp.hpp"

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

bound_socket bind_endpoint(const std::string& endpoint, int rcvbuf) {
  const auto e = parse_stream_endpoint(endpoint);
  if (!e) fail(endpoint, "expected tcp://host:port or ipc://path");
  if (e->type == stream_endpoint::kind::tcp) return bind_tcp(endpoint, e->address, rcvbuf);
  return bind_ipc(endpoint, e->path, rcvbuf);
}

}  // namespace

struct zmtp_subscriber::peer final : event_loop::source {
  explicit peer(zmtp_subscriber& s) : owner(s) {}
  void on_ready(std::uint32_t events) override { owner.peer_ready(*this, events); }
  zmtp_subscriber& owner;
  int fd = -1;
  zmtp::session session{zmtp::session::role::sub,
                        {.max_message = k_max_message, .max_skip = k_max_skip, .max_frames = k_max_frames}};
  bool closed = false;
  bool want_output = false;  ///< EPOLLOUT registered
  std::unique_ptr<char[]> in = std::make_unique<char[]>(k_buffer);
  std::size_t len = 0;
  std::string out;
  std::chrono::steady_clock::time_point since;
  std::uint64_t id = 0;  ///< unique for the subscriber's life (never reused)
};

namespace {
// What a subscriber can meet, and so counts (the `reason` label).
constexpr zmtp::fault k_counted[] = {zmtp::fault::greeting,   zmtp::fault::mechanism,  zmtp::fault::handshake,
                                     zmtp::fault::framing,    zmtp::fault::peer_error, zmtp::fault::timeout,
                                     zmtp::fault::peer_limit, zmtp::fault::stalled};
}  // namespace

zmtp_subscriber::zmtp_subscriber(event_loop& loop, const std::string& endpoint, options o, const clock& clk,
                                 metrics::registry& reg)
    : loop_(loop),
      clock_(clk),
      opt_(o),
      connections_(reg.add_counter("smockron_master_accounting_connections_total",
                                   "Gatekeeper connections accepted on the accounting endpoint")),
      refused_(reg.add_counter("smockron_master_refused_connections_total",
                               "Connections refused by an endpoint's allow list",
                               metrics::labels({{"endpoint", "accounting"}}))),
      oversized_(reg.add_counter("smockron_master_accounting_oversized_total",
                                 "Accounting messages over 32 KiB, skipped (the connection stays)")),
      log_(log::get("master.accounting")) {
  for (const auto f : k_counted) {
    faults_[static_cast<int>(f)] =
        &reg.add_counter("smockron_master_accounting_disconnects_total",
                         "Accounting connections closed for breaking the protocol or a bound, by reason",
                         metrics::labels({{"reason", zmtp::to_string(f)}}));
  }
  bound_socket b = bind_endpoint(endpoint, opt_.rcvbuf);
  listen_fd_ = b.fd;
  endpoint_ = std::move(b.endpoint);
  unlink_path_ = std::move(b.unlink_path);
  if (!loop_.add(listen_fd_, EPOLLIN, listener_)) {
    const int e = errno;
    ::close(listen_fd_);
    if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
    throw std::system_error(e, std::generic_category(), "epoll_ctl");
  }
  // Last: a constructor that threw must not leave a callback to a dead object.
  reg.add_callback("smockron_master_accounting_peers", "Gatekeepers connected to the accounting endpoint", "",
                   [this] { return static_cast<double>(ready_peers_.load(std::memory_order_relaxed)); });
}

zmtp_subscriber::~zmtp_subscriber() {
  on_closed_ = nullptr;  // shutting down: nobody to tell (and whoever was told may be gone)
  for (auto& p : peers_) close(*p);
  loop_.remove(listen_fd_);
  ::close(listen_fd_);
  if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
}

void zmtp_subscriber::subscribe(std::string_view topic) {
  if (std::find(topics_.begin(), topics_.end(), topic) != topics_.end()) return;
  topics_.emplace_back(topic);
  subscription_bytes_ += topic.size() + 10;
  send_subscription(true, topic);
}

void zmtp_subscriber::unsubscribe(std::string_view topic) {
  const auto it = std::find(topics_.begin(), topics_.end(), topic);
  if (it == topics_.end()) return;
  topics_.erase(it);
  subscription_bytes_ -= topic.size() + 10;
  send_subscription(false, topic);
}

// To every peer past its handshake (the others get the whole list with their READY).
void zmtp_subscriber::send_subscription(bool subscribe, std::string_view topic) {
  std::string body(1, subscribe ? '\x01' : '\0');  // appended: GCC 12 at -O3 warns (-Wrestrict) on "\x01" + string
  body += topic;
  std::string frame;
  zmtp::append_frame(frame, 0, body);
  for (auto& p : peers_) {
    if (!p->closed && p->session.ready()) send(*p, frame);
  }
}

std::size_t zmtp_subscriber::peers() const { return ready_peers_.load(std::memory_order_relaxed); }

void zmtp_subscriber::peer_ready(peer& p, std::uint32_t events) {
  if (!p.closed && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(p);
  if (!p.closed && (events & EPOLLOUT)) flush(p);
}

void zmtp_subscriber::after_turn() {
  const auto now = clock_.steady_now();
  if (accept_paused_ && now >= accept_paused_until_) {
    loop_.modify(listen_fd_, EPOLLIN, listener_);
    accept_paused_ = false;
  }
  if (now >= next_expiry_check_) {
    expire_handshakes();
    next_expiry_check_ = now + std::chrono::milliseconds(100);
  }
  // Closed in a call of the loop's turn; freed only now, when no ready event can name them.
  std::erase_if(peers_, [](const auto& p) { return p->closed; });
}

std::size_t zmtp_subscriber::poll(std::chrono::milliseconds timeout, message_fn f) {
  on_message(std::move(f));
  const std::size_t before = delivered_;
  loop_.run_once(timeout);
  after_turn();
  return delivered_ - before;
}

void zmtp_subscriber::accept_all() {
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
      // Out of descriptors (or similar): stop listening for a moment rather
      // than spin on a listener that stays readable.
      std::uint64_t suppressed = 0;
      if (fault_log_.allow(clock_.steady_now(), suppressed)) log_->error("accept: {}", std::strerror(errno));
      loop_.modify(listen_fd_, 0, listener_);
      accept_paused_ = true;
      accept_paused_until_ = clock_.steady_now() + std::chrono::milliseconds(100);
      return;
    }
    if (!admitted(from)) {
      ::close(fd);
      continue;
    }
    if (peers_.size() >= opt_.max_peers) {
      ::close(fd);
      faults_[static_cast<int>(zmtp::fault::peer_limit)]->inc();
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
    auto p = std::make_unique<peer>(*this);
    p->id = ++last_peer_id_;
    p->fd = fd;
    p->since = clock_.steady_now();
    if (!loop_.add(fd, EPOLLIN, *p)) {
      ::close(fd);
      continue;
    }
    connections_.inc();
    peer& ref = *p;
    peers_.push_back(std::move(p));
    send(ref, zmtp::session::hello(zmtp::session::role::sub));
  }
}

bool zmtp_subscriber::admitted(const sockaddr_storage& from) {
  if (opt_.allow.empty() || (from.ss_family != AF_INET && from.ss_family != AF_INET6)) return true;  // ipc: local
  char text[INET6_ADDRSTRLEN] = {};
  if (from.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(from).sin_addr, text, sizeof text);
  } else {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(from).sin6_addr, text, sizeof text);
  }
  if (const auto a = parse_ip(text); a && allowed(opt_.allow, *a)) return true;
  refused_.inc();
  std::uint64_t suppressed = 0;
  if (fault_log_.allow(clock_.steady_now(), suppressed)) {
    log_->warn("accounting connection from {} refused: not in accounting_allow ({} similar suppressed)", text,
               suppressed);
  }
  return false;
}

void zmtp_subscriber::on_readable(peer& p) {
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
  parse(p);
}

void zmtp_subscriber::parse(peer& p) {
  current_peer_ = p.id;  // whose messages parse() delivers
  struct events final : zmtp::session_events {
    zmtp_subscriber& self;
    std::string& replies;
    events(zmtp_subscriber& s, std::string& r) : self(s), replies(r) {}
    void on_ready() override {
      self.ready_peers_.fetch_add(1, std::memory_order_relaxed);
      for (const auto& t : self.topics_) zmtp::append_frame(replies, 0, "\x01" + t);
    }
    void on_message(std::span<const std::string_view> frames, bool truncated) override {
      if (self.on_message_) self.on_message_(frames, truncated);
      ++self.delivered_;
    }
    void on_oversized(std::uint64_t bytes) override {
      self.oversized_.inc();
      std::uint64_t suppressed = 0;
      if (self.fault_log_.allow(self.clock_.steady_now(), suppressed)) {
        self.log_->warn("accounting message of {} bytes skipped (over {}; {} similar suppressed)", bytes, k_max_message,
                        suppressed);
      }
    }
  };
  std::string replies;  // subscriptions after READY, PONGs
  events ev(*this, replies);
  const std::size_t used = p.session.feed({p.in.get(), p.len}, ev, replies);
  if (!replies.empty()) send(p, replies);
  if (const auto f = p.session.failed()) return drop(p, *f, p.session.detail());
  if (p.closed) return;
  // Keep the unfinished message (at most k_max_message plus a frame header,
  // so the next read has nearly k_max_message of room).
  if (used > 0) {
    std::memmove(p.in.get(), p.in.get() + used, p.len - used);
    p.len -= used;
  }
}

void zmtp_subscriber::send(peer& p, std::string_view bytes) {
  p.out.append(bytes);
  flush(p);
  // What the kernel would not take yet may be the whole subscription list
  // (one frame per domain) plus a bounded surplus (PONGs, later changes).
  if (!p.closed && p.out.size() > subscription_bytes_ + k_max_output) {
    drop(p, zmtp::fault::stalled, "peer does not read what the master sends");
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

void zmtp_subscriber::update_interest(peer& p) { loop_.modify(p.fd, EPOLLIN | (p.want_output ? EPOLLOUT : 0u), p); }

void zmtp_subscriber::drop(peer& p, zmtp::fault why, std::string_view detail) {
  if (auto* c = faults_[static_cast<int>(why)]) c->inc();
  std::uint64_t suppressed = 0;
  if (fault_log_.allow(clock_.steady_now(), suppressed)) {
    if (suppressed > 0) log_->warn("accounting connection closed: {} ({} similar suppressed)", detail, suppressed);
    else log_->warn("accounting connection closed: {}", detail);
  }
  close(p);
}

void zmtp_subscriber::close(peer& p) {
  if (p.closed) return;
  if (p.session.ready()) ready_peers_.fetch_sub(1, std::memory_order_relaxed);
  loop_.remove(p.fd);
  ::close(p.fd);
  p.closed = true;
  if (on_closed_) on_closed_(p.id);
}

void zmtp_subscriber::expire_handshakes() {
  const auto now = clock_.steady_now();
  for (auto& p : peers_) {
    if (!p->closed && !p->session.ready() && now - p->since >= opt_.handshake_timeout) {
      drop(*p, zmtp::fault::timeout, "no handshake within " + std::to_string(opt_.handshake_timeout.count()) + " ms");
    }
  }
}

}  // namespace smockron::master
