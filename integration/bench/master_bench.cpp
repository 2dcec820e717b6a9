// Master benchmark. In one run:
//  1. the raw ceiling of ZeroMQ on this machine: a bare PUB -> SUB (separate
//     processes) of the same six-frame accounting messages, no master logic;
//  2. smockron-master ingest: the same publisher drives the real master with
//     many identifiers and a realistic ACCEPTED/DELAYED mix, counted by the
//     master's own /metrics; control messages/s received back;
//  3. the control-loop latency (accounting sent -> DELAY_UNTIL received)
//     p50/p99 while the master is paced at a fixed rate (default 100k/s).
// Phases 1 and 2 also report the CPU time each receiver spent per message
// (all its threads): when the master keeps up with the publisher, both rates
// are the publisher's, and the CPU per message says which receiver does
// less work for each.
// With --redis, phase 2 runs again against a master with store = "redis" (a
// redis-server started and killed by this program) and prints the ratio.
// With --curve, phases 2 and 3 run again with CURVE on both links (the
// publisher and the control subscriber are libzmq CURVE clients, keys made
// here; messages go in BATCHes of 64, as a gatekeeper on a CURVE link packs
// them) and the ratios to plaintext are printed: rate, and the master's CPU
// per message.
// With --pace-share, phases 2 and 3 run again against a master with
// the bench domain under GCRA (its sliding log of burst 20 is exactly
// logged, which is not shared), once with the publisher naming none
// (nothing counted) and once naming itself as a
// gatekeeper (the ZMTP READY property X-Gatekeeper, as a proxy does), so
// that every message that leaves a client held is counted for its pace
// share; the ratio of the two is printed.
// With --costs, every phase's mix is a token budget's (see load_mix): known
// costs, reservations and their corrections, bare ZeroMQ included; the bench
// domain's rule is then scaled by the mean cost (500 units/s, burst 1,000, a
// sliding-window counter), so that about as many messages throttle as with
// unit costs against 10/s burst 20. (Against 10/s burst 20, every message
// would throttle, and costs over the burst are ones a gatekeeper refuses
// before they reach the master.)
// High-water marks are set deliberately (large) so nothing is dropped
// silently; any shortfall is reported as drops.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench_util.hpp"
#include "shared/protocol/wire_batch.hpp"

using namespace std::chrono;
using namespace std::string_literals;

