// The master's ZeroMQ endpoints (see zmtp_server.hpp).
#include "master/io/zmtp_server.hpp"

#include "master/io/listener.hpp"

#include "shared/base/net.hpp"
#include "shared/protocol/zmtp.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
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
constexpr std::size_t k_buffer = 2 * zmtp_server::k_max_message;
/// Output we queue for a peer that does not read (subscriptions, PONGs).
constexpr std::size_t k_max_output = 64 * 1024;
/// Role pub: a peer's queue is written as soon as it holds this much, not
/// only at the end of the turn.
constexpr std::size_t k_flush_at = 64 * 1024;
/// A subscription frame's bytes beyond its topic, at most: the 0x01, the
/// header, and under CURVE the MESSAGE name, nonce, MAC and flags (33).
constexpr std::size_t k_frame_overhead = 48;

}  // namespace

struct zmtp_server::peer final : event_loop::source {
  explicit peer(zmtp_server& s)
      : owner(s),
        session(s.opt_.role,
                s.opt_.role == zmtp::session::role::sub
                    ? zmtp::session::limits{.max_message = k_max_message,
                                            .max_skip = k_max_skip,
                                            .max_frames = k_max_frames}
                    : zmtp::session::limits{.max_message = k_max_message, .max_pong_backlog = k_max_output},
                {.client = nullptr, .server = s.opt_.curve}),
        subs(s.opt_.max_subscriptions) {}
  void on_ready(std::uint32_t events) override { owner.peer_ready(*this, events); }
  zmtp_server& owner;
  int fd = -1;
  zmtp::session session;
  zmtp::subscription_set subs;  ///< role pub: what the peer subscribed to
  std::size_t queued = 0;       ///< role pub: messages queued since `out` was last empty
  bool unsent = false;          ///< role pub: listed in unsent_
  bool closed = false;
  bool want_output = false;  ///< EPOLLOUT registered
  std::unique_ptr<char[]> in = std::make_unique<char[]>(k_buffer);
  std::size_t len = 0;
  std::string out;
  std::chrono::steady_clock::time_point since;
  std::uint64_t id = 0;  ///< unique for the subscriber's life (never reused)
};

namespace {
// What either role can meet, and so counts (the `reason` label); a publisher
// also counts peers over max_subscriptions.
constexpr zmtp::fault k_counted[] = {zmtp::fault::greeting,   zmtp::fault::mechanism,  zmtp::fault::handshake,
                                     zmtp::fault::framing,    zmtp::fault::peer_error, zmtp::fault::timeout,
                                     zmtp::fault::peer_limit, zmtp::fault::stalled,    zmtp::fault::unknown_key,
                                     zmtp::fault::bad_box,    zmtp::fault::nonce};

std::string metric(const std::string& name, std::string_view what) {
  return "smockron_master_" + name + "_" + std::string(what);
}
}  // namespace

zmtp_server::zmtp_server(event_loop& loop, const std::string& endpoint, options o, const clock& clk,
                         metrics::registry& reg)
    : loop_(loop),
      clock_(clk),
      opt_(std::move(o)),
      connections_(reg.add_counter(metric(opt_.name, "connections_total"),
                                   "Gatekeeper connections accepted on the " + opt_.name + " endpoint")),
      refused_(reg.add_counter("smockron_master_refused_connections_total",
                               "Connections refused by an endpoint's allow list",
                               metrics::labels({{"endpoint", opt_.name}}))),
      log_(log::get("master." + opt_.name)) {
  const bool pub = opt_.role == zmtp::session::role::pub;
  if (!pub) {
    oversized_ = &reg.add_counter(metric(opt_.name, "oversized_total"),
                                  "Accounting messages over 32 KiB, skipped (the connection stays)");
  }
  const auto count = [&](zmtp::fault f) {
    faults_[static_cast<int>(f)] = &reg.add_counter(
        metric(opt_.name, "disconnects_total"),
        "Connections to the " + opt_.name + " endpoint closed for breaking the protocol or a bound, by reason",
        metrics::labels({{"reason", zmtp::to_string(f)}}));
  };
  for (const auto f : k_counted) count(f);
  if (pub) count(zmtp::fault::subscriptions);
  bound_socket b;
  try {
    b = bind_endpoint(endpoint, opt_.rcvbuf);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(opt_.name + " " + e.what());
  }
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
  reg.add_callback(metric(opt_.name, "peers"), "Gatekeepers connected to the " + opt_.name + " endpoint", "",
                   [this] { return static_cast<double>(ready_peers_.load(std::memory_order_relaxed)); });
}

