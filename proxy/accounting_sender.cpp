// The proxy's accounting sender (see accounting_sender.hpp).
#include "proxy/accounting_sender.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstring>

#include "smockron/zmtp.hpp"

namespace smockron::proxy {

namespace asio = boost::asio;
using generic_stream = asio::generic::stream_protocol;

namespace {
/// Largest frame a subscriber may send us (a subscription is a topic: small).
constexpr std::size_t k_max_in_frame = 64 * 1024;
/// Output beyond which a PING is not answered (the master is not reading).
constexpr std::size_t k_max_pong_backlog = 1024 * 1024;
}  // namespace

struct accounting_sender::link {
  enum class state : std::uint8_t { idle, connecting, handshake, ready };
  link(asio::io_context& ioc, std::string ep) : endpoint(std::move(ep)), socket(ioc), retry(ioc), resolver(ioc) {}

  std::string endpoint;
  generic_stream::socket socket;
  asio::steady_timer retry;
  asio::ip::tcp::resolver resolver;
  state st = state::idle;
  std::uint64_t generation = 0;  ///< bumped on every failure: late completions of the old connection are ignored
  bool greeted = false;
  std::array<char, 4096> chunk;
  std::string in;                ///< received and not yet parsed
  string_map<std::uint32_t> subs;  ///< topic -> how many times subscribed (ZeroMQ counts them)
  std::size_t open_prefixes = 0;   ///< subscriptions not ending in \0: a topic may match them by prefix
  std::uint64_t failures = 0;      ///< in a row, for the log
  std::string pending, writing;  ///< queued; being written
  std::size_t pending_msgs = 0, writing_msgs = 0;
  bool write_busy = false;
};

accounting_sender::counters::counters(metrics::registry& r)
    : sent(r.add_counter("smockron_proxy_accounting_messages_total", "Accounting messages published")),
      dropped(r.add_counter("smockron_proxy_accounting_dropped_total",
                            "Accounting messages a master's full queue refused, or lost with its connection; "
                            "the request still passed")),
      unsent(r.add_counter("smockron_proxy_accounting_unsent_total",
                           "Accounting messages no connected master was subscribed to (master down or "
                           "just reconnected); the request still passed")),
      lost(r.add_counter("smockron_proxy_accounting_lost_total",
                         "Accounting messages queued for a master whose connection broke before they "
                         "were written (once per master)")) {}

accounting_sender::accounting_sender(asio::io_context& ioc, const std::vector<std::string>& endpoints,
                                     std::size_t queue_limit, counters& c)
    : ioc_(ioc),
      queue_limit_(queue_limit),
      counters_(c),
      flush_timer_(ioc),
      sample_rng_(std::random_device{}()),
      log_(log::get("proxy.accounting")) {
  bytes_.reserve(batch * 96);
  batch_.reserve(batch);
  for (const auto& e : endpoints) {
    links_.push_back(std::make_unique<link>(ioc_, e));
    connect(*links_.back());
  }
}

accounting_sender::~accounting_sender() { counters_.unsent.inc(batch_.size()); }

void accounting_sender::account(const wire::accounting& m, const policy& p) {
  if (m.state == wire::status::rejected && p.rejected_sample < 1.0 &&
      std::uniform_real_distribution<double>(0, 1)(sample_rng_) >= p.rejected_sample) {
    return;
  }
  const bool first = publish(m);
  if (m.state == wire::status::delayed) {
    flush();
  } else if (first) {
    flush_timer_.expires_after(p.flush_after);
    flush_timer_.async_wait([this](const boost::system::error_code& ec) {
      // Re-arming cancels a wait: that batch already left with an immediate flush.
      if (ec != asio::error::operation_aborted) flush();
    });
  }
}

bool accounting_sender::publish(const wire::accounting& m) {
  auto enc = wire::encode(m, scratch_);
  if (!enc) {
    counters_.dropped.inc();
    return false;
  }
  if (batch_.size() >= batch) flush();
  const bool was_empty = batch_.empty();
  queued q{};
  q.offset = static_cast<std::uint32_t>(bytes_.size());
  for (std::size_t i = 0; i < enc->count; ++i) {
    const std::string_view f = enc->frame[i];
    zmtp::append_frame(bytes_, i + 1 < enc->count ? zmtp::flag_more : 0, f);
    if (i == 0) {
      q.topic_size = static_cast<std::uint32_t>(f.size());
      q.topic_offset = static_cast<std::uint32_t>(bytes_.size() - f.size());
    }
  }
  q.size = static_cast<std::uint32_t>(bytes_.size() - q.offset);
  batch_.push_back(q);
  return was_empty;
}

void accounting_sender::flush() {
  if (batch_.empty()) return;
  for (const queued& q : batch_) {
    const std::string_view topic(bytes_.data() + q.topic_offset, q.topic_size);
    const std::string_view message(bytes_.data() + q.offset, q.size);
    bool taken = false, refused = false;
    for (auto& l : links_) {
      if (l->st != link::state::ready || !wants(*l, topic)) continue;
      if (queue_limit_ > 0 && l->pending_msgs + l->writing_msgs >= queue_limit_) {
        refused = true;
        continue;
      }
      l->pending += message;
      ++l->pending_msgs;
      taken = true;
    }
    if (refused) counters_.dropped.inc();
    else if (taken) counters_.sent.inc();
    else counters_.unsent.inc();
  }
  bytes_.clear();
  batch_.clear();
  for (auto& l : links_) {
    if (l->st == link::state::ready) write(*l);
  }
}

bool accounting_sender::idle() const {
  return std::all_of(links_.begin(), links_.end(), [](const auto& l) {
    return l->st != link::state::ready || (l->pending.empty() && l->writing.empty());
  });
}

std::size_t accounting_sender::connected() const {
  return static_cast<std::size_t>(
      std::count_if(links_.begin(), links_.end(), [](const auto& l) { return l->st == link::state::ready; }));
}

bool accounting_sender::wants(const link& l, std::string_view topic) {
  if (l.subs.empty()) return false;
  if (l.subs.find(topic) != l.subs.end()) return true;  // the master's exact "domain\0"
  // A topic is "domain\0" and a domain holds no \0: a subscription ending in
  // \0 matches only itself. Only other prefixes ("" = everything) need a scan.
  if (l.open_prefixes == 0) return false;
  for (const auto& [prefix, n] : l.subs) {
    if (topic.starts_with(prefix)) return true;  // any other SUB's prefixes ("" = everything)
  }
  return false;
}

// ---- connection --------------------------------------------------------------

void accounting_sender::connect(link& l) {
  l.st = link::state::connecting;
  const std::uint64_t gen = l.generation;
  // One deadline for resolve, connect and handshake: a master that accepts
  // and never answers is retried like one that refuses.
  l.retry.expires_after(k_handshake_timeout);
  l.retry.async_wait([this, &l, gen](const boost::system::error_code& ec) {
    if (!ec && gen == l.generation && l.st != link::state::ready) fail(l, "no handshake within 5 s");
  });
  const std::string_view e = l.endpoint;
  if (e.starts_with("ipc://")) {
    std::string path(e.substr(6));
    if (!path.empty() && path[0] == '@') path[0] = '\0';  // abstract namespace, as libzmq
    const asio::local::stream_protocol::endpoint ep(path);
    l.socket.async_connect(generic_stream::endpoint(ep), [this, &l, gen](const boost::system::error_code& ec) {
      if (gen != l.generation) return;
      if (ec) return fail(l, "connect: " + ec.message());
      on_connected(l);
    });
    return;
  }
  // tcp://host:port (config validation guarantees one of the two schemes)
  const std::string_view rest = e.substr(e.find("://") + 3);
  const auto colon = rest.rfind(':');
  std::string host(rest.substr(0, colon == std::string_view::npos ? rest.size() : colon));
  const std::string port(colon == std::string_view::npos ? "" : rest.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  l.resolver.async_resolve(host, port, [this, &l, gen](const boost::system::error_code& ec,
                                                       const asio::ip::tcp::resolver::results_type& results) {
    if (gen != l.generation) return;
    if (ec) return fail(l, "resolve: " + ec.message());
    auto endpoints = std::make_shared<std::vector<generic_stream::endpoint>>();
    for (const auto& r : results) endpoints->emplace_back(r.endpoint());
    asio::async_connect(l.socket, *endpoints,
                        [this, &l, gen, endpoints](const boost::system::error_code& cec, const generic_stream::endpoint&) {
                          if (gen != l.generation) return;
                          if (cec) return fail(l, "connect: " + cec.message());
                          // Batches leave at once; a master whose host vanished is noticed (~90 s).
                          const int one = 1, idle = 60, interval = 10, probes = 3;
                          const int fd = l.socket.native_handle();
                          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                          ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
                          ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
                          ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
                          ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
                          on_connected(l);
                        });
  });
}

void accounting_sender::on_connected(link& l) {
  l.st = link::state::handshake;
  l.greeted = false;
  l.in.clear();
  static const std::string hello = std::string(zmtp::greeting()) + zmtp::ready("PUB");
  const std::uint64_t gen = l.generation;
  queue(l, hello, 0);
  write(l);
  if (gen == l.generation) read(l);
}

void accounting_sender::read(link& l) {
  const std::uint64_t gen = l.generation;
  l.socket.async_read_some(asio::buffer(l.chunk), [this, &l, gen](const boost::system::error_code& ec, std::size_t n) {
    if (gen != l.generation) return;
    if (ec) return fail(l, ec == asio::error::eof ? "master closed the connection" : ec.message());
    l.in.append(l.chunk.data(), n);
    if (parse(l)) read(l);
  });
}

bool accounting_sender::parse(link& l) {
  const std::uint64_t gen = l.generation;  // a failure below (even inside a write) ends the parse
  std::size_t pos = 0;
  if (!l.greeted) {
    std::string detail;
    switch (zmtp::check_greeting(l.in, detail)) {
      case zmtp::greeting_status::need_more: return true;
      case zmtp::greeting_status::ok: break;
      default: fail(l, detail); return false;
    }
    l.greeted = true;
    pos = zmtp::greeting_size;
  }
  for (;;) {
    zmtp::frame f;
    const auto st = zmtp::next_frame(std::string_view(l.in).substr(pos), k_max_in_frame, f);
    if (st == zmtp::frame_status::need_more) break;
    if (st != zmtp::frame_status::ok) {
      fail(l, "malformed frame from the master");
      return false;
    }
    pos += f.size;
    if (f.command()) {
      handle_command(l, f.body);
    } else if (l.st == link::state::ready) {
      subscription(l, f.body);  // a SUB sends nothing else; other frames are ignored
    } else {
      fail(l, "message before READY");
    }
    if (gen != l.generation) return false;
  }
  l.in.erase(0, pos);
  return true;
}

void accounting_sender::handle_command(link& l, std::string_view body) {
  const auto cmd = zmtp::split_command(body);
  if (!cmd) {
    fail(l, "malformed command");
    return;
  }
  const auto [name, rest] = *cmd;
  if (name == "READY") {
    const auto type = zmtp::ready_socket_type(rest);
    if (l.st != link::state::handshake || !type || (*type != "SUB" && *type != "XSUB")) {
      fail(l, "handshake: expected READY from a SUB, got socket type \"" + zmtp::printable(type.value_or("?")) + "\"");
      return;
    }
    l.st = link::state::ready;
    l.failures = 0;
    l.retry.cancel();  // the handshake deadline
    log_->info("accounting connected to {}", l.endpoint);
    return;
  }
  if (name == "ERROR") {
    fail(l, "master sent ERROR");
    return;
  }
  if (l.st != link::state::ready) {
    fail(l, "unexpected command \"" + zmtp::printable(name) + "\" before READY");
    return;
  }
  if (name == "PING") {
    // Answered unless a master that sends PINGs does not read our output.
    if (l.pending.size() < k_max_pong_backlog) {
      queue(l, zmtp::pong_for(rest), 0);
      write(l);
    }
  } else if (name == "SUBSCRIBE") {
    subscription(l, "\x01" + std::string(rest));  // ZMTP 3.1 form, same meaning
  } else if (name == "CANCEL") {
    subscription(l, std::string(1, '\0') + std::string(rest));
  }
}

void accounting_sender::subscription(link& l, std::string_view body) {
  if (body.empty()) return;
  const std::string_view topic = body.substr(1);
  const bool open = topic.empty() || topic.back() != '\0';
  if (body[0] == 1) {
    if (auto it = l.subs.find(topic); it != l.subs.end()) {
      ++it->second;
    } else if (l.subs.size() >= k_max_subscriptions) {
      fail(l, "more than " + std::to_string(k_max_subscriptions) + " subscriptions");
    } else {
      l.subs.emplace(std::string(topic), 1);
      l.open_prefixes += open;
    }
  } else if (body[0] == 0) {
    if (auto it = l.subs.find(topic); it != l.subs.end() && --it->second == 0) {
      l.subs.erase(it);
      l.open_prefixes -= open;
    }
  }
}

// ---- writing -----------------------------------------------------------------

void accounting_sender::queue(link& l, std::string_view bytes, std::size_t messages) {
  l.pending += bytes;
  l.pending_msgs += messages;
}

void accounting_sender::write(link& l) {
  if (l.write_busy || l.pending.empty() || (l.st != link::state::ready && l.st != link::state::handshake)) return;
  std::swap(l.pending, l.writing);
  l.writing_msgs = l.pending_msgs;
  l.pending.clear();
  l.pending_msgs = 0;
  // Most batches go out whole at once; only a remainder waits for the socket.
  const ssize_t n = ::send(l.socket.native_handle(), l.writing.data(), l.writing.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return fail(l, std::strerror(errno));
  if (n > 0) l.writing.erase(0, static_cast<std::size_t>(n));
  if (l.writing.empty()) {
    l.writing_msgs = 0;
    return;
  }
  l.write_busy = true;
  const std::uint64_t gen = l.generation;
  asio::async_write(l.socket, asio::buffer(l.writing), [this, &l, gen](const boost::system::error_code& ec, std::size_t) {
    if (gen != l.generation) return;
    l.write_busy = false;
    if (ec) return fail(l, ec.message());
    l.writing.clear();
    l.writing_msgs = 0;
    write(l);
  });
}

void accounting_sender::fail(link& l, std::string_view why) {
  const bool was_ready = l.st == link::state::ready;
  // Taken for this master and not (wholly) written: lost for it. They were
  // counted as sent (they may have reached the other masters).
  counters_.lost.inc(l.pending_msgs + l.writing_msgs);
  ++l.generation;
  boost::system::error_code ignored;
  l.socket.close(ignored);
  l.resolver.cancel();
  l.st = link::state::idle;
  l.greeted = false;
  l.write_busy = false;
  l.in.clear();
  l.subs.clear();
  l.open_prefixes = 0;
  l.pending.clear();
  l.writing.clear();
  l.pending_msgs = l.writing_msgs = 0;
  // Warn when a working connection breaks, and when connecting keeps failing
  // (the first time, then every 10 minutes of retries); the rest is debug.
  const std::uint64_t n = ++l.failures;
  std::uint64_t suppressed = 0;
  if ((was_ready || n == 1 || n % 6000 == 0) && fail_log_.allow(std::chrono::steady_clock::now(), suppressed)) {
    log_->warn("accounting to {}: {}{}; retrying every {} ms", l.endpoint, why,
               was_ready ? " (connection lost)" : "", k_retry.count());
  } else {
    log_->debug("accounting to {}: {}", l.endpoint, why);
  }
  l.retry.expires_after(k_retry);
  const std::uint64_t gen = l.generation;
  l.retry.async_wait([this, &l, gen](const boost::system::error_code& ec) {
    if (ec || gen != l.generation) return;
    connect(l);
  });
}

}  // namespace smockron::proxy
