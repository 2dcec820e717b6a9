// The proxy's accounting sender (see accounting_sender.hpp).
#include "proxy/cluster/accounting_sender.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "shared/base/net.hpp"
#include "shared/protocol/wire_batch.hpp"
#include "shared/protocol/zmtp.hpp"
#include "shared/protocol/zmtp_session.hpp"

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
  link(asio::io_context& ioc, std::string from, std::string ep, std::shared_ptr<const zmtp::curve::client_keys> keys)
      : origin(std::move(from)),
        endpoint(std::move(ep)),
        curve(std::move(keys)),
        socket(ioc),
        retry(ioc),
        resolver(ioc),
        session(new_session()),
        subs(k_max_subscriptions) {}

  zmtp::session new_session() const {
    return zmtp::session(zmtp::session::role::pub,
                         {.max_message = k_max_in_frame, .max_pong_backlog = k_max_pong_backlog},
                         {.client = curve, .server = nullptr});
  }

  std::string origin;    ///< the configured endpoint (a DNS name's masters share it)
  std::string endpoint;  ///< where this master is
  bool parked = false;   ///< its master is gone (a DNS answer dropped it): closed, kept for reuse
  std::shared_ptr<const zmtp::curve::client_keys> curve;  ///< CURVE with this master; null: plaintext
  /// CURVE: the flush's messages of one domain, packed into one BATCH (wire_batch.hpp).
  std::string batch_topic, batch_records;
  generic_stream::socket socket;
  asio::steady_timer retry;
  asio::ip::tcp::resolver resolver;
  state st = state::idle;
  std::uint64_t generation = 0;  ///< bumped on every failure: late completions of the old connection are ignored
  zmtp::session session;
  std::array<char, 4096> chunk;
  std::string in;  ///< received and not yet parsed
  zmtp::subscription_set subs;
  std::uint64_t failures = 0;    ///< in a row, for the log
  std::string pending, writing;  ///< queued; being written
  std::size_t pending_msgs = 0, writing_msgs = 0;
  bool write_busy = false;
  bool subscribed = false;  ///< counted in counters::subscribed
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
                         "were written (once per master)")),
      subscribed(r.add_gauge("smockron_proxy_accounting_links_subscribed",
                             "Accounting connections (one per master per worker thread) the master has "
                             "subscribed: messages are delivered on these only")) {
  for (const auto f : {zmtp::fault::greeting, zmtp::fault::mechanism, zmtp::fault::handshake, zmtp::fault::framing,
                       zmtp::fault::peer_error, zmtp::fault::subscriptions, zmtp::fault::timeout, zmtp::fault::connect,
                       zmtp::fault::closed, zmtp::fault::io, zmtp::fault::bad_box, zmtp::fault::nonce}) {
    disconnects[static_cast<int>(f)] =
        &r.add_counter("smockron_proxy_accounting_disconnects_total",
                       "Accounting connections to a master that failed or ended, by reason (then retried)",
                       metrics::labels({{"reason", zmtp::to_string(f)}}));
  }
}

accounting_sender::accounting_sender(asio::io_context& ioc, const std::vector<std::string>& endpoints,
                                     std::size_t queue_limit, counters& c,
                                     const std::vector<config::proxy_config::shard_config>& shards,
                                     const curve_keys& curve, std::uint64_t gatekeeper)
    : ioc_(ioc),
      queue_limit_(queue_limit),
      counters_(c),
      flush_timer_(ioc),
      sample_rng_(std::random_device{}()),
      log_(log::get("proxy.accounting")) {
  bytes_.reserve(batch * 96);
  batch_.reserve(batch);
  if (gatekeeper != 0) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(gatekeeper));
    gatekeeper_ = hex;
  }
  curve_keys_ = curve;
  // A DNS name's masters come with set_masters(); the rest are connected now.
  for (const auto& e : endpoints) {
    if (!parse_dns_endpoint(e)) connect(add_link(e, e));
  }
  // The configuration never mixes plaintext and CURVE links; a sender given
  // both frames every message (and seals what goes to the CURVE links).
  curve_ = !endpoints.empty() &&
           std::all_of(endpoints.begin(), endpoints.end(), [&](const auto& e) { return curve.contains(e); });
  for (const auto& sc : shards) {
    std::vector<std::string> names;
    for (const auto& share : sc.shares) names.push_back(share.front());  // a share's place on the ring
    sharded_.emplace(sc.domain,
                     sharded{hash_ring(names), sc.shares, std::vector<std::vector<link*>>(sc.shares.size())});
  }
  rebuild_shares();
}

