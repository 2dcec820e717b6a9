// UDP query benchmark (issue 18). In one run, alternating rounds:
//  1. a bare UDP echo server written the same way as the master's query
//     endpoint (the same udp_responder: recvmmsg / sendmmsg in batches from an
//     epoll loop), in its own process, answering each datagram with itself;
//  2. the real smockron-master answering "ID over_limit bench kN" on its query
//     endpoint (every answer "N": the limit is far away), spread over many
//     identifiers;
// each driven closed-loop by the same client (a window of requests in
// flight) for its maximum rate; then both open-loop at half the master's
// rate for the latency (p50 / p99 from send to answer). Server on cpu 1, the
// client on cpu 0 (--pin). Prints the rates and the ratio master/echo.
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "master/core/query.hpp"
#include "master/io/udp_responder.hpp"

using namespace std::chrono;
using steady = steady_clock;

namespace {

struct options {
  std::string master = "build/bin/smockron-master";
  double seconds = 5;
  int rounds = 3;
  int window = 64;
  int identifiers = 10'000;
  bool pin = false;
};

using smockron::bench::pin_to;

int free_udp_port() { return smockron::bench::free_port(SOCK_DGRAM); }
int free_tcp_port() { return smockron::bench::free_port(SOCK_STREAM); }

// The echo server: the master's loop shape (epoll_wait, then serve()) with an echo handler.
[[noreturn]] void run_echo(int port) {
  smockron::master::udp_responder r({"127.0.0.1", static_cast<std::uint16_t>(port)}, {});
  const int ep = ::epoll_create1(0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, r.fd(), &ev);
  const smockron::master::udp_responder::handler echo = [](std::string_view in, std::string& out) {
    out.assign(in);
    return true;
  };
  for (;;) {
    epoll_event events[8];
    if (::epoll_wait(ep, events, 8, 50) > 0) r.serve(echo);
  }
}

struct server {
  pid_t pid = -1;
  int port = 0;
  std::string config;
  ~server() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
    if (!config.empty()) ::unlink(config.c_str());
  }
};

void start_echo(server& s, const options& o) {
  s.port = free_udp_port();
  s.pid = ::fork();
  if (s.pid == 0) {
    if (o.pin) pin_to(1);
    run_echo(s.port);
  }
}

void start_master(server& s, const options& o) {
  s.port = free_udp_port();
  s.config = "/tmp/smockron-query-bench-" + std::to_string(::getpid()) + ".toml";
  std::ofstream(s.config) << "[master]\naccounting = \"tcp://127.0.0.1:" << free_tcp_port()
                          << "\"\ncontrol = \"tcp://127.0.0.1:" << free_tcp_port()
                          << "\"\nadmin = \"127.0.0.1:" << free_tcp_port() << "\"\nquery = \"127.0.0.1:" << s.port
                          << "\"\n[master.domains.bench]\nrules = [ { rate = \"1000000/s\", burst = 10 } ]\n";
  s.pid = ::fork();
  if (s.pid == 0) {
    if (o.pin) pin_to(1);
    ::execl(o.master.c_str(), o.master.c_str(), "--config", s.config.c_str(), "--log-level", "warn", nullptr);
    std::perror("exec smockron-master");
    std::_Exit(127);
  }
}

int connect_udp(int port) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  const int buf = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  return fd;
}

std::string request(std::uint64_t id, int identifiers) {
  return std::to_string(id) + " over_limit bench k" + std::to_string(id % static_cast<std::uint64_t>(identifiers));
}

bool answers(int port, int identifiers) {
  const int fd = connect_udp(port);
  bool ok = false;
  for (int i = 0; i < 200 && !ok; ++i) {
    const std::string r = request(1, identifiers);
    ::send(fd, r.data(), r.size(), 0);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) {
      char buf[256];
      ok = ::recv(fd, buf, sizeof buf, 0) > 0;
      // Refused (ICMP port unreachable: not bound yet) comes at once: wait before trying again.
      if (!ok) std::this_thread::sleep_for(20ms);
    }
  }
  ::close(fd);
  return ok;
}

// Closed loop: `window` requests in flight, a new one per answer. Returns answers per second.
double max_rate(int port, const options& o) {
  const int fd = connect_udp(port);
  std::uint64_t next = 1, answered = 0, lost = 0;
  std::vector<steady::time_point> sent(static_cast<std::size_t>(o.window));
  const auto send_one = [&] {
    const std::string r = request(next, o.identifiers);
    sent[next % sent.size()] = steady::now();
    ::send(fd, r.data(), r.size(), 0);
    ++next;
  };
  for (int i = 0; i < o.window; ++i) send_one();
  const auto start = steady::now();
  const auto until = start + duration<double>(o.seconds);
  char buf[4096];
  while (steady::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) {
      // Datagrams lost (a full socket buffer): refill the window.
      lost += static_cast<std::uint64_t>(o.window);
      for (int i = 0; i < o.window; ++i) send_one();
      continue;
    }
    while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
      ++answered;
      send_one();
    }
  }
  ::close(fd);
  const double s = duration<double>(steady::now() - start).count();
  if (lost > 0) std::printf("    (%llu requests lost and resent)\n", static_cast<unsigned long long>(lost));
  return static_cast<double>(answered) / s;
}

