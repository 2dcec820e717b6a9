// Envoy's rate limit services on arbitrary messages: the first byte picks RLS
// (even) or RLQS (odd), the rest is parsed as a RateLimitRequest or a
// RateLimitQuotaUsageReports by libprotobuf, and what parses goes through the
// decider and the master's engine (a domain with a rule and a quota, another
// with none). Never crashes; an RLS answer has one status per descriptor
// (or is INVALID_ARGUMENT), an RLQS answer one action per bucket reported;
// a closed stream leaves no bucket tracked.
#include <cstdint>

#include "fuzz_frames.hpp"
#include "master/envoy/decider.hpp"

using namespace smockron;
using namespace smockron::master;

namespace {

config::master_config make_config() {
  auto r = config::load_string(R"(
[master]
rls = "127.0.0.1:0"
rlqs_max_buckets = 8
max_identifiers = 1000
[master.domains.api]
rules = [ { rate = "10/s", burst = 5 }, { quota = 20, per = "day" } ]
descriptor_keys = ["k"]
[master.domains.open]
rules = []
)",
                               "fuzz");
  return *r.cfg->master;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const config::master_config cfg = make_config();
  manual_clock clk;
  metrics::registry reg;
  ingest engine(cfg, clk, reg);
  envoy_decider decider(cfg, engine, clk, reg, [](const wire::delay_until& d) {
    FUZZ_CHECK(!d.identifier.empty() && d.identifier.size() <= wire::max_identifier_bytes);
  });
  const void* body = data + 1;
  const int n = static_cast<int>(size - 1);
  if (data[0] % 2 == 0) {
    rls_pb::RateLimitRequest req;
    if (!req.ParseFromArray(body, n)) return 0;
    for (int round = 0; round < 2; ++round) {
      rls_pb::RateLimitResponse resp;
      const auto st = decider.should_rate_limit(req, resp, clk.wall_us());
      if (st.ok) FUZZ_CHECK(resp.statuses_size() == req.descriptors_size());
      clk.advance(std::chrono::milliseconds(100));
    }
    return 0;
  }
  rlqs_pb::RateLimitQuotaUsageReports reports;
  if (!reports.ParseFromArray(body, n)) return 0;
  rlqs_stream_state stream{1, {}};
  for (int round = 0; round < 2; ++round) {
    rlqs_pb::RateLimitQuotaResponse resp;
    decider.report(stream, reports, resp, clk.wall_us());
    FUZZ_CHECK(resp.bucket_action_size() == reports.bucket_quota_usages_size());
    clk.advance(std::chrono::seconds(1));
  }
  decider.stream_closed(stream);
  FUZZ_CHECK(decider.buckets() == 0);
  return 0;
}
