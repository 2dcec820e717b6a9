// The gRPC endpoint of Envoy's rate limit services (see grpc_server.hpp).
#include "master/envoy/grpc_server.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/message_allocator.h>
#include <deque>
#include <stdexcept>

#include "envoy/service/rate_limit_quota/v3/rlqs.grpc.pb.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace smockron::master {
namespace {

using reports_t = rlqs_pb::RateLimitQuotaUsageReports;
using response_t = rlqs_pb::RateLimitQuotaResponse;

// One RLQS stream. gRPC calls its On* methods on its threads, one reaction
// at a time per direction; `mutex` guards what the read side (which answers a
// report) and the write side share. Deletes itself in OnDone.
class rlqs_stream final : public grpc::ServerBidiReactor<reports_t, response_t> {
public:
  // Answers waiting beyond this pause the reads (a client that does not read them).
  static constexpr std::size_t k_max_unsent = 4;

  rlqs_stream(envoy_server& server, grpc::CallbackServerContext* ctx) : server_(server) {
    state_.id = server_.next_stream_id();
    server_.streams().add(1);
    if (!server_.allowed(ctx->peer())) {
      server_.denied().inc();
      std::lock_guard lock(mutex_);
      finish_locked(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not in rls_allow"));
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done sending, or the call ended
      close();
      std::lock_guard lock(mutex_);
      if (writing_ || !unsent_.empty()) finish_after_writes_ = true;
      else finish_locked(grpc::Status::OK);
      return;
    }
    response_t out;
    server_.decide([&](envoy_decider& d) {
      d.report(state_, in_, out, d.now_us());
      return 0;
    });
    std::lock_guard lock(mutex_);
    if (!finished_ && out.bucket_action_size() > 0) {
      unsent_.push_back(std::move(out));
      if (!writing_) {
        writing_ = true;
        StartWrite(&unsent_.front());
      }
    }
    if (unsent_.size() < k_max_unsent) StartRead(&in_);
    else read_paused_ = true;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mutex_);
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
    close();  // a call cancelled while its reads were paused has no OnReadDone(false)
    server_.streams().add(-1);
    delete this;
  }

private:
  // Its buckets stop sharing their identifiers' rates (once).
  void close() {
    server_.decide([&](envoy_decider& d) {
      if (!closed_) d.stream_closed(state_);
      closed_ = true;
      return 0;
    });
  }
  void finish_locked(const grpc::Status& st) {
    if (finished_) return;
    finished_ = true;
    Finish(st);
  }

  envoy_server& server_;
  rlqs_stream_state state_;  ///< under the engine's lock (envoy_server::decide)
  bool closed_ = false;      ///< under the engine's lock
  reports_t in_;
  // Recursive: gRPC may run a reaction (OnWriteDone) inline in a Start* call made under it.
  std::recursive_mutex mutex_;
  std::deque<response_t> unsent_;  ///< front: being written when writing_
  bool writing_ = false;
  bool read_paused_ = false;
  bool finish_after_writes_ = false;
  bool finished_ = false;
};

// Each ShouldRateLimit call's request and answer on one protobuf arena,
// whose first block is inside the holder: an answer is a dozen small messages
// and strings (a status per descriptor, the limit's name, the fields to add)
// and the request as many, each a malloc and a free without it.
class rls_allocator final : public grpc::MessageAllocator<rls_pb::RateLimitRequest, rls_pb::RateLimitResponse> {
  class holder final : public grpc::MessageHolder<rls_pb::RateLimitRequest, rls_pb::RateLimitResponse> {
  public:
    holder() : arena_(options()) {
      set_request(google::protobuf::Arena::CreateMessage<rls_pb::RateLimitRequest>(&arena_));
      set_response(google::protobuf::Arena::CreateMessage<rls_pb::RateLimitResponse>(&arena_));
    }
    void Release() override { delete this; }

  private:
    google::protobuf::ArenaOptions options() {
      google::protobuf::ArenaOptions o;
      o.initial_block = block_;
      o.initial_block_size = sizeof block_;
      return o;
    }
    // Room for a one-descriptor call and its answer; the holder stays within
    // what malloc keeps per thread (tcache: up to 1,032 bytes).
    alignas(std::max_align_t) char block_[768];  // before arena_: it is built first
    google::protobuf::Arena arena_;
  };

public:
  grpc::MessageHolder<rls_pb::RateLimitRequest, rls_pb::RateLimitResponse>* AllocateMessages() override {
    return new holder;
  }
};

class rls_service final : public rls_pb::RateLimitService::CallbackService {
public:
  explicit rls_service(envoy_server& s) : server_(s) { SetMessageAllocatorFor_ShouldRateLimit(&allocator_); }
  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx, const rls_pb::RateLimitRequest* req,
                                            rls_pb::RateLimitResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (!server_.allowed(ctx->peer())) {
      server_.denied().inc();
      reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not in rls_allow"));
      return reactor;
    }
    const auto st = server_.decide([&](envoy_decider& d) { return d.should_rate_limit(*req, *resp, d.now_us()); });
    reactor->Finish(st.ok ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, st.message));
    return reactor;
  }

private:
  envoy_server& server_;
  rls_allocator allocator_;
};

class rlqs_service final : public rlqs_pb::RateLimitQuotaService::CallbackService {
public:
  explicit rlqs_service(envoy_server& s) : server_(s) {}
  grpc::ServerBidiReactor<reports_t, response_t>* StreamRateLimitQuotas(grpc::CallbackServerContext* ctx) override {
    return new rlqs_stream(server_, ctx);
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

envoy_server::envoy_server(const host_port& at, std::vector<cidr> allow, metrics::registry& reg, envoy_decider& decider,
                           std::mutex& engine)
    : decider_(decider),
      engine_(engine),
      allow_(std::move(allow)),
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
  shutdown();
  ::close(wake_fd_);
}

void envoy_server::wake() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);  // a full counter is still readable
}

void envoy_server::woken() {
  std::uint64_t count = 0;
  [[maybe_unused]] const auto n = ::read(wake_fd_, &count, sizeof count);
}

void envoy_server::shutdown() {
  if (!server_) return;  // done already
  // Calls under way finish; open streams are cancelled now and end (OnReadDone(false)).
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