accounting_sender::link& accounting_sender::add_link(std::string_view origin, const std::string& endpoint) {
  const auto it = curve_keys_.find(origin);
  auto keys = it == curve_keys_.end() ? nullptr : it->second;
  for (auto& l : links_) {
    if (!l->parked) continue;
    l->parked = false;
    l->origin = std::string(origin);
    l->endpoint = endpoint;
    l->curve = std::move(keys);
    l->failures = 0;
    return *l;
  }
  links_.push_back(std::make_unique<link>(ioc_, std::string(origin), endpoint, std::move(keys)));
  return *links_.back();
}

void accounting_sender::rebuild_shares() {
  for (auto& [domain, sh] : sharded_) {
    for (std::size_t i = 0; i < sh.origins.size(); ++i) {
      // Cleared in place: a queued message points at its share's vector.
      sh.shares[i].clear();
      for (const auto& origin : sh.origins[i]) {
        for (auto& l : links_) {
          if (!l->parked && l->origin == origin) sh.shares[i].push_back(l.get());
        }
      }
    }
  }
}

void accounting_sender::set_masters(std::string_view configured, const std::vector<std::string>& masters) {
  bool changed = false, was_subscribed = false;
  for (auto& l : links_) {
    if (l->parked || l->origin != configured || std::find(masters.begin(), masters.end(), l->endpoint) != masters.end())
      continue;
    log_->info("accounting: {} is gone from {}", l->endpoint, configured);
    was_subscribed |= l->subscribed;
    close(*l);
    l->parked = true;
    changed = true;
  }
  for (const auto& m : masters) {
    const bool known = std::any_of(links_.begin(), links_.end(), [&](const auto& l) {
      return !l->parked && l->origin == configured && l->endpoint == m;
    });
    if (known) continue;
    link& l = add_link(configured, m);
    log_->info("accounting: connecting to {} (of {})", m, configured);
    connect(l);
    changed = true;
  }
  if (changed) rebuild_shares();
  if (was_subscribed && on_link_change_) on_link_change_();
}

accounting_sender::~accounting_sender() {
  counters_.unsent.inc(batch_.size());
  for (const auto& l : links_) {
    if (l->subscribed) counters_.subscribed.add(-1);
  }
}

