// A Redis Cluster client on hiredis (see redis_cluster.hpp).
#include "master/store/redis_cluster.hpp"

#include <algorithm>
#include <charconv>
#include <map>

#include "master/store/hiredis_util.hpp"
#include "master/store/reservation_record.hpp"
#include "master/store/state_record.hpp"

namespace smockron::master {

namespace {

/// Rounds of sending again what a redirection or a failing node left undone.
constexpr int k_rounds = 5;

using hiredis::append;
using hiredis::command;
using hiredis::next_reply;
using hiredis::reply_ptr;
using hiredis::str;
using hiredis::to_timeval;

/// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381": the node named.
std::optional<std::pair<std::uint16_t, host_port>> redirection(std::string_view error) {
  const auto a = error.find(' ');
  const auto b = a == std::string_view::npos ? a : error.find(' ', a + 1);
  if (b == std::string_view::npos) return std::nullopt;
  const std::string_view slot_text = error.substr(a + 1, b - a - 1);
  unsigned slot = 0;
  const auto [end, ec] = std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), slot);
  if (ec != std::errc() || end != slot_text.data() + slot_text.size() || slot >= 16384) return std::nullopt;
  // "host:port"; an IPv6 address comes without brackets ("2001:db8::1:6379"): the port follows the last ':'.
  const std::string_view where = error.substr(b + 1);
  const auto colon = where.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  std::string_view host = where.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string_view port_text = where.substr(colon + 1);
  unsigned port = 0;
  const auto [pend, pec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (pec != std::errc() || pend != port_text.data() + port_text.size() || port == 0 || port > 65535)
    return std::nullopt;
  return std::pair{static_cast<std::uint16_t>(slot), host_port{std::string(host), static_cast<std::uint16_t>(port)}};
}

bool starts_with_word(std::string_view error, std::string_view word) {
  return error.starts_with(word) && (error.size() == word.size() || error[word.size()] == ' ');
}

}  // namespace

// ---- slots and keys -------------------------------------------------------------

