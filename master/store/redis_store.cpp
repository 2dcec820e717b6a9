// Redis write-behind store (see redis_store.hpp). hiredis's blocking API on a
// thread of its own: every call is bounded by the configured timeout.
#include "master/store/redis_store.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "master/store/hiredis_util.hpp"
#include "shared/base/log.hpp"

namespace smockron::master {
namespace {

constexpr std::size_t k_load_chunk = 1024;

using hiredis::command;
using hiredis::reply_ptr;
using hiredis::str;
using hiredis::to_timeval;

}  // namespace

redis_store::redis_store(options o, metrics::registry& reg)
    : opt_(std::move(o)),
      sentinels_(opt_.url.sentinels),
      current_(opt_.url.sentinels.empty() ? opt_.url.address : opt_.url.sentinels.front()),
      up_gauge_(reg.add_gauge("smockron_master_redis_up", "1 while the Redis store is connected")),
      writes_(reg.add_counter("smockron_master_redis_writes_total",
                              "Writes Redis took (states, and open reservations written or deleted)")),
      write_errors_(
          reg.add_counter("smockron_master_redis_write_errors_total", "Writes Redis refused (error replies)")),
      connection_errors_(reg.add_counter("smockron_master_redis_connection_errors_total",
                                         "Failed connects and lost connections to Redis")),
      connects_(reg.add_counter("smockron_master_redis_connects_total", "Successful connections to Redis")),
      loaded_total_(reg.add_counter("smockron_master_redis_loaded_total", "States read back from Redis at start-up")),
      flush_seconds_(reg.add_histogram("smockron_master_redis_flush_seconds",
                                       "Time to write one pipelined batch to Redis",
                                       metrics::exponential_buckets(1e-5, 2, 18))) {
  down_since_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
  if (!opt_.url.cluster.empty()) {
    cluster_ = std::make_unique<redis_cluster>(
        redis_cluster::options{.seeds = opt_.url.cluster, .password = opt_.url.password, .timeout = opt_.timeout});
    reg.add_counter_callback("smockron_master_redis_cluster_redirects_total",
                             "MOVED and ASK replies the Redis Cluster client followed",
                             [this] { return static_cast<double>(redirects_.load(std::memory_order_relaxed)); });
  }
  thread_ = std::thread([this] { run(); });
}

redis_store::~redis_store() { stop(opt_.timeout * 2); }

void redis_store::stop(std::chrono::milliseconds deadline) {
  {
    std::lock_guard lock(mutex_);
    if (!stop_) {
      stop_ = true;
      stop_deadline_ = std::chrono::steady_clock::now() + deadline;
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void redis_store::submit(std::vector<write> batch) {
  if (batch.empty()) return;
  queued_.fetch_add(batch.size(), std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    if (pending_.empty()) pending_ = std::move(batch);
    else pending_.insert(pending_.end(), std::make_move_iterator(batch.begin()), std::make_move_iterator(batch.end()));
    pending_flag_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
}

std::vector<redis_store::loaded_override> redis_store::take_loaded_overrides() {
  std::lock_guard lock(mutex_);
  return std::exchange(loaded_overrides_, {});
}

std::vector<reservation_record> redis_store::take_loaded_reservations() {
  std::lock_guard lock(mutex_);
  return std::exchange(loaded_reservations_, {});
}

std::vector<redis_store::loaded> redis_store::take_loaded() {
  if (!loaded_flag_.load(std::memory_order_acquire)) return {};
  std::lock_guard lock(mutex_);
  loaded_flag_.store(false, std::memory_order_relaxed);
  return std::exchange(loaded_chunk_, {});
}

host_port redis_store::current() const {
  std::lock_guard lock(mutex_);
  return current_;
}

std::string redis_store::describe() const {
  std::string where = "redis " + current().to_string() + "/" + std::to_string(opt_.url.db);
  if (!opt_.url.sentinels.empty()) where += " (primary \"" + opt_.url.primary_name + "\" from Sentinel)";
  if (cluster_) where = "redis cluster (" + std::to_string(cluster_primaries_.load()) + " primaries)";
  if (up()) return where + ": connected";
  const auto since = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(down_since_ns_.load()));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  char buf[160];
  std::snprintf(buf, sizeof buf, ": unreachable for %.1fs (deciding from memory; writes resume when it returns)", s);
  return where + buf;
}

void redis_store::wait_stop(std::chrono::milliseconds d) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, d, [&] { return stop_; });
}

void redis_store::disconnect(const char* what) {
  auto log = log::get("master");
  if (cluster_) {
    log->warn("redis cluster: {}: {}", what, cluster_->error());
    cluster_->reset();
    cluster_up_ = false;
  } else {
    log->warn("redis {}: {}: {}", current().to_string(), what, ctx_ && ctx_->err ? ctx_->errstr : "bad reply");
  }
  ctx_.reset();
  connection_errors_.inc();
  if (up_.exchange(false)) down_since_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
  up_gauge_.set(0);
}

std::optional<host_port> redis_store::discover() {
  // Sentinel's client guidelines: ask each Sentinel in turn, and start with
  // the one that answered last time.
  auto log = log::get("master");
  for (std::size_t i = 0; i < sentinels_.size(); ++i) {
    const host_port& s = sentinels_[i];
    context c(redisConnectWithTimeout(s.host.c_str(), s.port, to_timeval(opt_.timeout)));
    if (!c || c->err) {
      log->debug("redis sentinel {}: {}", s.to_string(), c ? c->errstr : "out of memory");
      continue;
    }
    redisSetTimeout(c.get(), to_timeval(opt_.timeout));
    auto r = command(c.get(), {"SENTINEL", "get-master-addr-by-name", opt_.url.primary_name});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING) {
      log->warn("redis sentinel {}: no primary named \"{}\" ({})", s.to_string(), opt_.url.primary_name,
                !r                             ? std::string(c->errstr)
                : r->type == REDIS_REPLY_ERROR ? std::string(str(r.get()))
                                               : "no answer");
      continue;
    }
    int port = 0;
    const std::string_view p = str(r->element[1]);
    const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (ec != std::errc() || end != p.data() + p.size() || port <= 0 || port > 65535) continue;
    std::rotate(sentinels_.begin(), sentinels_.begin() + static_cast<std::ptrdiff_t>(i), sentinels_.end());
    return host_port{std::string(str(r->element[0])), static_cast<std::uint16_t>(port)};
  }
  return std::nullopt;
}

bool redis_store::connect() {
  if (cluster_) {
    // Up once the slot map is known and every primary answers.
    if (!cluster_->refresh() || !cluster_->ping()) {
      log::get("master")->debug("redis cluster: {}", cluster_->error());
      cluster_->reset();
      connection_errors_.inc();
      return false;
    }
    cluster_primaries_ = cluster_->primaries();
    cluster_up_ = true;
    connects_.inc();
    up_ = true;
    up_gauge_.set(1);
    log::get("master")->info("redis cluster connected ({} primaries)", cluster_->primaries());
    return true;
  }
  host_port target = opt_.url.address;
  if (!sentinels_.empty()) {
    auto primary = discover();
    if (!primary) {
      connection_errors_.inc();
      return false;
    }
    target = std::move(*primary);
  }
  {
    std::lock_guard lock(mutex_);
    current_ = target;
  }
  ctx_.reset(redisConnectWithTimeout(target.host.c_str(), target.port, to_timeval(opt_.timeout)));
  if (!ctx_ || ctx_->err) {
    if (ctx_) ctx_.reset();
    connection_errors_.inc();
    return false;
  }
  redisSetTimeout(ctx_.get(), to_timeval(opt_.timeout));
  if (!opt_.url.password.empty()) {
    auto r = command(ctx_.get(), {"AUTH", opt_.url.password});
    if (!r || r->type == REDIS_REPLY_ERROR) {
      disconnect("AUTH failed");
      return false;
    }
  }
  if (opt_.url.db != 0) {
    const std::string db = std::to_string(opt_.url.db);
    auto r = command(ctx_.get(), {"SELECT", db});
    if (!r || r->type == REDIS_REPLY_ERROR) {
      disconnect("SELECT failed");
      return false;
    }
  }
  // Sentinel may name a primary that was demoted since (its answer is a
  // moment old): only the node itself knows its role.
  if (!sentinels_.empty() && !is_primary()) {
    disconnect("not the primary (ROLE); asking Sentinel again");
    return false;
  }
  // A hung server still completes the TCP handshake (the kernel does it):
  // only an answer proves it is there.
  if (auto r = command(ctx_.get(), {"PING"}); !r || r->type == REDIS_REPLY_ERROR) {
    ctx_.reset();
    connection_errors_.inc();
    return false;
  }
  connects_.inc();
  up_ = true;
  up_gauge_.set(1);
  log::get("master")->info("redis {} connected (db {}{})", target.to_string(), opt_.url.db,
                           sentinels_.empty() ? "" : ", primary \"" + opt_.url.primary_name + "\" from Sentinel");
  return true;
}

bool redis_store::scan(std::string_view prefix, const std::function<bool(std::string_view, std::string_view)>& f) {
  std::string match;
  for (const char c : prefix) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') match += '\\';  // a glob's, taken literally
    match += c;
  }
  match += '*';
  if (cluster_) {
    // Node by node; the keys come back as the store's records spell them.
    if (!cluster_->scan(match,
                        [&](std::string_view key, std::string_view value) { return f(plain_key(key), value); })) {
      redirects_ = cluster_->redirects();
      disconnect("SCAN failed");
      return false;
    }
    redirects_ = cluster_->redirects();
    return true;
  }
  std::string cursor = "0";
  bool more = true;
  do {
    auto r = command(ctx_.get(), {"SCAN", cursor, "MATCH", match, "COUNT", "1000"});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
      disconnect("SCAN failed");
      return false;
    }
    cursor = std::string(str(r->element[0]));
    const redisReply* keys = r->element[1];
    if (keys->elements == 0) continue;
    std::vector<std::string_view> args{"MGET"};
    for (std::size_t i = 0; i < keys->elements; ++i) args.push_back(str(keys->element[i]));
    auto values = command(ctx_.get(), args);
    if (!values || values->type != REDIS_REPLY_ARRAY || values->elements != keys->elements) {
      disconnect("MGET failed");
      return false;
    }
    for (std::size_t i = 0; i < values->elements && more; ++i) {
      const redisReply* v = values->element[i];
      if (v->type == REDIS_REPLY_STRING) more = f(str(keys->element[i]), str(v));  // nil: expired meanwhile
    }
  } while (cursor != "0" && more);
  return true;
}

