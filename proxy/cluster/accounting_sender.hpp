// The proxy's accounting sender: the PUB end of the accounting stream, one
// connection per worker per master, on the worker's own event loop. The
// protocol is shared/zmtp_session.hpp; this file moves bytes, batches, and
// bounds queues.
//
// Why not a libzmq PUB: its I/O thread would share the worker's core and
// wake for every batch, and a libzmq PUB drops silently when a subscriber's
// queue is full, so drops could not be counted. Here a batch is encoded once
// (5 frames per message), copied into the queue of every master subscribed
// to its domain and written with one send() per master; a full queue refuses
// the message and it is counted. Under CURVE, the messages of one domain in
// a batch go as one BATCH message (shared/protocol/wire_batch.hpp): three
// boxes per batch instead of five per message.
//
// A domain split across masters by identifier ([[proxy.shards]]) sends each
// message only to the share (one master or redundant ones) that owns its
// identifier on a consistent-hash ring; a share that is down is fail-open
// for its identifiers only.
//
// An endpoint may be a DNS name for several masters (master_discovery.hpp):
// set_masters() gives its masters as they change; a new one is connected, a
// gone one is dropped (what was queued for it counted as lost), the others
// are untouched. A share of a sharded domain is keyed by its configured
// endpoint, so a master that comes back at a new address keeps its share.
//
// Per master: connect (TCP, host names resolved asynchronously, or IPC),
// handshake as a PUB; the master's subscriptions select what it receives. A
// failed or closed connection is counted by reason and retried every 100 ms;
// what was queued for it is counted as lost. Nothing here blocks a request:
// account() and flush() only copy bytes and try a non-blocking send.
#pragma once

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "shared/base/log.hpp"
#include "shared/base/metrics.hpp"
#include "shared/base/string_hash.hpp"
#include "shared/config/config.hpp"
#include "shared/protocol/hash_ring.hpp"
#include "shared/protocol/wire.hpp"
#include "shared/protocol/wire_lease.hpp"
#include "shared/protocol/zmtp_session.hpp"

namespace smockron::proxy {

class accounting_sender {
public:
  /// Every message counts once in sent, dropped or unsent; `lost` counts
  /// again those (taken by a queue) whose connection broke before they were
  /// written, once per master. Shared by every worker's sender.
  struct counters {
    explicit counters(metrics::registry& reg);
    metrics::counter& sent;     ///< taken by every connected master subscribed to its domain
    metrics::counter& dropped;  ///< refused by at least one full queue (or unencodable)
    metrics::counter& unsent;   ///< no connected master subscribed to the domain
    metrics::counter& lost;     ///< queued for a master whose connection then broke
    /// Connections (one per master per worker) that have the master's
    /// subscriptions: only those deliver. A master subscribes just after the
    /// handshake; what is sent before is unsent.
    metrics::gauge& subscribed;
    /// smockron_proxy_accounting_disconnects_total by reason (null: cannot happen here).
    metrics::counter* disconnects[zmtp::fault_count] = {};
  };

  /// How messages leave (from the configuration in force; reloadable).
  struct policy {
    std::chrono::microseconds flush_after{2000};  ///< a batch leaves at most this long after its first message
    double rejected_sample = 1.0;                 ///< fraction of REJECTED messages sent
  };

  /// `queue_limit`: messages queued per master at most (accounting_hwm; 0 = unbounded).
  /// `shards`: domains split across masters by identifier (their endpoints are among `endpoints`).
  /// `curve`: the keys of each endpoint that speaks CURVE (the others are plaintext).
  /// `gatekeeper`: the proxy's name on every connection (X-Gatekeeper, zmtp.hpp), the same for
  /// all its workers' senders, so that a master counts the gatekeepers that report a client (its
  /// pace share) and not their connections; 0: none.
  using curve_keys = std::map<std::string, std::shared_ptr<const zmtp::curve::client_keys>, std::less<>>;
  accounting_sender(boost::asio::io_context& ioc, const std::vector<std::string>& endpoints, std::size_t queue_limit,
                    counters& c, const std::vector<config::proxy_config::shard_config>& shards = {},
                    const curve_keys& curve = {}, std::uint64_t gatekeeper = 0);
  accounting_sender(const accounting_sender&) = delete;
  accounting_sender& operator=(const accounting_sender&) = delete;

