// Masters found by DNS (see master_discovery.hpp).
#include "proxy/cluster/master_discovery.hpp"

#include <ares.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <stdexcept>

#include "shared/protocol/dns_answer.hpp"

namespace smockron::proxy {

namespace {
constexpr int k_class_in = 1, k_type_srv = 33;
/// The loop wakes at least this often (to stop, and to start lookups that fell due).
constexpr auto k_tick = std::chrono::milliseconds(100);

std::chrono::seconds ttl_of(int ttl) { return std::chrono::seconds(std::max(ttl, 0)); }
}  // namespace

bool discovered_name::answered(const lookup_result& r, time_point now) {
  if (!r.ok || r.endpoints.empty()) {
    due_ = now + bounds_.min_ttl;
    return false;
  }
  std::vector<std::string> next = r.endpoints;
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  truncated_ = next.size() > bounds_.max_masters ? next.size() - bounds_.max_masters : 0;
  next.resize(std::min(next.size(), bounds_.max_masters));
  const auto ttl = std::clamp<std::chrono::microseconds>(r.ttl, bounds_.min_ttl, bounds_.max_ttl);
  due_ = now + ttl;
  if (next == masters_) return false;
  masters_ = std::move(next);
  return true;
}

// ---- the c-ares side -----------------------------------------------------------

struct master_discovery::state {
  options opts;
  on_change changed;
  std::vector<discovered_name> names;
  std::vector<bool> in_flight;  ///< a lookup of names[i] is under way
  mutable std::mutex mutex;     ///< guards names' masters for readers on other threads
  std::atomic<bool> stop{false};
  ares_channel channel = nullptr;
  std::shared_ptr<spdlog::logger> log = log::get("proxy.discovery");
  log::rate_limiter fail_log;
  metrics::counter* lookups_ok = nullptr;
  metrics::counter* lookups_failed = nullptr;
  metrics::counter* lookups_empty = nullptr;
  metrics::counter* changes = nullptr;

