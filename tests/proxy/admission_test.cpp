// Admission on a manual clock: identification, fail_closed, the gate's
// verdicts, their counters, and what is accounted to the masters.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include "proxy/admission.hpp"
#include "smockron/clock.hpp"

using namespace smockron;
using namespace smockron::proxy;
using namespace std::string_literals;

namespace {

config::proxy_config make_config(bool fail_closed, std::string_view unidentified = "shared") {
  auto r = config::load_string(std::string(R"(
[proxy]
accounting = []
control = []
)") + (fail_closed ? "fail_closed = true\n" : "") +
                                   R"(
[proxy.upstreams.app]
servers = ["127.0.0.1:1"]
[[proxy.routes]]
path = "/"
domain = "api"
upstream = "app"
identify = ["header:X-Key"]
unidentified = ")" + std::string(unidentified) +
                                   "\"\n",
                               "t");
  EXPECT_TRUE(r.cfg) << r.errors.front().message;
  return *r.cfg->proxy;
}

class Admission : public ::testing::Test {
protected:
  explicit Admission(bool fail_closed = false, std::string_view unidentified = "shared")
      : rt_(make_config(fail_closed, unidentified), domains_, metrics_, 0),
        sender_(ioc_, {}, 100, counters_),
        env_{gate_, metrics_, sender_} {}

  admission admit_with(std::string head) {
    head_ = std::move(head);
    EXPECT_EQ(http1::parse_request(head_, 8192, req_).status, http1::parse_status::complete);
    const route* r = rt_.routes.match(req_.host, req_.target);
    return admit(env_, rt_, *r, req_, *parse_ip("10.0.0.1"), clock_.wall_us());
  }
  double metric(const std::string& line) const {
    const std::string text = registry_.render();
    const auto at = text.find("\n" + line + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size() + 2));
  }
  double decisions(std::string_view d) const {
    return metric("smockron_proxy_requests_total{domain=\"api\",decision=\"" + std::string(d) + "\"}");
  }

  manual_clock clock_;
  metrics::registry registry_;
  proxy_metrics metrics_{registry_};
  domain_registry domains_;
  gate gate_;
  runtime rt_;
  boost::asio::io_context ioc_;
  accounting_sender::counters counters_{registry_};
  accounting_sender sender_;
  admission_env env_;
  std::string head_;
  http1::request_head req_;
};

TEST_F(Admission, UnidentifiedRequestsShareOneIdentifierByDefault) {
  auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::accepted);
  ASSERT_TRUE(a.who);
  EXPECT_EQ(a.who->value, k_shared_identifier);
  EXPECT_EQ(metric("smockron_proxy_unidentified_total{action=\"shared\"}"), 1);
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), k_shared_identifier, now + 60'000'000, 100'000, now);
  a = admit_with("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected) << "all of them are limited together";
  EXPECT_EQ(admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k9\r\n\r\n").outcome, decision::accepted);
}

class RejectUnidentified : public Admission {
protected:
  RejectUnidentified() : Admission(false, "reject") {}
};

TEST_F(RejectUnidentified, AreRefused) {
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected);
  EXPECT_TRUE(a.unidentified);
  EXPECT_EQ(metric("smockron_proxy_rejects_total{reason=\"unidentified\"}"), 1);
  EXPECT_EQ(metric("smockron_proxy_unidentified_total{action=\"reject\"}"), 1);
}

class AllowUnidentified : public Admission {
protected:
  AllowUnidentified() : Admission(false, "allow") {}
};

TEST_F(AllowUnidentified, PassUnlimitedAndUnaccounted) {
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::unidentified);
  EXPECT_FALSE(a.who);
  EXPECT_EQ(decisions("unidentified"), 1);
  EXPECT_EQ(metric("smockron_proxy_unidentified_total{action=\"allow\"}"), 1);
  sender_.flush();
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 0) << "nothing accounted";
}

TEST_F(Admission, AcceptedIsAccountedInTheBatch) {
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::accepted);
  ASSERT_TRUE(a.who);
  EXPECT_EQ(a.who->value, "k1");
  EXPECT_EQ(decisions("accepted"), 1);
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 0) << "still in the batch";
  sender_.flush();
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 1) << "no master connected: unsent, counted";
}

TEST_F(Admission, DelayedRequestsAreHeldAndReportedAtOnce) {
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), "k1", now + 200'000, 100'000, now);
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::delayed);
  EXPECT_EQ(a.gate.release_us, now + 200'000);
  EXPECT_EQ(gate_.held(), 1);
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 1) << "a reservation leaves at once (no master: unsent)";
  gate_.release_held();
}

TEST_F(Admission, RequestsBeyondMaxDelayAreRejected) {
  const auto now = clock_.wall_us();
  gate_.update(domains_.id("api"), "k1", now + 60'000'000, 100'000, now);
  const auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected);
  EXPECT_FALSE(a.no_master);
  EXPECT_GE(a.gate.retry_after_s, 55);
  EXPECT_EQ(metric("smockron_proxy_rejects_total{reason=\"delay_too_long\"}"), 1);
  EXPECT_EQ(decisions("rejected"), 1);
}

class FailClosedAdmission : public Admission {
protected:
  FailClosedAdmission() : Admission(true) {}
};

TEST_F(FailClosedAdmission, NoMasterMeansRefusedUntilAPolicyArrives) {
  auto a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::rejected);
  EXPECT_TRUE(a.no_master);
  EXPECT_EQ(metric("smockron_proxy_rejects_total{reason=\"no_master\"}"), 1);
  gate_.set_policy(domains_.id("api"), {}, clock_.wall_us());
  a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_EQ(a.outcome, decision::accepted) << "a master covers the domain";
  clock_.advance(std::chrono::milliseconds(wire::policy_fresh_ms + 1));
  a = admit_with("GET / HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n");
  EXPECT_TRUE(a.no_master) << "the policy went stale";
}

}  // namespace