std::uint16_t key_slot(std::string_view key) {
  // Redis hashes only the part between the first '{' and the next '}', when that is not empty.
  if (const auto open = key.find('{'); open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  std::uint16_t crc = 0;  // CRC16/XMODEM: polynomial 0x1021, initial 0, not reflected
  for (const char ch : key) {
    crc ^= static_cast<std::uint16_t>(static_cast<unsigned char>(ch) << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<std::uint16_t>((crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
  }
  return crc & 16383;
}

std::string cluster_key(std::string_view key) {
  for (const std::string_view prefix : {k_store_prefix, k_override_prefix}) {
    if (key.starts_with(prefix)) {
      return std::string(prefix) + "{" + std::string(key.substr(prefix.size())) + "}";
    }
  }
  if (key.starts_with(k_reservation_prefix)) {
    // prefix owner \0 domain \0 identifier \0 tag: the tag is "{domain\0identifier}".
    const auto owner_end = key.find('\0', k_reservation_prefix.size());
    const auto tag_start = key.rfind('\0');
    if (owner_end != std::string_view::npos && tag_start > owner_end) {
      return std::string(key.substr(0, owner_end + 1)) + "{" +
             std::string(key.substr(owner_end + 1, tag_start - owner_end - 1)) + "}" +
             std::string(key.substr(tag_start));
    }
  }
  return std::string(key);
}

std::string plain_key(std::string_view key) {
  for (const std::string_view prefix : {k_store_prefix, k_override_prefix}) {
    if (key.starts_with(prefix) && key.size() >= prefix.size() + 2 && key[prefix.size()] == '{' && key.back() == '}') {
      return std::string(prefix) + std::string(key.substr(prefix.size() + 1, key.size() - prefix.size() - 2));
    }
  }
  if (key.starts_with(k_reservation_prefix)) {
    const auto owner_end = key.find('\0', k_reservation_prefix.size());
    const auto tag_start = key.rfind('\0');
    if (owner_end != std::string_view::npos && tag_start > owner_end + 2 && key[owner_end + 1] == '{' &&
        key[tag_start - 1] == '}') {
      return std::string(key.substr(0, owner_end + 1)) +
             std::string(key.substr(owner_end + 2, tag_start - owner_end - 3)) + std::string(key.substr(tag_start));
    }
  }
  return std::string(key);
}

// ---- connections ------------------------------------------------------------------

struct redis_cluster::node {
  host_port at;
  std::unique_ptr<redisContext, void (*)(redisContext*)> ctx{nullptr, redisFree};
};

redis_cluster::redis_cluster(options o) : opt_(std::move(o)) {
  slots_.fill(k_none);
  for (const auto& s : opt_.seeds) node_index(s);
}

redis_cluster::~redis_cluster() = default;

std::size_t redis_cluster::node_index(const host_port& at) {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->at == at) return i;
  }
  nodes_.push_back(std::make_unique<node>());
  nodes_.back()->at = at;
  return nodes_.size() - 1;
}

void redis_cluster::close(std::size_t n, std::string why) {
  nodes_[n]->ctx.reset();
  error_ = nodes_[n]->at.to_string() + ": " + std::move(why);
}

redisContext* redis_cluster::connected(std::size_t n) {
  node& nd = *nodes_[n];
  if (nd.ctx) return nd.ctx.get();
  nd.ctx.reset(redisConnectWithTimeout(nd.at.host.c_str(), nd.at.port, to_timeval(opt_.timeout)));
  if (!nd.ctx || nd.ctx->err) {
    close(n, nd.ctx ? nd.ctx->errstr : "out of memory");
    return nullptr;
  }
  redisSetTimeout(nd.ctx.get(), to_timeval(opt_.timeout));
  if (!opt_.password.empty()) {
    auto r = command(nd.ctx.get(), {"AUTH", opt_.password});
    if (!r || r->type == REDIS_REPLY_ERROR) {
      close(n, r ? "AUTH: " + std::string(str(r.get())) : std::string(nd.ctx->errstr));
      return nullptr;
    }
  }
  return nd.ctx.get();
}

void redis_cluster::reset() {
  for (auto& n : nodes_) n->ctx.reset();
}

// ---- the slot map -------------------------------------------------------------------

bool redis_cluster::refresh_from(std::size_t n) {
  redisContext* c = connected(n);
  if (!c) return false;
  auto r = command(c, {"CLUSTER", "SLOTS"});
  if (!r) {
    close(n, std::string("CLUSTER SLOTS: ") + c->errstr);
    return false;
  }
  if (r->type != REDIS_REPLY_ARRAY) {
    error_ = nodes_[n]->at.to_string() +
             ": CLUSTER SLOTS: " + (r->type == REDIS_REPLY_ERROR ? std::string(str(r.get())) : "not an array");
    return false;
  }
  // [[start, end, [host, port, id, ...] (the primary), [replica]...], ...]
  std::array<std::uint16_t, 16384> next;
  next.fill(k_none);
  for (std::size_t i = 0; i < r->elements; ++i) {
    const redisReply* range = r->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 || range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER || range->element[2]->type != REDIS_REPLY_ARRAY ||
        range->element[2]->elements < 2 ||
        (range->element[2]->element[0]->type != REDIS_REPLY_STRING &&
         range->element[2]->element[0]->type != REDIS_REPLY_NIL) ||
        range->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      error_ = nodes_[n]->at.to_string() + ": CLUSTER SLOTS: unexpected reply";
      return false;
    }
    const long long start = range->element[0]->integer, end = range->element[1]->integer;
    const long long port = range->element[2]->element[1]->integer;
    if (start < 0 || end > 16383 || start > end || port <= 0 || port > 65535) {
      error_ = nodes_[n]->at.to_string() + ": CLUSTER SLOTS: a range out of bounds";
      return false;
    }
    // Redis 7 (cluster-preferred-endpoint-type): an empty or NULL endpoint is
    // the node that answered, at this port; "?" a node whose address is not
    // known: its slots stay uncovered until the map is asked again.
    const redisReply* endpoint = range->element[2]->element[0];
    std::string host = endpoint->type == REDIS_REPLY_NIL ? std::string() : std::string(str(endpoint));
    if (host == "?") continue;
    if (host.empty()) host = nodes_[n]->at.host;
    const std::size_t primary = node_index({std::move(host), static_cast<std::uint16_t>(port)});
    if (primary >= k_none) {
      error_ = "more cluster nodes than this client keeps";
      return false;
    }
    std::fill(next.begin() + start, next.begin() + end + 1, static_cast<std::uint16_t>(primary));
  }
  slots_ = next;
  return true;
}

// Nodes named once (by a map, a MOVED, an ASK) and in no map since are
// forgotten, so that pods that changed addresses do not pile up and each
// cost a connect timeout at the next refresh(). The seeds stay.
void redis_cluster::forget_unused() {
  constexpr std::size_t k_keep = 64;
  if (nodes_.size() <= k_keep) return;
  std::vector<std::uint16_t> remap(nodes_.size(), k_none);
  std::vector<std::unique_ptr<node>> kept;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const bool seed = std::find(opt_.seeds.begin(), opt_.seeds.end(), nodes_[i]->at) != opt_.seeds.end();
    const bool mapped = std::find(slots_.begin(), slots_.end(), static_cast<std::uint16_t>(i)) != slots_.end();
    if (!seed && !mapped) continue;
    remap[i] = static_cast<std::uint16_t>(kept.size());
    kept.push_back(std::move(nodes_[i]));
  }
  for (auto& s : slots_) {
    if (s != k_none) s = remap[s];
  }
  nodes_ = std::move(kept);
}