namespace {

struct options {
  std::string master = "build/bin/smockron-master";
  long messages = 2'000'000;
  long identifiers = 100'000;
  long latency_rate = 100'000;
  double latency_seconds = 5;
  int base_port = 0;
  bool pin = false;
  bool redis = false;       ///< also measure ingest with store = "redis" (starts its own redis-server)
  bool curve = false;       ///< also measure with CURVE on both links
  bool pace_share = false;  ///< also measure with pace_share = true and a named publisher
  bool costs = false;       ///< every phase's mix carries costs, reservations and their corrections
};

/// libzmq's ZMQ_METADATA (a draft option in the header, in the library
/// since 4.3): "X-Name:value" properties sent in the handshake's READY.
constexpr int k_zmq_metadata = 95;

/// CURVE keys for one run: the master's and the publisher's (Z85), and the
/// master's config lines naming them (files written under /tmp). Empty: plaintext.
struct curve_setup {
  char master_public[41] = {}, master_secret[41] = {}, client_public[41] = {}, client_secret[41] = {};
  std::string config;
  bool on() const { return !config.empty(); }
  static curve_setup make() {
    curve_setup c;
    zmq_curve_keypair(c.master_public, c.master_secret);
    zmq_curve_keypair(c.client_public, c.client_secret);
    const std::string base = "/tmp/smockron-master-bench-" + std::to_string(::getpid());
    std::ofstream(base + ".key") << c.master_secret << "\n";
    std::ofstream(base + ".allowed") << c.client_public << "\n";
    c.config = "curve_secret_key = \"" + base + ".key\"\ncurve_allowed_keys = \"" + base + ".allowed\"\n";
    return c;
  }
  /// Makes `s` a CURVE client of the master (before it connects).
  void client(zmq::socket_t& s) const {
    if (!on()) return;
    s.set(zmq::sockopt::curve_serverkey, std::string(master_public));
    s.set(zmq::sockopt::curve_publickey, std::string(client_public));
    s.set(zmq::sockopt::curve_secretkey, std::string(client_secret));
  }
};

const int k_hwm = 10'000'000;

std::int64_t wall_ms() { return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count(); }

using smockron::bench::free_port;
using smockron::bench::pin_to;

using smockron::bench::http_get;
using smockron::bench::metric_sum;

void send_frames(zmq::socket_t& s, const std::string_view* f, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    s.send(zmq::const_buffer(f[i].data(), f[i].size()), i + 1 < n ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

// Frames are views: the strings they point into must outlive the send.
const std::string k_bench_domain = "bench\0"s;
const std::string k_lat_domain = "lat\0"s;

// One accounting message of the load mix: identifiers drawn with a hot set
// (1% of identifiers get 20% of traffic); 20% DELAYED. With `costs`, as
// gatekeepers of a token budget send them: 8 in 10 carry a known cost
// (`cost=N`, N from 1 to 100), one reserves an estimate (`reserve=50`, an
// ACCEPTED use) and the next corrects it (a REJECTED `adjust=D`, D from -50
// to +50, naming the reservation's identifier and time; it takes a DELAYED
// one's place, so 10% are DELAYED), so the master charges units, opens and
// closes reservations.
struct load_mix {
  explicit load_mix(long identifiers, bool with_costs = false)
      : ids(static_cast<std::size_t>(identifiers)), costs(with_costs) {
    for (long i = 0; i < identifiers; ++i) ids[static_cast<std::size_t>(i)] = "client-" + std::to_string(i);
    for (int c = 0; c <= 100; ++c) cost_info[static_cast<std::size_t>(c)] = "cost=" + std::to_string(c);
    for (int d = -50; d <= 50; ++d) adjust_info[static_cast<std::size_t>(d + 50)] = "adjust=" + std::to_string(d);
  }
  void send(zmq::socket_t& s, long i, std::int64_t now_ms) {
    const std::size_t n = ids.size();
    const std::size_t hot = std::max<std::size_t>(1, n / 100);
    const std::uint64_t h = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ULL;
    std::size_t id = (h >> 61) == 0 ? (h >> 20) % hot : (h >> 20) % n;
    const bool delayed = (i % 5) == 4;
    if (now_ms != cached_ms) {  // timestamps change once per millisecond
      cached_ms = now_ms;
      received = std::to_string(now_ms);
      later = std::to_string(now_ms + 50);
    }
    std::string_view status = delayed ? "DELAYED" : "ACCEPTED";
    std::string_view at = received;
    std::string_view info = "bench-loadgen";
    if (costs) {
      switch (i % 10) {
        case 8:  // (8 % 5: ACCEPTED) a reservation, corrected by the next message
          info = "reserve=50";
          reserved_id = id;
          reserved_at = received;
          break;
        case 9:  // (9 % 5: DELAYED, made a correction)
          status = "REJECTED";
          id = reserved_id;
          at = reserved_at;
          info = adjust_info[(h >> 8) % adjust_info.size()];
          break;
        default: info = cost_info[1 + (h >> 8) % 100];
      }
    }
    const std::string_view f[6] = {
        k_bench_domain, status, ids[id], at, status == "DELAYED" ? std::string_view(later) : std::string_view(), info};
    if (!batched) return send_frames(s, f, 6);
    // As a gatekeeper on a CURVE link sends them: BATCHes of what leaves together.
    smockron::wire::append_batch_record(records, std::span<const std::string_view>(f + 1, 5));
    if (++in_batch == k_batch) flush(s);
  }
  /// Sends what is batched (a gatekeeper's flush).
  void flush(zmq::socket_t& s) {
    if (records.empty()) return;
    const std::string_view f[3] = {k_bench_domain, smockron::wire::batch_status, records};
    send_frames(s, f, 3);
    records.clear();
    in_batch = 0;
  }
  static constexpr int k_batch = 64;  ///< a proxy's flush at ~30k requests/s per worker (2 ms)
  std::vector<std::string> ids;
  bool costs = false;
  std::array<std::string, 101> cost_info;    ///< "cost=0" .. "cost=100"
  std::array<std::string, 101> adjust_info;  ///< "adjust=-50" .. "adjust=50"
  std::size_t reserved_id = 0;               ///< the last reservation's identifier
  std::string reserved_at;                   ///< and its time
  std::int64_t cached_ms = -1;
  std::string received, later;
  bool batched = false;
  std::string records;
  int in_batch = 0;
};

// CPU time of this process (every thread), in seconds.
double process_cpu_seconds() {
  rusage r{};
  ::getrusage(RUSAGE_SELF, &r);
  const auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return s(r.ru_utime) + s(r.ru_stime);
}

// CPU time of process `pid` (every thread), in seconds (clock-tick resolution).
double process_cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// What one receiver did with the load: messages per second, CPU per message.
struct receiver_figures {
  double rate = 0;
  double cpu_ns = 0;
};

// Phase 1 child: a bare SUB that counts messages and reports on a pipe.
[[noreturn]] void bare_subscriber(const std::string& endpoint, long expected, int report_fd) {
  zmq::context_t ctx(1);
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::rcvhwm, k_hwm);
  sub.set(zmq::sockopt::rcvbuf, 4 * 1024 * 1024);
  sub.bind(endpoint);
  sub.set(zmq::sockopt::subscribe, k_bench_domain);
  zmq::message_t frames[8];
  long count = 0;
  bool ready = false;
  steady_clock::time_point first{}, last{};
  double cpu_first = 0, cpu_last = 0;
  sub.set(zmq::sockopt::rcvtimeo, 3000);
  while (count < expected) {
    std::size_t n = 0;
    bool probe = false;
    for (;; ++n) {
      zmq::message_t& m = frames[std::min<std::size_t>(n, 7)];
      if (!sub.recv(m)) goto done;
      if (n == 2) probe = m.to_string_view() == "probe";
      if (!m.more()) break;
    }
    if (probe) {
      if (!ready) {
        ready = true;
        (void)!::write(report_fd, "R", 1);
      }
      continue;
    }
    if (count == 0) {
      first = steady_clock::now();
      cpu_first = process_cpu_seconds();
    }
    ++count;
    last = steady_clock::now();
  }
done:
  cpu_last = process_cpu_seconds();
  const double secs = duration<double>(last - first).count();
  char buf[128];
  const int len = std::snprintf(buf, sizeof buf, "%ld %.6f %.6f\n", count, secs, cpu_last - cpu_first);
  (void)!::write(report_fd, buf, static_cast<std::size_t>(len));
  std::_Exit(0);
}

receiver_figures zmq_ceiling(const options& o) {
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    if (o.pin) pin_to(1);
    bare_subscriber(endpoint, o.messages, fds[1]);
  }
  ::close(fds[1]);
  zmq::context_t ctx(1);
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.set(zmq::sockopt::sndhwm, k_hwm);
  pub.set(zmq::sockopt::sndbuf, 4 * 1024 * 1024);
  pub.connect(endpoint);
  // Probe until the subscriber has seen one (the subscription has arrived).
  const std::string now = std::to_string(wall_ms());
  const std::string_view probe[5] = {k_bench_domain, "ACCEPTED", "probe", now, ""};
  char c = 0;
  for (int i = 0; i < 5000; ++i) {
    send_frames(pub, probe, 5);
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 1) > 0 && ::read(fds[0], &c, 1) == 1) break;
  }
  if (c != 'R') {
    std::fprintf(stderr, "bare subscriber never became ready\n");
    return {};
  }
  load_mix mix(o.identifiers, o.costs);
  const std::int64_t t = wall_ms();
  for (long i = 0; i < o.messages; ++i) mix.send(pub, i, t + i / 500'000);
  char buf[128] = {};
  std::size_t got = 0;
  for (ssize_t n; got < sizeof buf - 1 && (n = ::read(fds[0], buf + got, sizeof buf - 1 - got)) > 0;)
    got += static_cast<std::size_t>(n);
  ::waitpid(child, nullptr, 0);
  ::close(fds[0]);
  long count = 0;
  double secs = 0, cpu = 0;
  std::sscanf(buf, "%ld %lf %lf", &count, &secs, &cpu);
  receiver_figures r;
  r.rate = secs > 0 ? static_cast<double>(count) / secs : 0;
  r.cpu_ns = count > 0 ? cpu * 1e9 / static_cast<double>(count) : 0;
  std::printf("zeromq bare PUB->SUB:   %10.0f msg/s  (%ld of %ld received, %ld dropped), %.0f ns CPU per message\n",
              r.rate, count, o.messages, o.messages - count, r.cpu_ns);
  return r;
}