void accounting_sender::account(const wire::accounting& m, const policy& p) {
  // Refusals may be sampled (they charge nothing); a correction of a cost never is.
  if (m.state == wire::status::rejected && !m.adjust && p.rejected_sample < 1.0 &&
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

void accounting_sender::lease(const wire::lease& m) {
  if (auto enc = wire::encode(m, scratch_)) publish(*enc, m.domain, m.identifier);
  else counters_.dropped.inc();
  flush();  // a request may be waiting for the slots it asks for
}

void accounting_sender::ask(const wire::ask& m) {
  if (auto enc = wire::encode(m, scratch_)) publish(*enc, m.domain, m.identifier);
  else counters_.dropped.inc();
  flush();  // the request waits for the answer
}

bool accounting_sender::publish(const wire::accounting& m) {
  auto enc = wire::encode(m, scratch_);
  if (!enc) {
    counters_.dropped.inc();
    return false;
  }
  return publish(*enc, m.domain, m.identifier);
}

bool accounting_sender::publish(const wire::encoded& e, std::string_view domain, std::string_view identifier) {
  const wire::encoded* enc = &e;
  if (batch_.size() >= batch) flush();
  const bool was_empty = batch_.empty();
  queued q{};
  if (curve_) {
    // Every link speaks CURVE: kept as a BATCH record (its frames after the
    // topic), which flush() copies into each link's batch as it is.
    q.topic_offset = static_cast<std::uint32_t>(bytes_.size());
    q.topic_size = static_cast<std::uint32_t>(enc->frame[0].size());
    bytes_ += enc->frame[0];
    q.offset = static_cast<std::uint32_t>(bytes_.size());
    if (enc->count < 2 || !wire::append_batch_record(bytes_, enc->view().subspan(1))) {
      bytes_.resize(q.topic_offset);
      counters_.dropped.inc();
      return false;
    }
  } else {
    q.offset = static_cast<std::uint32_t>(bytes_.size());
    for (std::size_t i = 0; i < enc->count; ++i) {
      const std::string_view f = enc->frame[i];
      zmtp::append_frame(bytes_, i + 1 < enc->count ? zmtp::flag_more : 0, f);
      if (i == 0) {
        q.topic_size = static_cast<std::uint32_t>(f.size());
        q.topic_offset = static_cast<std::uint32_t>(bytes_.size() - f.size());
      }
    }
  }
  q.size = static_cast<std::uint32_t>(bytes_.size() - q.offset);
  q.share = nullptr;
  if (!sharded_.empty()) {
    if (const auto it = sharded_.find(domain); it != sharded_.end()) {
      q.share = &it->second.shares[it->second.ring.owner(identifier)];
    }
  }
  batch_.push_back(q);
  return was_empty;
}

void accounting_sender::flush() {
  if (batch_.empty()) return;
  for (const queued& q : batch_) {
    const std::string_view topic(bytes_.data() + q.topic_offset, q.topic_size);
    const std::string_view message(bytes_.data() + q.offset, q.size);
    bool taken = false, refused = false;
    const auto offer = [&](link& l) {
      if (l.st != link::state::ready || !l.subs.matches(topic)) return;
      if (queue_limit_ > 0 && l.pending_msgs + l.writing_msgs >= queue_limit_) {
        refused = true;
        return;
      }
      if (curve_) add_to_batch(l, topic, message);
      else l.session.append_framed(l.pending, message);  // sealed for a CURVE link (a mixed sender)
      ++l.pending_msgs;
      taken = true;
    };
    if (q.share) {
      for (link* l : *q.share) offer(*l);
    } else {
      for (auto& l : links_) offer(*l);
    }
    if (refused) counters_.dropped.inc();
    else if (taken) counters_.sent.inc();
    else counters_.unsent.inc();
  }
  bytes_.clear();
  batch_.clear();
  for (auto& l : links_) {
    seal_batch(*l);
    if (l->st == link::state::ready) write(*l);
  }
}

// Under CURVE a box per frame would cost more than the message: the
// messages of one domain that leave together go as one BATCH of three frames.
void accounting_sender::add_to_batch(link& l, std::string_view topic, std::string_view record) {
  if (l.batch_topic != topic || l.batch_records.size() + record.size() > wire::max_batch_bytes) {
    seal_batch(l);
    l.batch_topic.assign(topic);
  }
  l.batch_records += record;
}

void accounting_sender::seal_batch(link& l) {
  if (l.batch_records.empty()) return;
  l.session.append(l.pending, zmtp::flag_more, l.batch_topic);
  l.session.append(l.pending, zmtp::flag_more, wire::batch_status);
  l.session.append(l.pending, 0, l.batch_records);
  l.batch_records.clear();
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

// ---- connection --------------------------------------------------------------

void accounting_sender::connect(link& l) {
  l.st = link::state::connecting;
  const std::uint64_t gen = l.generation;
  // One deadline for resolve, connect and handshake: a master that accepts
  // and never answers is retried like one that refuses.
  l.retry.expires_after(k_handshake_timeout);
  l.retry.async_wait([this, &l, gen](const boost::system::error_code& ec) {
    if (!ec && gen == l.generation && l.st != link::state::ready)
      fail(l, zmtp::fault::timeout, "no handshake within 5 s");
  });
  const auto e = parse_stream_endpoint(l.endpoint);  // validated with the configuration
  if (!e) return fail(l, zmtp::fault::connect, "invalid endpoint");
  if (e->type == stream_endpoint::kind::ipc) {
    std::string path = e->path;
    if (e->abstract()) path[0] = '\0';
    const asio::local::stream_protocol::endpoint ep(path);
    l.socket.async_connect(generic_stream::endpoint(ep), [this, &l, gen](const boost::system::error_code& ec) {
      if (gen != l.generation) return;
      if (ec) return fail(l, zmtp::fault::connect, "connect: " + ec.message());
      on_connected(l);
    });
    return;
  }
  const std::string& host = e->address.host;
  const std::string port = std::to_string(e->address.port);
  l.resolver.async_resolve(
      host, port,
      [this, &l, gen](const boost::system::error_code& ec, const asio::ip::tcp::resolver::results_type& results) {
        if (gen != l.generation) return;
        if (ec) return fail(l, zmtp::fault::connect, "resolve: " + ec.message());
        auto endpoints = std::make_shared<std::vector<generic_stream::endpoint>>();
        for (const auto& r : results) endpoints->emplace_back(r.endpoint());
        asio::async_connect(
            l.socket, *endpoints,
            [this, &l, gen, endpoints](const boost::system::error_code& cec, const generic_stream::endpoint&) {
              if (gen != l.generation) return;
              if (cec) return fail(l, zmtp::fault::connect, "connect: " + cec.message());
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
  l.session = l.new_session();
  l.session.name_gatekeeper(gatekeeper_);
  l.in.clear();
  const std::uint64_t gen = l.generation;
  std::string hello;
  l.session.start(hello);
  if (const auto f = l.session.failed()) return fail(l, *f, l.session.detail());
  queue(l, hello, 0);
  write(l);
  if (gen == l.generation) read(l);
}

void accounting_sender::read(link& l) {
  const std::uint64_t gen = l.generation;
  l.socket.async_read_some(asio::buffer(l.chunk), [this, &l, gen](const boost::system::error_code& ec, std::size_t n) {
    if (gen != l.generation) return;
    if (ec == asio::error::eof) return fail(l, zmtp::fault::closed, "master closed the connection");
    if (ec) return fail(l, zmtp::fault::io, ec.message());
    l.in.append(l.chunk.data(), n);
    if (parse(l)) read(l);
  });
}

bool accounting_sender::parse(link& l) {
  struct events final : zmtp::session_events {
    accounting_sender& self;
    link& l;
    events(accounting_sender& s, link& k) : self(s), l(k) {}
    void on_ready() override {
      l.st = link::state::ready;
      l.failures = 0;
      l.retry.cancel();  // the handshake deadline
      self.log_->info("accounting connected to {}", l.endpoint);
    }
    void on_subscription(bool subscribe, std::string_view topic) override {
      if (!l.subs.apply(subscribe, topic)) full = true;
      if (subscribe && !l.subscribed && l.st == link::state::ready) {
        l.subscribed = true;
        self.counters_.subscribed.add(1);
        changed = true;
      }
    }
    bool full = false;
    bool changed = false;
  };
  events ev(*this, l);
  std::string replies;  // PONGs
  const std::size_t used = l.session.feed(l.in, ev, replies);
  l.in.erase(0, used);
  if (const auto f = l.session.failed()) {
    fail(l, *f, l.session.detail());
    return false;
  }
  if (ev.full) {
    fail(l, zmtp::fault::subscriptions, "more than " + std::to_string(k_max_subscriptions) + " subscriptions");
    return false;
  }
  if (ev.changed && on_link_change_) on_link_change_();
  if (!replies.empty()) {
    const std::uint64_t gen = l.generation;
    queue(l, replies, 0);
    write(l);
    if (gen != l.generation) return false;
  }
  return true;
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
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    return fail(l, zmtp::fault::io, std::strerror(errno));
  if (n > 0) l.writing.erase(0, static_cast<std::size_t>(n));
  if (l.writing.empty()) {
    l.writing_msgs = 0;
    return;
  }
  l.write_busy = true;
  const std::uint64_t gen = l.generation;
  asio::async_write(l.socket, asio::buffer(l.writing),
                    [this, &l, gen](const boost::system::error_code& ec, std::size_t) {
                      if (gen != l.generation) return;
                      l.write_busy = false;
                      if (ec) return fail(l, zmtp::fault::io, ec.message());
                      l.writing.clear();
                      l.writing_msgs = 0;
                      write(l);
                    });
}

void accounting_sender::close(link& l) {
  // Taken for this master and not (wholly) written: lost for it. They were
  // counted as sent (they may have reached the other masters).
  counters_.lost.inc(l.pending_msgs + l.writing_msgs);
  ++l.generation;
  boost::system::error_code ignored;
  l.socket.close(ignored);
  l.resolver.cancel();
  l.st = link::state::idle;
  l.write_busy = false;
  l.in.clear();
  l.subs.clear();
  if (std::exchange(l.subscribed, false)) counters_.subscribed.add(-1);
  l.pending.clear();
  l.writing.clear();
  l.batch_records.clear();
  l.pending_msgs = l.writing_msgs = 0;
  l.retry.cancel();
}

void accounting_sender::fail(link& l, zmtp::fault why, std::string_view detail) {
  const bool was_ready = l.st == link::state::ready;
  const bool was_subscribed = l.subscribed;
  if (auto* c = counters_.disconnects[static_cast<int>(why)]) c->inc();
  close(l);
  // Warn when a working connection breaks, and when connecting keeps failing
  // (the first time, then every 10 minutes of retries); the rest is debug.
  const std::uint64_t n = ++l.failures;
  std::uint64_t suppressed = 0;
  if ((was_ready || n == 1 || n % 6000 == 0) && fail_log_.allow(std::chrono::steady_clock::now(), suppressed)) {
    log_->warn("accounting to {}: {} ({}){}; retrying every {} ms", l.endpoint, detail, zmtp::to_string(why),
               was_ready ? ", connection lost" : "", k_retry.count());
  } else {
    log_->debug("accounting to {}: {} ({})", l.endpoint, detail, zmtp::to_string(why));
  }
  l.retry.expires_after(k_retry);
  const std::uint64_t gen = l.generation;
  l.retry.async_wait([this, &l, gen](const boost::system::error_code& ec) {
    if (ec || gen != l.generation) return;
    connect(l);
  });
  if (was_subscribed && on_link_change_) on_link_change_();
}

bool accounting_sender::delivers(std::string_view domain) const {
  std::string topic(domain);
  topic.push_back('\0');
  return std::any_of(links_.begin(), links_.end(),
                     [&](const auto& l) { return l->st == link::state::ready && l->subs.matches(topic); });
}

}  // namespace smockron::proxy
