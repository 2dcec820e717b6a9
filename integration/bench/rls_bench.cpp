// Envoy's rate limit services benchmark (issue 35). In one run:
//  1. a bare gRPC server written with the same libgrpc++ callback API, in its
//     own process, answering every ShouldRateLimit with OK at once (no
//     decision, no hand-over): what gRPC itself costs on this machine;
//  2. the real smockron-master answering ShouldRateLimit on `rls` (one
//     descriptor per call, spread over many identifiers, limits far away);
// each driven closed-loop by the same C++ client (callback API, a window of
// calls in flight over a few connections) for its decisions per second and
// its latency p50 / p99; then
//  3. the master's accounting ingest, offered a fixed rate of ZeroMQ
//     accounting messages, alone and then beside the RLS load: the messages it
//     processed within the phase, and the RLS decisions beside them;
//  4. RLQS: one stream reporting `buckets` buckets every second: how long
//     each report takes to be answered (goal: within the reporting interval).
// Servers on cpu 1, clients on cpu 0 (--pin). Prints the rates and the ratio master/bare.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench_util.hpp"
#include "envoy/service/rate_limit_quota/v3/rlqs.grpc.pb.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

using namespace std::chrono;
using namespace std::string_literals;
using smockron::bench::free_port;
using smockron::bench::http_get;
using smockron::bench::metric_sum;
using smockron::bench::pin_to;
namespace rls = ::envoy::service::ratelimit::v3;
namespace rlqs = ::envoy::service::rate_limit_quota::v3;

namespace {

struct options {
  std::string master = "build/bin/smockron-master";
  double seconds = 3;
  int window = 64;
  int channels = 2;
  int identifiers = 10'000;
  long ingest_rate = 100'000;
  int buckets = 10'000;
  int reports = 3;
  bool pin = false;
};

// The bare peer: OK for every call, one status per descriptor, on gRPC's thread.
class bare_rls final : public rls::RateLimitService::CallbackService {
  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx, const rls::RateLimitRequest* req,
                                            rls::RateLimitResponse* resp) override {
    resp->set_overall_code(rls::RateLimitResponse::OK);
    for (int i = 0; i < req->descriptors_size(); ++i) resp->add_statuses()->set_code(rls::RateLimitResponse::OK);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

struct process {
  pid_t pid = -1;
  int port = 0, admin = 0, accounting = 0;
  std::string config;
  ~process() { stop(); }
  void stop() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (!config.empty()) ::unlink(config.c_str());
    config.clear();
  }
};

void start_bare(process& p, const options& o) {
  p.port = free_port();
  p.pid = ::fork();
  if (p.pid == 0) {
    if (o.pin) pin_to(1);
    bare_rls service;
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:" + std::to_string(p.port), grpc::InsecureServerCredentials());
    b.RegisterService(&service);
    auto server = b.BuildAndStart();
    server->Wait();
    std::_Exit(0);
  }
}

void start_master(process& p, const options& o) {
  p.port = free_port();
  p.admin = free_port();
  p.accounting = free_port();
  p.config = "/tmp/smockron-rls-bench-" + std::to_string(::getpid()) + ".toml";
  std::ofstream(p.config) << "[master]\naccounting = \"tcp://127.0.0.1:" << p.accounting
                          << "\"\ncontrol = \"tcp://127.0.0.1:" << free_port() << "\"\nadmin = \"127.0.0.1:" << p.admin
                          << "\"\nrls = \"127.0.0.1:" << p.port
                          << "\"\nmax_identifiers = 2000000\n"
                             "[master.domains.bench]\nrules = [ { rate = \"1000000/s\", burst = 1000000 } ]\n"
                             "descriptor_keys = [\"k\"]\n"
                             "[master.domains.ingest]\nrules = [ { rate = \"1000000/s\", burst = 1000000 } ]\n";
  p.pid = ::fork();
  if (p.pid == 0) {
    if (o.pin) pin_to(1);
    ::execl(o.master.c_str(), o.master.c_str(), "--config", p.config.c_str(), "--log-level", "warn", nullptr);
    std::perror("exec smockron-master");
    std::_Exit(127);
  }
  for (int i = 0; i < 500 && http_get(p.admin, "/readyz").empty(); ++i) std::this_thread::sleep_for(10ms);
}

std::vector<std::shared_ptr<grpc::Channel>> channels(int port, int n) {
  std::vector<std::shared_ptr<grpc::Channel>> out;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection each
    out.push_back(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args));
  }
  for (auto& c : out) c->WaitForConnected(system_clock::now() + 10s);
  return out;
}

// Closed loop: `window` calls in flight until `seconds` have passed.
struct rls_result {
  double rate = 0;
  long ok = 0, failed = 0;
  std::uint32_t p50_us = 0, p99_us = 0;
};

class rls_load {
public:
  rls_load(int port, const options& o) : o_(o) {
    for (auto& c : channels(port, o.channels)) stubs_.push_back(rls::RateLimitService::NewStub(c));
    slots_.resize(static_cast<std::size_t>(o.window));
  }