struct latency {
  double p50_us = 0, p99_us = 0, answered = 0;
};

// Open loop at `rate` per second: sends on a schedule, never on answers.
latency paced(int port, double rate, const options& o) {
  const int fd = connect_udp(port);
  const auto total = static_cast<std::size_t>(rate * o.seconds);
  std::vector<steady::time_point> sent(total + 1);
  std::vector<double> took;
  took.reserve(total);
  const auto start = steady::now();
  const auto gap = duration<double>(1.0 / rate);
  std::size_t next = 1;
  char buf[4096];
  const auto drain = [&] {
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
      const auto r = smockron::query::split_response({buf, static_cast<std::size_t>(n)});
      if (r.id && *r.id < sent.size())
        took.push_back(duration<double, std::micro>(steady::now() - sent[*r.id]).count());
    }
  };
  while (next <= total) {
    const auto due = start + duration_cast<steady::duration>(gap * static_cast<double>(next));
    while (steady::now() < due) drain();
    const std::string r = request(next, o.identifiers);
    sent[next] = steady::now();
    ::send(fd, r.data(), r.size(), 0);
    ++next;
  }
  const auto end = steady::now() + 200ms;
  while (steady::now() < end) drain();
  ::close(fd);
  latency l;
  l.answered = static_cast<double>(took.size()) / static_cast<double>(total);
  if (!took.empty()) {
    std::sort(took.begin(), took.end());
    l.p50_us = took[took.size() / 2];
    l.p99_us = took[took.size() * 99 / 100];
  }
  return l;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--master") o.master = value();
    else if (a == "--seconds") o.seconds = std::atof(value().c_str());
    else if (a == "--rounds") o.rounds = std::atoi(value().c_str());
    else if (a == "--window") o.window = std::atoi(value().c_str());
    else if (a == "--identifiers") o.identifiers = std::atoi(value().c_str());
    else if (a == "--pin") o.pin = true;
    else {
      std::fprintf(stderr,
                   "usage: smockron-query-bench [--master PATH] [--seconds S] [--rounds N] [--window W] "
                   "[--identifiers N] [--pin]\n");
      return 64;
    }
  }
  server echo, master;
  start_echo(echo, o);
  start_master(master, o);
  if (o.pin) pin_to(0);
  if (!answers(echo.port, o.identifiers)) {
    std::fprintf(stderr, "the echo server did not answer on 127.0.0.1:%d\n", echo.port);
    return 1;
  }
  if (!answers(master.port, o.identifiers)) {
    std::fprintf(stderr, "%s did not answer on 127.0.0.1:%d (config %s)\n", o.master.c_str(), master.port,
                 master.config.c_str());
    return 1;
  }
  std::printf("closed loop, %d requests in flight, %d identifiers, %.0f s per round\n", o.window, o.identifiers,
              o.seconds);
  std::vector<double> echo_rates, master_rates, ratios;
  for (int r = 0; r < o.rounds; ++r) {
    const bool echo_first = r % 2 == 0;
    const double a = max_rate(echo_first ? echo.port : master.port, o);
    const double b = max_rate(echo_first ? master.port : echo.port, o);
    const double e = echo_first ? a : b, m = echo_first ? b : a;
    echo_rates.push_back(e);
    master_rates.push_back(m);
    ratios.push_back(m / e);
    std::printf("  round %d: echo %.0f/s, master %.0f/s, ratio %.2f\n", r, e, m, m / e);
  }
  const double rate = median(master_rates);
  std::printf("median: echo %.0f/s, master %.0f/s, master/echo %.2f (min %.2f, max %.2f)\n", median(echo_rates), rate,
              median(ratios), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
  // Latency at half the master's rate (the goal's load) and at a tenth of it
  // (what the client and the kernel add by themselves shows in the echo's figures).
  for (const double share : {0.5, 0.1}) {
    const double load = rate * share;
    const latency le = paced(echo.port, load, o), lm = paced(master.port, load, o);
    std::printf(
        "open loop at %.0f/s (%.0f%% of the master's rate): echo p50 %.0f us p99 %.0f us (%.1f%% answered); "
        "master p50 %.0f us p99 %.0f us (%.1f%% answered)\n",
        load, share * 100, le.p50_us, le.p99_us, 100 * le.answered, lm.p50_us, lm.p99_us, 100 * lm.answered);
  }
  return 0;
}
