// A Redis Cluster client, small, on hiredis's blocking API (Debian ships no
// C or C++ cluster client), for the Redis store's thread (redis_store.hpp).
//
// It learns which primary serves each of the 16384 slots from CLUSTER SLOTS
// (asked of any node that answers: the seeds of the URL, then every node
// learned), sends each command to the primary of its key's slot, pipelined
// per node, and follows the cluster's redirections: MOVED (the slot lives
// elsewhere now: the map is asked again) and ASK (the slot is migrating:
// ASKING, then the command, on the node named, once). A node that fails,
// or answers TRYAGAIN / CLUSTERDOWN / READONLY (a failover under way), has
// its commands sent again after the map is asked again, a few rounds at
// most; what is still not done is reported, and the store retries it.
//
// Keys (cluster_key()): the store's keys of one (domain, identifier) -- its
// state, its override, its reservations -- carry the hash tag
// "{domain\0identifier}", so they live in one slot, on one node.
#pragma once

#include <hiredis/hiredis.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/net.hpp"

namespace smockron::master {

/// The cluster slot of `key` (CRC16/XMODEM of the hash tag, or of the whole
/// key when it has none, modulo 16384), as Redis computes it.
std::uint16_t key_slot(std::string_view key);
/// The store's key as kept in a cluster: "{domain\0identifier}" made its
/// hash tag (state "smockron:{d\0i}", override "smockron-override:{d\0i}",
/// reservation "smockron-resv:owner\0{d\0i}\0tag"); other keys unchanged.
std::string cluster_key(std::string_view key);
/// The reverse of cluster_key(): the key as the store's records spell it.
std::string plain_key(std::string_view key);

class redis_cluster {
public:
  struct options {
    std::vector<host_port> seeds;
    std::string password;
    std::chrono::milliseconds timeout{1000};  ///< connect and per-command
  };
  /// What run() did: replies that were not errors, error replies (refused),
  /// and whether every command got a reply (false: some are to be sent again).
  struct outcome {
    std::size_t ok = 0, refused = 0;
    bool complete = false;
  };
  /// Called with each command's index and its reply (never an error reply of the cluster's own).
  using on_reply = std::function<void(std::size_t, const redisReply&)>;

  explicit redis_cluster(options o);
  ~redis_cluster();
  redis_cluster(const redis_cluster&) = delete;
  redis_cluster& operator=(const redis_cluster&) = delete;

  /// Asks CLUSTER SLOTS of the known primaries, then the seeds, until one
  /// answers; false when none does.
  bool refresh();
  /// PING on every primary; false (and that node closed) when one does not answer.
  bool ping();
  /// Runs the commands (argv; the key is argv[1]), pipelined per primary,
  /// redirections followed; `f` (optional) sees every reply.
  outcome run(const std::vector<std::vector<std::string_view>>& commands, const on_reply& f = {});
  /// SCAN MATCH `match` on every primary, the values read with pipelined
  /// GETs; `f(key, value)` until it returns false. False when a node failed.
  bool scan(std::string_view match, const std::function<bool(std::string_view, std::string_view)>& f);
  /// Closes every connection (the slot map is kept, and asked again at the next refresh()).
  void reset();

  /// Distinct primaries in the slot map.
  std::size_t primaries() const;
  /// Slots no primary serves (a cluster that is not whole).
  std::size_t uncovered() const;
  /// Why the last call failed, for the log.
  const std::string& error() const { return error_; }
  /// MOVED and ASK replies followed so far.
  std::uint64_t redirects() const { return redirects_; }

private:
  struct node;
  static constexpr std::uint16_t k_none = 0xffff;
  std::size_t node_index(const host_port& at);
  redisContext* connected(std::size_t n);
  void close(std::size_t n, std::string why);
  bool refresh_from(std::size_t n);
  /// refresh() without forgetting nodes (indices into nodes_ stay valid).
  bool refresh_map();
  void forget_unused();

  options opt_;
  std::vector<std::unique_ptr<node>> nodes_;
  std::array<std::uint16_t, 16384> slots_{};  ///< slot -> index in nodes_ (k_none: unknown)
  std::string error_;
  std::uint64_t redirects_ = 0;
};

}  // namespace smockron::master