bool redis_store::load() {
  std::size_t total = 0;
  std::vector<loaded> chunk;
  auto publish = [&] {
    if (chunk.empty()) return;
    loaded_total_.inc(chunk.size());
    std::lock_guard lock(mutex_);
    loaded_chunk_.insert(loaded_chunk_.end(), std::make_move_iterator(chunk.begin()),
                         std::make_move_iterator(chunk.end()));
    loaded_flag_.store(true, std::memory_order_release);
    chunk.clear();
  };
  // The API's overrides first: the states restored after them are checked against their rules.
  std::vector<loaded_override> overrides;
  if (!scan(k_override_prefix, [&](std::string_view key, std::string_view value) {
        key.remove_prefix(k_override_prefix.size());
        const auto nul = key.find('\0');
        if (nul != std::string_view::npos) {
          overrides.push_back({std::string(key.substr(0, nul)), std::string(key.substr(nul + 1)), std::string(value)});
        }
        return overrides.size() < 100'000;
      })) {
    return false;
  }
  {
    std::lock_guard lock(mutex_);
    loaded_overrides_ = std::move(overrides);
  }
  const bool states_read = scan(k_store_prefix, [&](std::string_view key, std::string_view value) {
    std::string_view domain, identifier;
    if (!split_store_key(key, domain, identifier)) return true;
    auto st = decode_state(value);
    if (!st) return true;
    chunk.push_back({std::string(domain), std::string(identifier), st->algo, std::move(st->st), std::move(st->tier)});
    ++total;
    if (chunk.size() >= k_load_chunk) publish();
    return total < opt_.load_limit;
  });
  publish();
  if (!states_read) return false;
  // The reservations come after the states they were charged in.
  std::vector<reservation_record> open;
  if (!scan(reservation_prefix(opt_.reservation_owner), [&](std::string_view key, std::string_view value) {
        auto r = decode_reservation(key, value);
        if (r && r->owner == opt_.reservation_owner) open.push_back(std::move(*r));
        return open.size() < opt_.load_limit;
      })) {
    return false;
  }
  const std::size_t reservations = open.size();
  {
    std::lock_guard lock(mutex_);
    loaded_reservations_ = std::move(open);
  }
  log::get("master")->info("redis: read {} state(s) and {} open reservation(s) back", total, reservations);
  return true;
}