zmtp_server::~zmtp_server() {
  on_closed_ = nullptr;  // shutting down: nobody to tell (and whoever was told may be gone)
  for (auto& p : peers_) close(*p);
  loop_.remove(listen_fd_);
  ::close(listen_fd_);
  if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
}

void zmtp_server::subscribe(std::string_view topic) {
  if (std::find(topics_.begin(), topics_.end(), topic) != topics_.end()) return;
  topics_.emplace_back(topic);
  subscription_bytes_ += topic.size() + k_frame_overhead;
  send_subscription(true, topic);
}

void zmtp_server::unsubscribe(std::string_view topic) {
  const auto it = std::find(topics_.begin(), topics_.end(), topic);
  if (it == topics_.end()) return;
  topics_.erase(it);
  subscription_bytes_ -= topic.size() + k_frame_overhead;
  send_subscription(false, topic);
}

// To every peer past its handshake (the others get the whole list with their READY).
void zmtp_server::send_subscription(bool subscribe, std::string_view topic) {
  std::string body(1, subscribe ? '\x01' : '\0');  // appended: GCC 12 at -O3 warns (-Wrestrict) on "\x01" + string
  body += topic;
  std::string frame;
  for (auto& p : peers_) {
    if (p->closed || !p->session.ready()) continue;
    frame.clear();
    p->session.append(frame, 0, body);  // sealed for each peer under CURVE
    send(*p, frame);
  }
}

void zmtp_server::set_curve(std::shared_ptr<const zmtp::curve::server_keys> keys) {
  if (!keys || !opt_.curve) return;
  opt_.curve = std::move(keys);
  // A handshake under way is judged by the keys in force at its READY (parse()).
  for (auto& p : peers_) {
    if (!p->closed && p->session.ready()) refuse_if_unwelcome(*p);
  }
}

std::optional<zmtp::fault> zmtp_server::unwelcome(const peer& p) const {
  if (!opt_.curve) return std::nullopt;
  if (const auto* k = p.session.peer_key(); k && !opt_.curve->allowed.contains(*k)) return zmtp::fault::unknown_key;
  if (const auto* own = p.session.own_key();
      own && std::none_of(opt_.curve->own.begin(), opt_.curve->own.end(),
                          [&](const zmtp::curve::keypair& kp) { return kp.public_key == *own; })) {
    return zmtp::fault::closed;  // made with a master key a reload retired
  }
  return std::nullopt;
}

bool zmtp_server::refuse_if_unwelcome(peer& p) {
  const auto why = unwelcome(p);
  if (!why) return false;
  if (*why == zmtp::fault::unknown_key) {
    drop(p, *why, "the gatekeeper's key " + zmtp::curve::z85_encode(*p.session.peer_key()) + " is no longer listed");
  } else {
    // Not a refusal: the gatekeeper connects again and meets the current key
    // (one that still has only the retired key is then refused, as bad_box).
    log_->info("{} connection closed: its handshake used the master key {}, no longer configured", opt_.name,
               zmtp::curve::z85_encode(*p.session.own_key()));
    close(p);
  }
  return true;
}

std::size_t zmtp_server::peers() const { return ready_peers_.load(std::memory_order_relaxed); }