  /// What is still in the batch is counted as unsent (the worker stopped).
  ~accounting_sender();
  /// Accounts one request. A DELAYED message (a reservation) leaves at once:
  /// other gatekeepers learn of it one round trip later, and every
  /// millisecond of that is a window in which two of them can reserve the
  /// same instant. Others join the batch, which leaves within
  /// `p.flush_after` or when full. REJECTED messages are sampled.
  void account(const wire::accounting& m, const policy& p);
  /// Sends a LEASE (concurrency slots wanted or given back) at once, with
  /// what is batched: a request may be waiting for it.
  void lease(const wire::lease& m);
  /// Sends an ASK (exact admission) at once, with what is batched: a request waits for its answer.
  void ask(const wire::ask& m);
  /// The masters a DNS endpoint (one of `endpoints`) stands for now: new ones
  /// are connected, gone ones closed. On the worker's thread.
  void set_masters(std::string_view configured, const std::vector<std::string>& masters);
  /// Hands the batch to every master and starts writing.
  void flush();
  /// True when a connected master is subscribed to `domain` (what is sent for it is delivered).
  bool delivers(std::string_view domain) const;
  /// Called (on the worker's thread) when a master's connection starts or
  /// stops delivering: the concurrency slots leased over it are claimed
  /// again or lost (proxy/gate/slots.hpp).
  void on_link_change(std::function<void()> f) { on_link_change_ = std::move(f); }
  /// True when nothing handed to a connected master is still unwritten.
  bool idle() const;
  /// Masters whose connection finished the handshake.
  std::size_t connected() const;

  static constexpr std::size_t batch = 256;
  static constexpr std::chrono::milliseconds k_retry{100};
  /// Connect plus handshake must finish in this, else the connection is retried.
  static constexpr std::chrono::seconds k_handshake_timeout{5};
  /// A master may hold this many subscriptions on one connection.
  static constexpr std::size_t k_max_subscriptions = 10'000;

private:
  struct link;
  /// Encodes and queues; returns true when the batch went from empty to
  /// non-empty. A full batch flushes first.
  bool publish(const wire::accounting& m);
  bool publish(const wire::encoded& e, std::string_view domain, std::string_view identifier);
  void connect(link& l);
  void on_connected(link& l);
  void read(link& l);
  bool parse(link& l);
  void queue(link& l, std::string_view bytes, std::size_t messages);
  /// CURVE: adds one message's BATCH record to the link's batch (sealing the batch first when its domain
  /// differs or it is full); seal_batch() appends the batch, sealed, to what the link sends.
  void add_to_batch(link& l, std::string_view topic, std::string_view record);
  void seal_batch(link& l);
  void write(link& l);
  /// Closes the connection, counts `why`, and retries after k_retry. Late
  /// completions check the link's generation.
  void fail(link& l, zmtp::fault why, std::string_view detail);
  /// Closes the connection (what was queued for it is lost); late completions check the generation.
  void close(link& l);
  /// A link for `endpoint` of the configured `origin`: a parked one reused, or a new one.
  link& add_link(std::string_view origin, const std::string& endpoint);
  /// Each share's links, from the configured endpoints of the share.
  void rebuild_shares();

  boost::asio::io_context& ioc_;
  std::size_t queue_limit_;
  counters& counters_;
  boost::asio::steady_timer flush_timer_;
  std::minstd_rand sample_rng_;
  /// Links are never freed while the sender lives (completions may still
  /// name them): a gone master's link is parked and reused for the next new one.
  std::vector<std::unique_ptr<link>> links_;
  curve_keys curve_keys_;
  std::string gatekeeper_;  ///< X-Gatekeeper on every connection (16 hex digits; empty: none)
  wire::scratch scratch_;
  /// A domain split by identifier: the ring, and each share's configured endpoints and links.
  struct sharded {
    hash_ring ring;
    std::vector<std::vector<std::string>> origins;
    std::vector<std::vector<link*>> shares;
  };
  string_map<sharded> sharded_;
  struct queued {
    std::uint32_t offset, size;              ///< the encoded message in bytes_
    std::uint32_t topic_offset, topic_size;  ///< its first frame's body (the domain topic)
    const std::vector<link*>* share;         ///< a sharded domain's message: only these links; else null (all)
  };
  bool curve_ = false;  ///< every link speaks CURVE: bytes_ holds BATCH records, not frames
  std::string bytes_;   ///< ZMTP frames of the batch, back to back (CURVE: each topic, then its record)
  std::vector<queued> batch_;
  std::shared_ptr<spdlog::logger> log_;
  log::rate_limiter fail_log_;
  std::function<void()> on_link_change_;
};

}  // namespace smockron::proxy