bool redis_store::write_cluster(const std::vector<write>& batch) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::string> keys, ttls;
  keys.reserve(batch.size());
  ttls.reserve(batch.size());
  std::vector<std::vector<std::string_view>> commands;
  commands.reserve(batch.size());
  for (const write& w : batch) {
    keys.push_back(cluster_key(w.key));
    ttls.push_back(std::to_string(std::max<std::int64_t>(1, w.ttl_ms)));
    if (w.erase) commands.push_back({"DEL", keys.back()});
    else if (w.keep) commands.push_back({"SET", keys.back(), w.value});
    else commands.push_back({"SET", keys.back(), w.value, "PX", ttls.back()});
  }
  const auto done = cluster_->run(commands);
  redirects_ = cluster_->redirects();
  if (!done.complete) {
    // Written again whole once the cluster answers (a SET or DEL twice is the
    // same); counted then, so that a key is counted once.
    disconnect("writing states failed");
    return false;
  }
  writes_.inc(done.ok);
  write_errors_.inc(done.refused);
  flush_seconds_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return true;
}

bool redis_store::write_batch(const std::vector<write>& batch) {
  if (cluster_) return write_cluster(batch);
  const auto started = std::chrono::steady_clock::now();
  std::string ttl;
  for (const write& w : batch) {
    ttl = std::to_string(std::max<std::int64_t>(1, w.ttl_ms));
    const char* argv[] = {"SET", w.key.data(), w.value.data(), "PX", ttl.data()};
    const std::size_t lens[] = {3, w.key.size(), w.value.size(), 2, ttl.size()};
    const char* del[] = {"DEL", w.key.data()};
    const std::size_t del_lens[] = {3, w.key.size()};
    const int n = w.erase ? 2 : w.keep ? 3 : 5;  // SET without PX: no expiry
    if (redisAppendCommandArgv(ctx_.get(), n, w.erase ? del : argv, w.erase ? del_lens : lens) != REDIS_OK) {
      disconnect("pipelining a write failed");
      return false;
    }
  }
  std::uint64_t ok = 0, refused = 0, readonly = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || !raw) {
      writes_.inc(ok);
      write_errors_.inc(refused);
      disconnect("writing states failed");
      return false;
    }
    reply_ptr r(static_cast<redisReply*>(raw));
    if (r->type != REDIS_REPLY_ERROR) ++ok;
    else if (str(r.get()).starts_with("READONLY")) ++readonly;  // a replica now: a failover happened
    else ++refused;
  }
  writes_.inc(ok);
  write_errors_.inc(refused);
  if (readonly > 0) {
    // The whole batch is written again to the new primary (what this node
    // took is there too, or was lost with it: rewriting is always right).
    disconnect("the node became a replica (READONLY)");
    return false;
  }
  flush_seconds_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return true;
}