  void start(std::size_t i);
  /// `srv_truncated`: SRV targets an answer named beyond max_masters.
  void finish(std::size_t i, const lookup_result& r, std::size_t srv_truncated);
  std::size_t count() const;
};

namespace {

/// One lookup under way: an address lookup, or an SRV query and then one
/// address lookup per target. Deleted when its last part has answered.
struct lookup {
  master_discovery::state* st;
  std::size_t index;
  lookup_result result{.ok = true, .endpoints = {}, .ttl = std::chrono::seconds::max(), .error = {}};
  std::size_t outstanding = 0;
  std::size_t srv_truncated = 0;  ///< SRV targets beyond max_masters (not looked up)
};

void fail_part(lookup& l, const std::string& why) {
  if (l.result.ok) l.result.error = why;
  l.result.ok = false;
}

void part_done(lookup* l) {
  if (--l->outstanding > 0) return;
  if (l->result.ttl == std::chrono::seconds::max()) l->result.ttl = std::chrono::seconds(0);
  if (!l->st->stop.load()) l->st->finish(l->index, l->result, l->srv_truncated);
  delete l;
}

/// An address lookup's answer. One family per name: its IPv4 addresses, or
/// its IPv6 ones when it has none (a dual-stack host is one master, not two,
/// and "localhost" is 127.0.0.1 whatever /etc/hosts also says). `first_only`:
/// only the first of them (an SRV target is one master).
struct address_part {
  lookup* l;
  std::uint16_t port;
  bool first_only;
};

void on_addresses(void* arg, int status, int /*timeouts*/, ares_addrinfo* res) {
  auto* part = static_cast<address_part*>(arg);
  lookup* l = part->l;
  if (status == ARES_SUCCESS && res) {
    std::vector<std::string> v4, v6;
    for (const ares_addrinfo_node* n = res->nodes; n; n = n->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr = nullptr;
      if (n->ai_family == AF_INET) addr = &reinterpret_cast<const sockaddr_in*>(n->ai_addr)->sin_addr;
      else if (n->ai_family == AF_INET6) addr = &reinterpret_cast<const sockaddr_in6*>(n->ai_addr)->sin6_addr;
      if (!addr || !inet_ntop(n->ai_family, addr, text, sizeof text)) continue;
      (n->ai_family == AF_INET ? v4 : v6).push_back(tcp_endpoint(text, part->port));
      l->result.ttl = std::min(l->result.ttl, ttl_of(n->ai_ttl));
    }
    auto& chosen = v4.empty() ? v6 : v4;
    if (part->first_only && chosen.size() > 1) chosen.resize(1);
    l->result.endpoints.insert(l->result.endpoints.end(), chosen.begin(), chosen.end());
  } else if (status != ARES_SUCCESS) {
    // The name is gone, or has no addresses: an empty answer. A SRV target
    // that does not resolve, though, fails the lookup (the last good answer
    // is kept rather than losing that master over a stale record).
    const bool gone = status == ARES_ENOTFOUND || status == ARES_ENODATA;
    if (part->first_only || !gone) fail_part(*l, ares_strerror(status));
  }
  if (res) ares_freeaddrinfo(res);
  delete part;
  part_done(l);
}

void resolve_addresses(ares_channel ch, lookup* l, const std::string& name, std::uint16_t port, bool first_only) {
  ares_addrinfo_hints hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = ARES_AI_NOSORT;
  ++l->outstanding;
  ares_getaddrinfo(ch, name.c_str(), nullptr, &hints, on_addresses, new address_part{l, port, first_only});
}

struct srv_part {
  lookup* l;
  ares_channel ch;
  std::size_t max_targets;
};

void on_srv(void* arg, int status, int /*timeouts*/, unsigned char* abuf, int alen) {
  auto* part = static_cast<srv_part*>(arg);
  lookup* l = part->l;
  ares_srv_reply* reply = nullptr;
  if (status != ARES_SUCCESS) {
    // No such name, or no SRV records: an empty answer (kept as "nothing new"), not a failure.
    if (status != ARES_ENOTFOUND && status != ARES_ENODATA) fail_part(*l, ares_strerror(status));
  } else if (const int parsed = ares_parse_srv_reply(abuf, alen, &reply); parsed != ARES_SUCCESS) {
    fail_part(*l, std::string("SRV answer: ") + ares_strerror(parsed));
  } else if (!l->st->stop.load()) {
    const auto ttl = dns::answer_ttl({abuf, static_cast<std::size_t>(alen)});
    l->result.ttl = std::min(l->result.ttl, std::chrono::seconds(ttl.value_or(0)));
    // Sorted, a target listed twice once; beyond max_targets, the first in
    // order are used, so that every proxy picks the same ones whatever order
    // the server answers in.
    std::set<std::pair<std::string, std::uint16_t>> targets;
    for (const ares_srv_reply* r = reply; r; r = r->next) {
      // "." as the target: the service is decidedly not available here (RFC 2782).
      if (r->host && r->host[0] != '\0' && std::string_view(r->host) != ".") targets.emplace(r->host, r->port);
    }
    l->srv_truncated = targets.size() > part->max_targets ? targets.size() - part->max_targets : 0;
    std::size_t n = 0;
    for (const auto& [host, port] : targets) {
      if (n++ == part->max_targets) break;
      resolve_addresses(part->ch, l, host, port, true);
    }
  }
  if (reply) ares_free_data(reply);
  delete part;
  part_done(l);
}

}  // namespace

void master_discovery::state::start(std::size_t i) {
  in_flight[i] = true;
  auto* l = new lookup{this, i};
  l->outstanding = 1;  // the first part's, released by part_done below
  const dns_endpoint& where = names[i].where();
  if (where.type == dns_endpoint::kind::srv) {
    ++l->outstanding;
    ares_search(channel, where.name.c_str(), k_class_in, k_type_srv, on_srv,
                new srv_part{l, channel, opts.bounds.max_masters});
  } else {
    resolve_addresses(channel, l, where.name, where.port, false);
  }
  part_done(l);  // a lookup answered from /etc/hosts has already finished here
}

void master_discovery::state::finish(std::size_t i, const lookup_result& r, std::size_t srv_truncated) {
  in_flight[i] = false;
  discovered_name& n = names[i];
  const bool empty = r.ok && r.endpoints.empty();
  (r.ok ? (empty ? lookups_empty : lookups_ok) : lookups_failed)->inc();
  bool changed_now = false;
  {
    std::lock_guard lock(mutex);
    changed_now = n.answered(r, std::chrono::steady_clock::now());
  }
  if (!r.ok || empty) {
    std::uint64_t suppressed = 0;
    if (fail_log.allow(std::chrono::steady_clock::now(), suppressed)) {
      log->warn("{}: {}; keeping the {} master(s) of the last answer ({} similar suppressed)", n.configured(),
                r.ok ? "no records" : r.error, n.masters().size(), suppressed);
    }
    return;
  }
  if (const std::size_t beyond = n.truncated() + srv_truncated; beyond > 0) {
    std::uint64_t suppressed = 0;
    if (fail_log.allow(std::chrono::steady_clock::now(), suppressed)) {
      log->warn("{}: {} masters beyond dns_max_masters ({}) are not used ({} similar suppressed)", n.configured(),
                beyond, opts.bounds.max_masters, suppressed);
    }
  }
  if (!changed_now) return;
  changes->inc();
  std::string list;
  for (const auto& m : n.masters()) list += (list.empty() ? "" : " ") + m;
  log->info("{}: {} master(s): {}", n.configured(), n.masters().size(), list);
  changed(n.configured(), n.masters());
}

master_discovery::master_discovery(const std::vector<std::string>& configured, options o, on_change f,
                                   metrics::registry& reg)
    : state_(std::make_shared<state>()) {
  state& st = *state_;
  st.opts = std::move(o);
  st.changed = std::move(f);
  std::set<std::string> seen;
  for (const auto& c : configured) {
    const auto where = parse_dns_endpoint(c);
    if (where && seen.insert(c).second) st.names.emplace_back(c, *where, st.opts.bounds);
  }
  st.in_flight.assign(st.names.size(), false);
  const auto lookups = [&](const char* result) {
    return &reg.add_counter("smockron_proxy_dns_lookups_total",
                            "Lookups of the names masters are found by, by result (failed and empty ones keep the "
                            "masters of the last good answer)",
                            metrics::labels({{"result", result}}));
  };
  st.lookups_ok = lookups("ok");
  st.lookups_failed = lookups("failed");
  st.lookups_empty = lookups("empty");
  st.changes = &reg.add_counter("smockron_proxy_dns_master_changes_total",
                                "Answers that changed the masters a name stands for (masters added, gone or moved)");

  if (const int rc = ares_library_init(ARES_LIB_INIT_ALL); rc != ARES_SUCCESS)
    throw std::runtime_error(std::string("c-ares: ") + ares_strerror(rc));
  ares_options ao{};
  // A lookup that is not answered fails within ~3 s per server (1 s, then 2 s; not c-ares' 4 tries from 5 s),
  // so that the next one starts soon; the last good answer is used meanwhile.
  ao.timeout = 1000;
  ao.tries = 2;
  if (const int rc = ares_init_options(&st.channel, &ao, ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES); rc != ARES_SUCCESS) {
    ares_library_cleanup();
    throw std::runtime_error(std::string("c-ares: ") + ares_strerror(rc));
  }
  if (!st.opts.servers.empty()) {
    std::string csv;
    for (const auto& s : st.opts.servers) {
      // c-ares reads "ip", "ip:port" and "[v6]:port"; a bare IPv6 address needs no brackets.
      csv += (csv.empty() ? "" : ",") + s;
    }
    if (const int rc = ares_set_servers_ports_csv(st.channel, csv.c_str()); rc != ARES_SUCCESS) {
      ares_destroy(st.channel);
      ares_library_cleanup();
      throw std::runtime_error("dns_servers \"" + csv + "\": " + ares_strerror(rc));
    }
  }
  // Registered once nothing above can throw; it holds the state, not this object.
  reg.add_callback("smockron_proxy_dns_masters", "Masters found by DNS, over every name", "",
                   [st = state_] { return static_cast<double>(st->count()); });
  thread_ = std::thread([this] { run(); });
}

master_discovery::~master_discovery() {
  state_->stop = true;
  thread_.join();
  ares_destroy(state_->channel);  // pending lookups answer ARES_EDESTRUCTION: freed, not applied
  ares_library_cleanup();
}

std::size_t master_discovery::state::count() const {
  std::lock_guard lock(mutex);
  std::size_t n = 0;
  for (const auto& d : names) n += d.masters().size();
  return n;
}

void master_discovery::run() {
  state& st = *state_;
  while (!st.stop.load()) {
    const auto now = std::chrono::steady_clock::now();
    auto wake = now + k_tick;
    for (std::size_t i = 0; i < st.names.size(); ++i) {
      if (!st.in_flight[i] && st.names[i].due() <= now) st.start(i);
      if (!st.in_flight[i]) wake = std::min(wake, st.names[i].due());
    }
    ares_socket_t socks[ARES_GETSOCK_MAXNUM];
    const int mask = ares_getsock(st.channel, socks, ARES_GETSOCK_MAXNUM);
    pollfd fds[ARES_GETSOCK_MAXNUM];
    nfds_t count = 0;
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      const bool r = ARES_GETSOCK_READABLE(mask, i), w = ARES_GETSOCK_WRITABLE(mask, i);
      if (!r && !w) continue;
      fds[count++] = pollfd{socks[i], static_cast<short>((r ? POLLIN : 0) | (w ? POLLOUT : 0)), 0};
    }
    timeval max_wait{};
    const auto until_wake = std::max<std::chrono::microseconds>(
        std::chrono::duration_cast<std::chrono::microseconds>(wake - now), std::chrono::microseconds(0));
    max_wait.tv_sec = static_cast<time_t>(until_wake.count() / 1'000'000);
    max_wait.tv_usec = static_cast<suseconds_t>(until_wake.count() % 1'000'000);
    timeval tv{};
    const timeval* t = ares_timeout(st.channel, &max_wait, &tv);
    const int timeout_ms = static_cast<int>(t->tv_sec * 1000 + (t->tv_usec + 999) / 1000);
    const int ready = ::poll(fds, count, timeout_ms);
    if (ready <= 0) {
      ares_process_fd(st.channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts and retries
      continue;
    }
    for (nfds_t i = 0; i < count; ++i) {
      const bool r = (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0, w = (fds[i].revents & POLLOUT) != 0;
      if (r || w) ares_process_fd(st.channel, r ? fds[i].fd : ARES_SOCKET_BAD, w ? fds[i].fd : ARES_SOCKET_BAD);
    }
  }
}

}  // namespace smockron::proxy