  rls_result run(double seconds) {
    const auto start = steady_clock::now();
    deadline_ = start + duration_cast<steady_clock::duration>(duration<double>(seconds));
    running_ = static_cast<int>(slots_.size());
    for (std::size_t i = 0; i < slots_.size(); ++i) call(i);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return running_ == 0; });
    const double elapsed = duration<double>(steady_clock::now() - start).count();
    std::vector<std::uint32_t> all;
    rls_result r;
    for (auto& s : slots_) {
      all.insert(all.end(), s.latencies.begin(), s.latencies.end());
      r.ok += s.ok;
      r.failed += s.failed;
      s.latencies.clear();
      s.ok = s.failed = 0;
    }
    r.rate = static_cast<double>(r.ok) / elapsed;
    if (!all.empty()) {
      std::sort(all.begin(), all.end());
      r.p50_us = all[all.size() / 2];
      r.p99_us = all[all.size() * 99 / 100];
    }
    return r;
  }

private:
  struct slot {
    std::unique_ptr<grpc::ClientContext> ctx;
    rls::RateLimitRequest req;
    rls::RateLimitResponse resp;
    steady_clock::time_point sent;
    std::vector<std::uint32_t> latencies;
    long ok = 0, failed = 0;
    std::uint64_t n = 0;
  };

  void call(std::size_t i) {
    slot& s = slots_[i];
    s.ctx = std::make_unique<grpc::ClientContext>();
    s.req.Clear();
    s.resp.Clear();
    s.req.set_domain("bench");
    auto* e = s.req.add_descriptors()->add_entries();
    e->set_key("k");
    e->set_value("k" + std::to_string((s.n++ * slots_.size() + i) % static_cast<std::uint64_t>(o_.identifiers)));
    s.sent = steady_clock::now();
    stubs_[i % stubs_.size()]->async()->ShouldRateLimit(s.ctx.get(), &s.req, &s.resp, [this, i](grpc::Status st) {
      slot& sl = slots_[i];
      const auto now = steady_clock::now();
      if (st.ok()) {
        ++sl.ok;
        sl.latencies.push_back(static_cast<std::uint32_t>(duration_cast<microseconds>(now - sl.sent).count()));
      } else {
        ++sl.failed;
      }
      if (now < deadline_) {
        call(i);
        return;
      }
      std::lock_guard lock(mutex_);
      if (--running_ == 0) done_.notify_all();
    });
  }

  const options& o_;
  std::vector<std::unique_ptr<rls::RateLimitService::Stub>> stubs_;
  std::vector<slot> slots_;
  steady_clock::time_point deadline_;
  std::mutex mutex_;
  std::condition_variable done_;
  int running_ = 0;
};

void print_rls(const char* name, const rls_result& r) {
  std::printf("%-22s %10.0f decisions/s  p50 %u us  p99 %u us  (%ld answered, %ld failed)\n", name, r.rate, r.p50_us,
              r.p99_us, r.ok, r.failed);
}

// Accounting messages offered at `rate` for `seconds` (paced per millisecond);
// returns how many the master processed by the end, and a second later.
struct ingest_result {
  long sent = 0;
  double processed_in_time = 0, processed = 0;
};

