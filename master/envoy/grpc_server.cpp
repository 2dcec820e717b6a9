// The gRPC endpoint of Envoy's rate limit services (see grpc_server.hpp).
#include "master/envoy/grpc_server.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <deque>
#include <stdexcept>

#include "envoy/service/rate_limit_quota/v3/rlqs.grpc.pb.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace smockron::master {
namespace {

using reports_t = rlqs_pb::RateLimitQuotaUsageReports;
using response_t = rlqs_pb::RateLimitQuotaResponse;

// One RLQS stream. gRPC calls its On* methods on its threads; the loop
// answers its reports. What both touch is behind `mutex`, and outlives the
// reactor (jobs hold it by shared_ptr): `alive` says whether the reactor
// still does.
class rlqs_stream final : public grpc::ServerBidiReactor<reports_t, response_t> {
public:
  // Writes waiting beyond this pause the reads (a client that does not read its answers).
  static constexpr std::size_t k_max_unsent = 4;

  struct shared {
    // Recursive: gRPC may run a reaction (OnWriteDone) inline in a Start* call made under it.
    std::recursive_mutex mutex;
    rlqs_stream* self = nullptr;  ///< null once the reactor is done
    rlqs_stream_state state;      ///< loop thread only
    bool closed_seen = false;     ///< the loop ran stream_closed()
  };

  rlqs_stream(envoy_server& server, grpc::CallbackServerContext* ctx)
      : server_(server), sh_(std::make_shared<shared>()) {
    sh_->self = this;
    sh_->state.id = server.next_stream_id();
    server_.streams().add(1);
    if (!server_.allowed(ctx->peer())) {
      server_.denied().inc();
      finish_locked(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not in rls_allow"));
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done sending, or the call ended
      end_stream(grpc::Status::OK);
      return;
    }
    auto sh = sh_;
    const bool posted = server_.post([sh](envoy_decider& d) {
      std::lock_guard<std::recursive_mutex> lock(sh->mutex);
      if (sh->self == nullptr || sh->closed_seen) return;
      response_t out;
      d.report(sh->state, sh->self->in_, out, d.now_us());
      sh->self->queue_locked(std::move(out));
      if (sh->self->unsent_.size() < k_max_unsent) sh->self->StartRead(&sh->self->in_);
      else sh->self->read_paused_ = true;
    });
    if (!posted) {
      server_.unavailable().inc();
      end_stream(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the master is busy or stopping"));
    }
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::recursive_mutex> lock(sh_->mutex);
    writing_ = false;
    unsent_.pop_front();
    if (!ok) return;  // the call is going: OnReadDone(false) ends it
    if (!unsent_.empty()) {
      writing_ = true;
      StartWrite(&unsent_.front());
    } else if (finish_after_writes_) {
      finish_locked(grpc::Status::OK);
    }
    if (read_paused_ && unsent_.size() < k_max_unsent && !finished_) {
      read_paused_ = false;
      StartRead(&in_);
    }
  }

  void OnDone() override {
    {
      std::lock_guard<std::recursive_mutex> lock(sh_->mutex);
      sh_->self = nullptr;
    }
    server_.streams().add(-1);
    delete this;
  }

private:
  // The stream ends: its buckets stop sharing (on the loop, or inline once
  // it has stopped), and it is finished with `st` once its answers are out.
  void end_stream(const grpc::Status& st) {
    auto sh = sh_;
    const auto close = [sh, st](envoy_decider& d) {
      std::lock_guard<std::recursive_mutex> lock(sh->mutex);
      if (!sh->closed_seen) d.stream_closed(sh->state);
      sh->closed_seen = true;
      if (sh->self) sh->self->finish_when_written_locked(st);
    };
    if (!server_.post(close, true)) server_.run_if_closed(close);
  }

  void queue_locked(response_t out) {
    if (finished_ || out.bucket_action_size() == 0) return;
    unsent_.push_back(std::move(out));
    if (!writing_) {
      writing_ = true;
      StartWrite(&unsent_.front());
    }
  }
  void finish_when_written_locked(const grpc::Status& st) {
    if (!st.ok()) finish_locked(st);
    else if (writing_ || !unsent_.empty()) finish_after_writes_ = true;
    else finish_locked(st);
  }
  void finish_locked(const grpc::Status& st) {
    if (finished_) return;
    finished_ = true;
    Finish(st);
  }

  envoy_server& server_;
  std::shared_ptr<shared> sh_;
  reports_t in_;
  std::deque<response_t> unsent_;  ///< front: being written when writing_
  bool writing_ = false;
  bool read_paused_ = false;
  bool finish_after_writes_ = false;
  bool finished_ = false;
};

class rls_service final : public rls_pb::RateLimitService::CallbackService {
public:
  explicit rls_service(envoy_server& s) : server_(s) {}
  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx, const rls_pb::RateLimitRequest* req,
                                            rls_pb::RateLimitResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (!server_.allowed(ctx->peer())) {
      server_.denied().inc();
      reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not in rls_allow"));
      return reactor;
    }
    // Answered by the loop; req and resp live until Finish.
    const bool posted = server_.post([reactor, req, resp](envoy_decider& d) {
      const auto st = d.should_rate_limit(*req, *resp, d.now_us());
      reactor->Finish(st.ok ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, st.message));
    });
    if (!posted) {
      server_.unavailable().inc();
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the master is busy or stopping"));
    }
    return reactor;
  }

private:
  envoy_server& server_;
};

class rlqs_service final : public rlqs_pb::RateLimitQuotaService::CallbackService {
public:
  explicit rlqs_service(envoy_server& s) : server_(s) {}
  grpc::ServerBidiReactor<reports_t, response_t>* StreamRateLimitQuotas(grpc::CallbackServerContext* ctx) override {
    return new rlqs_stream(server_, ctx);  // deletes itself in OnDone
  }

private:
  envoy_server& server_;
};

}  // namespace