bool redis_cluster::refresh() {
  // Indices into nodes_ change here only: run() and scan(), which hold some, ask the map with refresh_map().
  if (!refresh_map()) return false;
  forget_unused();
  return true;
}

bool redis_cluster::refresh_map() {
  // The primaries known first (they are the cluster now), then every node ever named.
  std::vector<std::size_t> order;
  for (const auto s : slots_) {
    if (s != k_none && std::find(order.begin(), order.end(), s) == order.end()) order.push_back(s);
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
  }
  for (const std::size_t n : order) {
    if (refresh_from(n)) return true;
  }
  return false;
}

std::size_t redis_cluster::primaries() const {
  std::vector<std::uint16_t> seen;
  for (const auto s : slots_) {
    if (s != k_none && std::find(seen.begin(), seen.end(), s) == seen.end()) seen.push_back(s);
  }
  return seen.size();
}

std::size_t redis_cluster::uncovered() const {
  return static_cast<std::size_t>(std::count(slots_.begin(), slots_.end(), k_none));
}

bool redis_cluster::ping() {
  if (uncovered() > 0) {
    error_ = std::to_string(uncovered()) + " slot(s) served by no primary";
    return false;
  }
  std::vector<std::uint16_t> seen;
  for (const auto s : slots_) {
    if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
    seen.push_back(s);
    redisContext* c = connected(s);
    if (!c) return false;
    auto r = command(c, {"PING"});
    if (!r || r->type == REDIS_REPLY_ERROR) {
      close(s, r ? std::string(str(r.get())) : std::string(c->errstr));
      return false;
    }
  }
  return true;
}

// ---- commands -------------------------------------------------------------------------

