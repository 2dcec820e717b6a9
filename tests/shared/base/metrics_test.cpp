// Prometheus text rendering.
#include "shared/base/metrics.hpp"

#include <gtest/gtest.h>

using namespace smockron::metrics;

TEST(Metrics, RendersCountersGaugesAndHistograms) {
  registry r;
  r.add_counter("req_total", "Requests", labels({{"domain", "api"}, {"status", "ACCEPTED"}})).inc(3);
  r.add_counter("req_total", "Requests", labels({{"domain", "api"}, {"status", "ACCEPTED"}})).inc();  // same series
  r.add_gauge("held", "Held requests").set(7);
  auto& h = r.add_histogram("lat_seconds", "Latency", {0.001, 0.01});
  h.observe(0.0005);
  h.observe(0.005);
  h.observe(5);
  r.add_callback("computed", "Computed", labels({{"k", "a\"b\\c"}}), [] { return 1.5; });
  const std::string out = r.render();
  EXPECT_NE(out.find("# TYPE req_total counter\nreq_total{domain=\"api\",status=\"ACCEPTED\"} 4\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("held 7\n"), std::string::npos);
  EXPECT_NE(out.find("lat_seconds_bucket{le=\"0.001\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("lat_seconds_bucket{le=\"0.01\"} 2\n"), std::string::npos);
  EXPECT_NE(out.find("lat_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(out.find("lat_seconds_count 3\n"), std::string::npos);
  EXPECT_NE(out.find("computed{k=\"a\\\"b\\\\c\"} 1.5\n"), std::string::npos) << out;
}

TEST(Metrics, HistogramWithLabelsAddsLe) {
  registry r;
  r.add_histogram("d", "D", {1}, labels({{"domain", "x"}})).observe(2);
  EXPECT_NE(r.render().find("d_bucket{domain=\"x\",le=\"+Inf\"} 1"), std::string::npos);
}