void zmtp_server::peer_ready(peer& p, std::uint32_t events) {
  if (!p.closed && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(p);
  if (!p.closed && (events & EPOLLOUT)) flush(p);
}

void zmtp_server::after_turn() {
  const auto now = clock_.steady_now();
  if (accept_paused_ && now >= accept_paused_until_) {
    loop_.modify(listen_fd_, EPOLLIN, listener_);
    accept_paused_ = false;
  }
  if (now >= next_expiry_check_) {
    expire_handshakes();
    next_expiry_check_ = now + std::chrono::milliseconds(100);
  }
  flush();  // what was published during the turn (unsent_ names no peer freed below)
  // Closed in a call of the loop's turn; freed only now, when no ready event can name them.
  std::erase_if(peers_, [](const auto& p) { return p->closed; });
}

std::size_t zmtp_server::poll(std::chrono::milliseconds timeout, message_fn f) {
  on_message(std::move(f));
  const std::size_t before = delivered_;
  loop_.run_once(timeout);
  after_turn();
  return delivered_ - before;
}

void zmtp_server::accept_all() {
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
        log_->warn("{} connection refused: {} connections already (max_{}_peers)", opt_.name, peers_.size(), opt_.name);
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
    std::string hello;
    ref.session.start(hello);
    send(ref, hello);
  }
}

bool zmtp_server::admitted(const sockaddr_storage& from) {
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
    log_->warn("{} connection from {} refused: not in {}_allow ({} similar suppressed)", opt_.name, text, opt_.name,
               suppressed);
  }
  return false;
}