ingest_result offer_ingest(const process& m, long rate, double seconds) {
  zmq::context_t ctx(1);
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.set(zmq::sockopt::sndhwm, 10'000'000);
  pub.connect("tcp://127.0.0.1:" + std::to_string(m.accounting));
  const auto processed = [&] {
    return metric_sum(http_get(m.admin, "/metrics"), "smockron_master_accounting_messages_total{domain=\"ingest\"");
  };
  const std::string domain = "ingest\0"s;
  const auto send = [&](std::string_view id) {
    const std::string now = std::to_string(duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count());
    const std::string_view f[5] = {domain, "ACCEPTED", id, now, ""};
    for (int i = 0; i < 5; ++i) {
      pub.send(zmq::const_buffer(f[i].data(), f[i].size()), i < 4 ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  };
  // Until the master's subscription has arrived (ZeroMQ's slow joiner).
  const double before = processed();
  for (int i = 0; i < 5000 && processed() == before; ++i) {
    send("probe");
    std::this_thread::sleep_for(2ms);
  }
  ingest_result r;
  const double base = processed();
  std::vector<std::string> ids(10'000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = "client-" + std::to_string(i);
  const auto start = steady_clock::now();
  const auto end = start + duration_cast<steady_clock::duration>(duration<double>(seconds));
  for (auto tick = start; tick < end; tick += 1ms) {
    const long due = static_cast<long>(duration<double>(tick + 1ms - start).count() * static_cast<double>(rate));
    for (; r.sent < due; ++r.sent) send(ids[static_cast<std::size_t>(r.sent) % ids.size()]);
    std::this_thread::sleep_until(tick + 1ms);
  }
  r.processed_in_time = processed() - base;
  std::this_thread::sleep_for(1s);
  r.processed = processed() - base;
  return r;
}

void print_ingest(const char* name, const ingest_result& r, double seconds) {
  std::printf("%-22s %10.0f msg/s offered, %ld sent: %.0f processed within the phase (%.3f), %.0f a second later\n",
              name, static_cast<double>(r.sent) / seconds, r.sent, r.processed_in_time,
              r.sent > 0 ? r.processed_in_time / static_cast<double>(r.sent) : 0, r.processed);
}

// One RLQS stream: `reports` reports of `buckets` buckets, one a second.
void rlqs_phase(const process& m, const options& o) {
  auto channel = channels(m.port, 1).front();
  auto stub = rlqs::RateLimitQuotaService::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->StreamRateLimitQuotas(&ctx);
  rlqs::RateLimitQuotaUsageReports report;
  report.set_domain("bench");
  for (int b = 0; b < o.buckets; ++b) {
    auto* u = report.add_bucket_quota_usages();
    (*u->mutable_bucket_id()->mutable_bucket())["k"] = "bucket-" + std::to_string(b);
    u->mutable_time_elapsed()->set_seconds(1);
    u->set_num_requests_allowed(1);
  }
  std::vector<double> ms;
  bool complete = true;
  auto next = steady_clock::now();
  for (int r = 0; r < o.reports; ++r) {
    std::this_thread::sleep_until(next);
    next += 1s;
    const auto t0 = steady_clock::now();
    rlqs::RateLimitQuotaResponse resp;
    if (!stream->Write(report) || !stream->Read(&resp)) {
      std::printf("rlqs: the stream ended early\n");
      complete = false;
      break;
    }
    ms.push_back(duration<double, std::milli>(steady_clock::now() - t0).count());
    complete = complete && resp.bucket_action_size() == o.buckets;
  }
  stream->WritesDone();
  stream->Finish();
  if (ms.empty()) return;
  std::sort(ms.begin(), ms.end());
  std::printf("rlqs %d buckets a report: answered in p50 %.1f ms, max %.1f ms over %zu reports (%s)\n", o.buckets,
              ms[ms.size() / 2], ms.back(), ms.size(), complete ? "every bucket answered" : "BUCKETS MISSING");
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--master") o.master = value();
    else if (a == "--seconds") o.seconds = std::atof(value().c_str());
    else if (a == "--window") o.window = std::atoi(value().c_str());
    else if (a == "--channels") o.channels = std::max(1, std::atoi(value().c_str()));
    else if (a == "--identifiers") o.identifiers = std::max(1, std::atoi(value().c_str()));
    else if (a == "--ingest-rate") o.ingest_rate = std::atol(value().c_str());
    else if (a == "--buckets") o.buckets = std::atoi(value().c_str());
    else if (a == "--reports") o.reports = std::atoi(value().c_str());
    else if (a == "--pin") o.pin = true;
    else {
      std::fprintf(stderr,
                   "usage: smockron-rls-bench [--master PATH] [--seconds S] [--window W] [--channels N] "
                   "[--identifiers N] [--ingest-rate MSG_PER_S] [--buckets N] [--reports N] [--pin]\n");
      return 2;
    }
  }
  std::printf("window %d calls in flight over %d connections, %d identifiers, %.1f s a phase%s\n", o.window, o.channels,
              o.identifiers, o.seconds, o.pin ? ", servers on cpu 1, clients on cpu 0" : "");
  if (o.pin) pin_to(0);
  rls_result bare, master;
  {
    process p;
    start_bare(p, o);
    rls_load load(p.port, o);
    load.run(std::min(0.5, o.seconds));  // warm-up
    bare = load.run(o.seconds);
  }
  print_rls("bare gRPC server:", bare);
  process m;
  start_master(m, o);
  {
    rls_load load(m.port, o);
    load.run(std::min(0.5, o.seconds));
    master = load.run(o.seconds);
    print_rls("smockron-master RLS:", master);
    std::printf("ratio master/bare:     %.2f\n", bare.rate > 0 ? master.rate / bare.rate : 0);
    const auto alone = offer_ingest(m, o.ingest_rate, o.seconds);
    print_ingest("ingest alone:", alone, o.seconds);
    rls_result beside;
    std::thread rls_thread([&] { beside = load.run(o.seconds); });
    const auto with_rls = offer_ingest(m, o.ingest_rate, o.seconds);
    rls_thread.join();
    print_ingest("ingest beside RLS:", with_rls, o.seconds);
    print_rls("RLS beside ingest:", beside);
    std::printf("ingest beside/alone:   %.3f\n",
                alone.processed_in_time > 0 ? with_rls.processed_in_time / alone.processed_in_time : 0);
  }
  rlqs_phase(m, o);
  const std::string metrics = http_get(m.admin, "/metrics");
  std::printf("master counted: %.0f RLS answers, %.0f RLQS reports\n",
              metric_sum(metrics, "smockron_master_rls_requests_total"),
              metric_sum(metrics, "smockron_master_rlqs_reports_total"));
  return 0;
}