bool redis_store::is_primary() {
  auto r = command(ctx_.get(), {"ROLE"});
  return r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && r->element[0]->type == REDIS_REPLY_STRING &&
         str(r->element[0]) == "master";
}

bool redis_store::ping() {
  if (cluster_) {
    // A primary that died while this master was idle: its slots are asked again until a replica took them.
    if (!cluster_->refresh() || !cluster_->ping()) {
      disconnect("a primary does not answer");
      return false;
    }
    cluster_primaries_ = cluster_->primaries();
    return true;
  }
  // Through Sentinel, the idle check is ROLE: a primary demoted to a replica
  // (a failover while this master was idle) is left at once.
  if (!sentinels_.empty()) {
    if (!is_primary()) {
      disconnect(ctx_ && ctx_->err ? "ROLE failed" : "no longer the primary (ROLE); asking Sentinel again");
      return false;
    }
    return true;
  }
  auto r = command(ctx_.get(), {"PING"});
  if (!r || r->type == REDIS_REPLY_ERROR) {
    disconnect("PING failed");
    return false;
  }
  return true;
}

void redis_store::run() {
  auto backoff = std::chrono::milliseconds(50);
  std::vector<write> in_flight;
  for (;;) {
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      stopping = stop_;
      if (stopping && ((in_flight.empty() && pending_.empty()) || std::chrono::steady_clock::now() >= stop_deadline_)) {
        break;
      }
    }
    if (cluster_ ? !cluster_up_ : !ctx_) {
      if (!connect()) {
        settled_.store(true, std::memory_order_release);
        if (stopping) break;
        wait_stop(backoff);
        backoff = std::min(backoff * 2, opt_.max_backoff);
        continue;
      }
      backoff = std::chrono::milliseconds(50);
      if (!loaded_) {
        if (!load()) continue;
        loaded_ = true;
      }
      settled_.store(true, std::memory_order_release);
      resync_.store(true, std::memory_order_release);  // Redis may have lost what it had
    }
    if (in_flight.empty()) {
      std::unique_lock lock(mutex_);
      if (pending_.empty() && !stop_)
        cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) {
        const bool s = stop_;
        lock.unlock();
        if (!s) ping();  // notices a dead Redis while idle, for /readyz
        continue;
      }
      in_flight.swap(pending_);
      pending_flag_.store(false, std::memory_order_release);
    }
    if (write_batch(in_flight)) {
      queued_.fetch_sub(in_flight.size(), std::memory_order_relaxed);
      in_flight.clear();
    }  // else kept, retried after reconnecting
  }
  up_ = false;
  up_gauge_.set(0);
}

}  // namespace smockron::master