struct master_process {
  pid_t pid = -1;
  int admin = 0;
  std::string accounting, control, config_path;

  /// `store_config`: more [master] keys; `bench_domain`: more keys of the bench domain.
  void start(const options& o, const std::string& store_config = "", const std::string& bench_domain = "") {
    admin = free_port();
    accounting = "tcp://127.0.0.1:" + std::to_string(free_port());
    control = "tcp://127.0.0.1:" + std::to_string(free_port());
    config_path = "/tmp/smockron-master-bench-" + std::to_string(::getpid()) + ".toml";
    std::ofstream(config_path) << "[master]\naccounting = \"" << accounting << "\"\ncontrol = \"" << control
                               << "\"\nadmin = \"127.0.0.1:" << admin
                               << "\"\ncontrol_hwm = 10000000\nmax_identifiers = 2000000\n"
                               << store_config << "[master.domains.bench]\nrules = [ { rate = \""
                               << (o.costs ? "500/s" : "10/s") << "\", burst = " << (o.costs ? 1000 : 20) << " } ]\n"
                               << bench_domain << "[master.domains.lat]\nrules = [ { rate = \"1/h\", burst = 1 } ]\n";
    pid = ::fork();
    if (pid == 0) {
      if (o.pin) pin_to(1);
      ::execl(o.master.c_str(), o.master.c_str(), "--config", config_path.c_str(), "--log-level", "warn", nullptr);
      std::perror("exec smockron-master");
      std::_Exit(127);
    }
    for (int i = 0; i < 500 && http_get(admin, "/readyz").empty(); ++i) std::this_thread::sleep_for(10ms);
  }
  double processed() const {
    // (A correction, REJECTED with adjust=, is counted as an adjustment.)
    const std::string m = http_get(admin, "/metrics");
    return metric_sum(m, "smockron_master_accounting_messages_total") +
           metric_sum(m, "smockron_master_adjustments_total");
  }
  ~master_process() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
    if (!config_path.empty()) ::unlink(config_path.c_str());
  }
};