redis_cluster::outcome redis_cluster::run(const std::vector<std::vector<std::string_view>>& commands,
                                          const on_reply& f) {
  outcome out;
  std::vector<std::size_t> todo(commands.size());
  for (std::size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  std::map<std::size_t, std::size_t> asking;  // command -> the node an ASK named (for one attempt)
  for (int round = 0; round < k_rounds && !todo.empty(); ++round) {
    std::map<std::size_t, std::vector<std::size_t>> by_node;
    std::vector<std::size_t> again;
    for (const std::size_t i : todo) {
      const auto ask = asking.find(i);
      const std::uint16_t n =
          ask != asking.end() ? static_cast<std::uint16_t>(ask->second) : slots_[key_slot(commands[i].at(1))];
      if (n == k_none) {
        error_ = "slot " + std::to_string(key_slot(commands[i].at(1))) + " is served by no primary";
        again.push_back(i);
      } else {
        by_node[n].push_back(i);
      }
    }
    bool ask_again = false;  // the map is stale (a redirection, a failing node): asked again before the next round
    for (auto& [n, items] : by_node) {
      redisContext* c = connected(n);
      bool sent = c != nullptr;
      for (std::size_t k = 0; sent && k < items.size(); ++k) {
        if (asking.contains(items[k])) sent = append(c, {"ASKING"});
        sent = sent && append(c, commands[items[k]]);
      }
      if (!sent) {
        if (c) close(n, std::string("pipelining: ") + c->errstr);
        again.insert(again.end(), items.begin(), items.end());
        ask_again = true;
        continue;
      }
      for (std::size_t k = 0; k < items.size(); ++k) {
        const std::size_t i = items[k];
        const bool was_asking = asking.erase(i) > 0;
        reply_ptr r = was_asking ? next_reply(c) : nullptr;  // ASKING's +OK
        if (!was_asking || r) r = next_reply(c);
        if (!r) {
          close(n, std::string("reading replies: ") + c->errstr);
          again.insert(again.end(), items.begin() + static_cast<std::ptrdiff_t>(k), items.end());
          for (std::size_t rest = k + 1; rest < items.size(); ++rest) asking.erase(items[rest]);
          ask_again = true;
          break;
        }
        if (r->type != REDIS_REPLY_ERROR) {
          ++out.ok;
          if (f) f(i, *r);
          continue;
        }
        const std::string_view e = str(r.get());
        if (starts_with_word(e, "MOVED") || starts_with_word(e, "ASK")) {
          const auto to = redirection(e);
          if (!to) {
            ++out.refused;
            continue;
          }
          ++redirects_;
          const std::size_t target = node_index(to->second);
          if (target >= k_none) {
            ++out.refused;
            continue;
          }
          if (starts_with_word(e, "ASK")) {
            asking[i] = target;
          } else {
            slots_[to->first] = static_cast<std::uint16_t>(target);
            ask_again = true;
          }
          again.push_back(i);
        } else if (starts_with_word(e, "TRYAGAIN") || starts_with_word(e, "CLUSTERDOWN") ||
                   starts_with_word(e, "READONLY") || starts_with_word(e, "MASTERDOWN") ||
                   starts_with_word(e, "LOADING")) {
          // A failover or a migration under way: sent again once the map is asked again.
          error_ = nodes_[n]->at.to_string() + ": " + std::string(e);
          again.push_back(i);
          ask_again = true;
        } else {
          ++out.refused;
          if (f) f(i, *r);
        }
      }
    }
    todo = std::move(again);
    if (ask_again && !todo.empty()) refresh_map();
  }
  out.complete = todo.empty();
  return out;
}

bool redis_cluster::scan(std::string_view match, const std::function<bool(std::string_view, std::string_view)>& f) {
  std::vector<std::uint16_t> primaries;
  for (const auto s : slots_) {
    if (s != k_none && std::find(primaries.begin(), primaries.end(), s) == primaries.end()) primaries.push_back(s);
  }
  bool more = true;
  for (const std::uint16_t n : primaries) {
    std::string cursor = "0";
    do {
      redisContext* c = connected(n);
      if (!c) return false;
      auto r = command(c, {"SCAN", cursor, "MATCH", match, "COUNT", "1000"});
      if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
          r->element[1]->type != REDIS_REPLY_ARRAY) {
        close(n, r ? "SCAN: unexpected reply" : std::string("SCAN: ") + c->errstr);
        return false;
      }
      cursor = std::string(str(r->element[0]));
      const redisReply* keys = r->element[1];
      // GETs through run(): a key whose slot moved meanwhile is followed (MGET would refuse keys of several slots).
      std::vector<std::vector<std::string_view>> gets;
      for (std::size_t i = 0; i < keys->elements; ++i) {
        if (keys->element[i]->type == REDIS_REPLY_STRING) gets.push_back({"GET", str(keys->element[i])});
      }
      const auto done = run(gets, [&](std::size_t i, const redisReply& v) {
        if (more && v.type == REDIS_REPLY_STRING) more = f(gets[i][1], str(&v));  // nil: expired meanwhile
      });
      if (!done.complete) return false;
    } while (cursor != "0" && more);
    if (!more) break;
  }
  return true;
}

}  // namespace smockron::master