void zmtp_server::on_readable(peer& p) {
  const ssize_t n = ::recv(p.fd, p.in.get() + p.len, k_buffer - p.len, 0);
  if (n == 0) {
    // A ZeroMQ peer that sent its signature and left at our greeting refused
    // our mechanism (libzmq closes on a mismatch): a gatekeeper without keys
    // when we have them, or with keys when we have none.
    if (!p.session.ready() && p.len >= 10 && static_cast<unsigned char>(p.in[0]) == 0xff) {
      return drop(p, zmtp::fault::mechanism, "the peer left at our greeting: its security mechanism is not ours");
    }
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

void zmtp_server::parse(peer& p) {
  current_peer_ = p.id;  // whose messages parse() delivers
  current_gatekeeper_ = p.session.peer_gatekeeper();
  struct events final : zmtp::session_events {
    zmtp_server& self;
    peer& p;
    std::string& replies;
    bool over = false;       ///< role pub: more subscriptions than max_subscriptions
    bool unwelcome = false;  ///< READY came, but under keys a reload has since withdrawn
    events(zmtp_server& s, peer& q, std::string& r) : self(s), p(q), replies(r) {}
    void on_ready() override {
      self.ready_peers_.fetch_add(1, std::memory_order_relaxed);
      self.current_gatekeeper_ = p.session.peer_gatekeeper();  // named in the READY just read
      // Keys a reload changed since the handshake began (its HELLO was judged
      // by the keys then): nothing the peer sent is delivered.
      unwelcome = self.unwelcome(p).has_value();
      if (unwelcome) return;
      for (const auto& t : self.topics_) p.session.append(replies, 0, "\x01" + t);
    }
    void on_message(std::span<const std::string_view> frames, bool truncated) override {
      if (unwelcome) return;
      if (self.on_message_) self.on_message_(frames, truncated);
      ++self.delivered_;
    }
    void on_oversized(std::uint64_t bytes) override {
      self.oversized_->inc();
      std::uint64_t suppressed = 0;
      if (self.fault_log_.allow(self.clock_.steady_now(), suppressed)) {
        self.log_->warn("{} message of {} bytes skipped (over {}; {} similar suppressed)", self.opt_.name, bytes,
                        k_max_message, suppressed);
      }
    }
    void on_subscription(bool subscribe, std::string_view topic) override {
      if (unwelcome) return;
      if (!p.subs.apply(subscribe, topic)) over = true;
      else if (subscribe && self.on_subscription_) self.on_subscription_(topic);
    }
  };
  const bool pub = opt_.role == zmtp::session::role::pub;
  std::string replies;  // role sub: subscriptions after READY, PONGs
  events ev(*this, p, replies);
  // A publisher's PONGs go behind the messages queued for the peer: the
  // session answers no PING while that output is over k_max_output.
  const std::size_t used = p.session.feed({p.in.get(), p.len}, ev, pub ? p.out : replies);
  if (ev.unwelcome && refuse_if_unwelcome(p)) return;
  if (!replies.empty()) send(p, replies);
  else if (pub && !p.out.empty()) flush(p);
  if (const auto f = p.session.failed()) return drop(p, *f, p.session.detail());
  if (ev.over) {
    return drop(p, zmtp::fault::subscriptions,
                "more than " + std::to_string(opt_.max_subscriptions) + " subscriptions");
  }
  if (p.closed) return;
  // Keep the unfinished message (at most k_max_message plus a frame header,
  // so the next read has nearly k_max_message of room).
  if (used > 0) {
    std::memmove(p.in.get(), p.in.get() + used, p.len - used);
    p.len -= used;
  }
}

zmtp_server::published zmtp_server::publish(std::span<const std::string_view> frames) {
  published r;
  if (frames.empty()) return r;
  bool framed = false;
  for (auto& q : peers_) {
    peer& p = *q;
    if (p.closed || !p.session.ready() || !p.subs.matches(frames[0])) continue;
    if (opt_.max_queued > 0 && p.queued >= opt_.max_queued) {
      ++r.dropped;
      continue;
    }
    if (!framed) {  // framed once, for the first peer that takes it
      message_.clear();
      for (std::size_t i = 0; i < frames.size(); ++i)
        zmtp::append_frame(message_, i + 1 < frames.size() ? zmtp::flag_more : 0, frames[i]);
      framed = true;
    }
    p.session.append_framed(p.out, message_);  // sealed for each peer under CURVE
    ++p.queued;
    ++r.queued;
    if (p.out.size() >= k_flush_at) {
      flush(p);
    } else if (!p.unsent) {
      p.unsent = true;
      unsent_.push_back(&p);
    }
  }
  return r;
}

void zmtp_server::flush() {
  for (peer* p : unsent_) {
    p->unsent = false;
    if (!p->closed) flush(*p);
  }
  unsent_.clear();
}

void zmtp_server::send(peer& p, std::string_view bytes) {
  p.out.append(bytes);
  flush(p);
  // What the kernel would not take yet may be the whole subscription list
  // (one frame per domain) plus a bounded surplus (PONGs, later changes). A
  // publisher's queue is bounded by max_queued instead.
  if (!p.closed && opt_.role == zmtp::session::role::sub && p.out.size() > subscription_bytes_ + k_max_output) {
    drop(p, zmtp::fault::stalled, "peer does not read what the master sends");
  }
}

void zmtp_server::flush(peer& p) {
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
  if (p.out.empty()) p.queued = 0;
  if (p.out.empty() == !p.want_output) return;  // interest already right
  p.want_output = !p.out.empty();
  update_interest(p);
}

void zmtp_server::update_interest(peer& p) { loop_.modify(p.fd, EPOLLIN | (p.want_output ? EPOLLOUT : 0u), p); }

void zmtp_server::drop(peer& p, zmtp::fault why, std::string_view detail) {
  if (auto* c = faults_[static_cast<int>(why)]) c->inc();
  std::uint64_t suppressed = 0;
  if (fault_log_.allow(clock_.steady_now(), suppressed)) {
    if (suppressed > 0) log_->warn("{} connection closed: {} ({} similar suppressed)", opt_.name, detail, suppressed);
    else log_->warn("{} connection closed: {}", opt_.name, detail);
  }
  close(p);
}

void zmtp_server::close(peer& p) {
  if (p.closed) return;
  if (p.session.ready()) ready_peers_.fetch_sub(1, std::memory_order_relaxed);
  loop_.remove(p.fd);
  ::close(p.fd);
  p.closed = true;
  if (!on_closed_) return;
  // Its gatekeeper is gone when no other open connection names it (a scan of
  // at most max_peers, on a close only).
  std::uint64_t gone = p.session.peer_gatekeeper();
  if (gone != 0) {
    for (const auto& q : peers_) {
      if (!q->closed && q->session.peer_gatekeeper() == gone) gone = 0;
    }
  }
  on_closed_(p.id, gone);
}

void zmtp_server::expire_handshakes() {
  const auto now = clock_.steady_now();
  for (auto& p : peers_) {
    if (!p->closed && !p->session.ready() && now - p->since >= opt_.handshake_timeout) {
      drop(*p, zmtp::fault::timeout, "no handshake within " + std::to_string(opt_.handshake_timeout.count()) + " ms");
    }
  }
}

}  // namespace smockron::master