// A redis-server for the store comparison, on a free loopback port, no persistence; killed by PID.
struct redis_process {
  pid_t pid = -1;
  int port = 0;
  bool start() {
    port = free_port();
    pid = ::fork();
    if (pid == 0) {
      const std::string p = std::to_string(port);
      ::execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--loglevel", "warning", nullptr);
      std::perror("exec redis-server");
      std::_Exit(127);
    }
    for (int i = 0; i < 500; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      if (ok) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  ~redis_process() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// Counts control messages on its own thread; records receive times of latency probes.
struct control_listener {
  control_listener(zmq::context_t& ctx, const std::string& endpoint, std::size_t probes, const curve_setup& curve)
      : sub(ctx, zmq::socket_type::sub), received_at(probes) {
    curve.client(sub);
    sub.set(zmq::sockopt::rcvhwm, k_hwm);
    sub.set(zmq::sockopt::subscribe, "");
    sub.set(zmq::sockopt::rcvtimeo, 100);
    sub.connect(endpoint);
    thread = std::thread([this] { run(); });
  }
  void run() {
    zmq::message_t frames[8];
    while (!stop) {
      std::size_t n = 0;
      for (;; ++n) {
        zmq::message_t& m = frames[std::min<std::size_t>(n, 7)];
        if (!sub.recv(m)) break;
        if (!m.more()) {
          ++n;
          break;
        }
      }
      if (n < 4) continue;
      count.fetch_add(1, std::memory_order_relaxed);
      const auto id = frames[2].to_string_view();
      if (id.starts_with("lat-")) {
        const std::size_t seq = std::strtoul(std::string(id.substr(4)).c_str(), nullptr, 10);
        if (seq < received_at.size()) received_at[seq] = steady_clock::now();
      } else if (id == "sync") {
        synced = true;
      }
    }
  }
  ~control_listener() {
    stop = true;
    thread.join();
  }
  zmq::socket_t sub;
  std::vector<steady_clock::time_point> received_at;
  std::atomic<long> count{0};
  std::atomic<bool> synced{false}, stop{false};
  std::thread thread;
};

// Phases 2 (and 3 when `latency`) against one master; returns its ingest figures.
// `gatekeeper`: the name the publisher gives itself (X-Gatekeeper); empty: none.
receiver_figures measure_master(const options& o, const std::string& store_config, const char* label, bool latency,
                                const curve_setup& curve = {}, const std::string& gatekeeper = {},
                                const std::string& bench_domain = {}) {
  master_process master;
  master.start(o, store_config + curve.config, bench_domain);
  zmq::context_t ctx(1);
  const std::size_t probes = static_cast<std::size_t>(o.latency_seconds * 1000);
  control_listener control(ctx, master.control, probes, curve);
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  curve.client(pub);
  if (!gatekeeper.empty()) {
    const std::string property = "X-Gatekeeper:" + gatekeeper;
    if (zmq_setsockopt(pub.handle(), k_zmq_metadata, property.data(), property.size()) != 0) {
      std::fprintf(stderr, "this libzmq cannot name a gatekeeper (ZMQ_METADATA): %s\n", zmq_strerror(zmq_errno()));
      return {};
    }
  }
  pub.set(zmq::sockopt::sndhwm, k_hwm);
  pub.set(zmq::sockopt::sndbuf, 4 * 1024 * 1024);
  pub.connect(master.accounting);
  // Sync: both directions are connected once a DELAY_UNTIL for "sync" comes back.
  {
    const std::string now = std::to_string(wall_ms());
    const std::string_view sync[5] = {k_lat_domain, "ACCEPTED", "sync", now, ""};
    for (int i = 0; i < 5000 && !control.synced; ++i) {
      send_frames(pub, sync, 5);
      std::this_thread::sleep_for(1ms);
    }
    if (!control.synced) {
      std::fprintf(stderr, "master never answered (is %s built?)\n", o.master.c_str());
      return {};
    }
  }
  const double before = master.processed();
  const long control_before = control.count;
  const double cpu_before = process_cpu_seconds(master.pid);

  // Phase 2: ingest as fast as the publisher can send.
  load_mix mix(o.identifiers, o.costs);
  mix.batched = curve.on();
  const auto start = steady_clock::now();
  // Timestamps follow the wall clock (read every 1024 messages) so that states
  // are still live when processed and the store has all of them to write.
  std::int64_t t = wall_ms();
  for (long i = 0; i < o.messages; ++i) {
    if ((i & 1023) == 0) t = wall_ms();
    mix.send(pub, i, t);
  }
  mix.flush(pub);
  double processed = 0, last_seen = -1;
  auto last_change = steady_clock::now(), done_at = last_change;
  while (steady_clock::now() - last_change < 2s) {
    processed = master.processed() - before;
    if (processed != last_seen) {
      last_seen = processed;
      last_change = done_at = steady_clock::now();
    }
    if (processed >= static_cast<double>(o.messages)) break;
    std::this_thread::sleep_for(5ms);
  }
  const double secs = duration<double>(done_at - start).count();
  receiver_figures fig;
  fig.rate = processed / secs;
  // (The wait after the last message is idle: it adds no CPU time.)
  fig.cpu_ns = processed > 0 ? (process_cpu_seconds(master.pid) - cpu_before) * 1e9 / processed : 0;
  const double ingest = fig.rate;
  const long control_msgs = control.count - control_before;
  std::printf("master ingest (%s):%*s%10.0f msg/s  (%.0f of %ld processed, %.0f dropped), %.0f ns CPU per message\n",
              label, static_cast<int>(std::max<std::size_t>(1, 8 - std::strlen(label))), "", ingest, processed,
              o.messages, static_cast<double>(o.messages) - processed, fig.cpu_ns);
  std::printf("control messages:       %10.0f msg/s  (%ld DELAY_UNTIL received)\n", control_msgs / secs, control_msgs);
  if (o.costs) {
    // The mix's units and reservations went through the master's books.
    const std::string m = http_get(master.admin, "/metrics");
    std::printf("costs: %.0f units charged, %.0f given back, %.0f reservations opened, %.0f open\n",
                metric_sum(m, "smockron_master_units_total"), metric_sum(m, "smockron_master_units_refunded_total"),
                metric_sum(m, "smockron_master_reservations_total"),
                metric_sum(m, "smockron_master_reservations_open"));
  }
  if (!gatekeeper.empty()) {
    // The clients the master counted gatekeepers for: the pace share did its work.
    std::printf("paced identifiers:      %10.0f\n",
                metric_sum(http_get(master.admin, "/metrics"), "smockron_master_paced_identifiers"));
  }
  if (store_config.find("redis") != std::string::npos) {
    const auto written_at = steady_clock::now();
    std::string after = http_get(master.admin, "/metrics");
    for (int k = 0; k < 250 && metric_sum(after, "smockron_master_redis_unwritten_states") > 0; ++k) {
      std::this_thread::sleep_for(20ms);
      after = http_get(master.admin, "/metrics");
    }
    std::printf("redis caught up:        %10.3f s after the last message was processed\n",
                duration<double>(steady_clock::now() - written_at).count());
    std::printf("redis writes:           %10.0f states written (%.0f write errors, %.0f still unwritten)\n",
                metric_sum(after, "smockron_master_redis_writes_total"),
                metric_sum(after, "smockron_master_redis_write_errors_total"),
                metric_sum(after, "smockron_master_redis_unwritten_states"));
  }
  if (!latency) return fig;

  // Phase 3: control-loop latency while paced at latency_rate msg/s, spread
  // evenly in 100 us slots (a real stream is not a burst per millisecond).
  // One latency probe per millisecond, at a varying slot: a fresh identifier
  // in a 1/h burst-1 domain, so each probe yields exactly one DELAY_UNTIL.
  std::vector<steady_clock::time_point> sent_at(probes);
  const long per_slot = std::max<long>(1, o.latency_rate / 10'000);
  const auto phase_start = steady_clock::now();
  long i = 0;
  for (std::size_t ms = 0; ms < probes; ++ms) {
    const std::size_t probe_slot = (ms * 7) % 10;
    for (std::size_t slot = 0; slot < 10; ++slot) {
      // Sleep, not spin: on a 2-core box a spinning generator steals the master's CPU.
      std::this_thread::sleep_until(phase_start + microseconds(ms * 1000 + slot * 100));
      const std::int64_t now = wall_ms();
      const long n = slot == probe_slot ? per_slot - 1 : per_slot;
      for (long k = 0; k < n; ++k) mix.send(pub, i++, now);
      mix.flush(pub);  // each 100 us slot leaves together
      if (slot != probe_slot) continue;
      const std::string id = "lat-" + std::to_string(ms), ts = std::to_string(now);
      const std::string_view f[5] = {k_lat_domain, "ACCEPTED", id, ts, ""};
      sent_at[ms] = steady_clock::now();
      send_frames(pub, f, 5);
    }
  }
  std::this_thread::sleep_for(500ms);
  std::vector<double> lat;
  for (std::size_t k = 0; k < probes; ++k) {
    if (control.received_at[k] != steady_clock::time_point{})
      lat.push_back(duration<double, std::micro>(control.received_at[k] - sent_at[k]).count());
  }
  std::sort(lat.begin(), lat.end());
  const auto pct = [&](double p) {
    return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, static_cast<std::size_t>(p * lat.size()))];
  };
  const double achieved = static_cast<double>(i + static_cast<long>(probes)) /
                          duration<double>(steady_clock::now() - phase_start - 500ms).count();
  std::printf(
      "control-loop latency at %ld msg/s offered (%.0f achieved): p50 %.0f us, p99 %.0f us, max %.0f us "
      "(%zu of %zu probes answered)\n",
      o.latency_rate, achieved, pct(0.50), pct(0.99), lat.empty() ? 0.0 : lat.back(), lat.size(), probes);
  return fig;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--master") o.master = next();
    else if (a == "--messages") o.messages = std::stol(next());
    else if (a == "--identifiers") o.identifiers = std::stol(next());
    else if (a == "--latency-rate") o.latency_rate = std::stol(next());
    else if (a == "--latency-seconds") o.latency_seconds = std::stod(next());
    else if (a == "--pin") o.pin = true;
    else if (a == "--redis") o.redis = true;
    else if (a == "--curve") o.curve = true;
    else if (a == "--pace-share") o.pace_share = true;
    else if (a == "--costs") o.costs = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--master PATH] [--messages N] [--identifiers N] [--latency-rate N/s] "
                   "[--latency-seconds S] [--pin] [--redis] [--curve] [--pace-share] [--costs]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.pin) pin_to(0);
  std::printf("smockron master benchmark: %ld messages, %ld identifiers, %s%s\n", o.messages, o.identifiers,
              o.pin ? "publisher on cpu 0, subscriber/master on cpu 1" : "unpinned",
              o.costs ? "; costs: 80% cost=1..100, 10% reserve=50, 10% adjust=-50..50" : "");

  const receiver_figures ceiling = zmq_ceiling(o);

  const receiver_figures mem = measure_master(o, "", "memory", true);
  const double memory = mem.rate;
  if (memory <= 0) {
    std::fprintf(stderr, "the master processed nothing: no figure\n");
    return 1;
  }
  std::printf("ratio master/zeromq:    %10.2f\n", ceiling.rate > 0 ? memory / ceiling.rate : 0.0);
  // Above 1: the master spends less CPU on a message than a bare libzmq SUB
  // does to receive it (each may have waited for the publisher).
  std::printf("CPU per message, zeromq/master: %.2f\n", mem.cpu_ns > 0 ? ceiling.cpu_ns / mem.cpu_ns : 0.0);
  if (o.curve) {
    const receiver_figures cur = measure_master(o, "", "curve", true, curve_setup::make());
    std::printf("ratio curve/plaintext:  %10.2f  (goal >= 0.8)\n", cur.rate / memory);
    std::printf("CPU per message, plaintext/curve: %.2f\n", cur.cpu_ns > 0 ? mem.cpu_ns / cur.cpu_ns : 0.0);
    if (cur.rate <= 0) return 1;
  }
  if (o.pace_share) {
    // Both under GCRA: the ratios are the pace share's cost, not the algorithms'.
    const std::string gcra = "algorithm = \"gcra\"\n";
    const receiver_figures plain = measure_master(o, "pace_share = true\n", "gcra", true, {}, {}, gcra);
    const receiver_figures paced =
        measure_master(o, "pace_share = true\n", "paced", true, {}, "0123456789abcd00", gcra);
    std::printf("ratio paced/plain:      %10.2f  (both GCRA)\n", plain.rate > 0 ? paced.rate / plain.rate : 0.0);
    std::printf("CPU per message, plain/paced: %.2f\n", paced.cpu_ns > 0 ? plain.cpu_ns / paced.cpu_ns : 0.0);
    if (paced.rate <= 0 || plain.rate <= 0) return 1;
  }
  if (o.redis) {
    redis_process redis;
    if (!redis.start()) {
      std::fprintf(stderr, "redis-server did not start (is it installed?)\n");
      return 1;
    }
    const double with_redis =
        measure_master(o,
                       "store = \"redis\"\nredis = \"redis://127.0.0.1:" + std::to_string(redis.port) +
                           "/0\"\nstartup_backlog = 10000000\n",
                       "redis", false)
            .rate;
    std::printf("ratio redis/memory:     %10.2f  (goal >= 0.5)\n", memory > 0 ? with_redis / memory : 0.0);
    if (with_redis <= 0) return 1;
  }
  return 0;
}