struct envoy_server::services {
  rls_service rls;
  rlqs_service rlqs;
  explicit services(envoy_server& s) : rls(s), rlqs(s) {}
};

envoy_server::envoy_server(const host_port& at, std::vector<cidr> allow, metrics::registry& reg)
    : allow_(std::move(allow)),
      unavailable_(reg.add_counter("smockron_master_envoy_unavailable_total",
                                   "RLS calls and RLQS streams answered UNAVAILABLE (the loop had too much waiting, "
                                   "or the master was stopping)")),
      denied_(reg.add_counter("smockron_master_refused_connections_total",
                              "Connections refused by an endpoint's allow list",
                              metrics::labels({{"endpoint", "rls"}}))),
      streams_(reg.add_gauge("smockron_master_rlqs_streams", "RLQS streams open")) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  services_ = std::make_unique<services>(*this);
  grpc::ServerBuilder builder;
  int bound = 0;
  const std::string host = at.host.find(':') != std::string::npos ? "[" + at.host + "]" : at.host;
  builder.AddListeningPort(host + ":" + std::to_string(at.port), grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(&services_->rls);
  builder.RegisterService(&services_->rlqs);
  // An RLQS report of 10,000 buckets is about a megabyte.
  builder.SetMaxReceiveMessageSize(16 << 20);
  server_ = builder.BuildAndStart();
  if (!server_ || bound == 0) {
    ::close(wake_fd_);
    throw std::runtime_error("cannot listen on " + at.to_string());
  }
  port_ = static_cast<std::uint16_t>(bound);
}

envoy_server::~envoy_server() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool envoy_server::post(job j, bool always) {
  std::lock_guard lock(mutex_);
  if (closed_ || (!always && waiting_.size() >= k_max_waiting)) return false;
  const bool was_empty = waiting_.empty();
  waiting_.push_back(std::move(j));
  if (was_empty) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);  // a full counter is still readable
  }
  return true;
}

bool envoy_server::run_if_closed(const job& j) {
  std::lock_guard lock(mutex_);
  if (!closed_ || closed_decider_ == nullptr) return false;
  j(*closed_decider_);
  return true;
}

void envoy_server::serve(envoy_decider& d) {
  std::uint64_t count = 0;
  [[maybe_unused]] const auto n = ::read(wake_fd_, &count, sizeof count);
  std::vector<job> batch;
  {
    std::lock_guard lock(mutex_);
    batch.swap(waiting_);
  }
  for (auto& j : batch) j(d);
}

void envoy_server::shutdown(envoy_decider& d) {
  if (!server_) return;  // done already
  serve(d);
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    closed_decider_ = &d;
  }
  serve(d);  // what came meanwhile
  // Streams still open are cancelled now; their ends run inline (run_if_closed).
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  server_.reset();
}

bool envoy_server::allowed(const std::string& peer) const {
  if (allow_.empty()) return true;
  // "ipv4:127.0.0.1:5000" or "ipv6:[::1]:5000".
  std::string_view p(peer);
  const auto colon = p.find(':');
  if (colon == std::string_view::npos) return false;
  p.remove_prefix(colon + 1);
  const auto port = p.rfind(':');
  if (port == std::string_view::npos) return false;
  p = p.substr(0, port);
  if (p.size() >= 2 && p.front() == '[' && p.back() == ']') p = p.substr(1, p.size() - 2);
  const auto ip = parse_ip(p);
  return ip && smockron::allowed(allow_, *ip);
}

}  // namespace smockron::master
