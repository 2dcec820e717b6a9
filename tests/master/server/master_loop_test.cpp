// The master's accounting loop (libzmq PUB -> the master's ZMTP receiver on
// 127.0.0.1, its ZMTP publisher -> a libzmq SUB) with a manual clock:
// DELAY_UNTIL contents, error counting, subscription filtering, reloads.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <set>
#include <thread>

#include "master/io/control_publisher.hpp"
#include "master/server/service.hpp"
#include "shared/daemon/zmq_util.hpp"
#include "shared/protocol/wire.hpp"

using namespace smockron;
using namespace std::string_literals;

namespace {
config::master_config make_config() {
  auto r = config::load_string(R"(
[master]
[master.domains.api]
rules = [ { rate = "10/s", burst = 2 } ]
overrides = [ { identifier = "vip", rules = [ { rate = "100/s", burst = 20 } ] } ]
[master.domains.slow]
rules = [ { rate = "10/s", burst = 5 }, { rate = "1/s", burst = 2 } ]
[master.domains.probe]
rules = [ { rate = "1/h", burst = 1 } ]
)",
                               "test");
  auto cfg = *r.cfg->master;
  cfg.accounting = "tcp://127.0.0.1:*";
  cfg.control = "tcp://127.0.0.1:*";
  return cfg;
}

class MasterLoop : public ::testing::Test {
protected:
  MasterLoop()
      : cfg_(make_config()),
        svc_(cfg_, clock_, registry_),
        pub_(ctx_, zmq::socket_type::pub),
        sub_(ctx_, zmq::socket_type::sub) {
    clock_.set_wall_ms(now_ms_);
    sub_.connect(svc_.control_endpoint());
    sub_.set(zmq::sockopt::subscribe, "");
    pub_.connect(svc_.accounting_endpoint());
    // Both subscriptions propagate asynchronously: probe until a DELAY_UNTIL
    // round-trips through the master.
    for (int i = 0; i < 2000; ++i) {
      send({"probe\0"s, "ACCEPTED", "sync", std::to_string(now_ms_), ""});
      svc_.poll_once(std::chrono::milliseconds(1));
      zmq_util::multipart m;
      bool answered = false;
      while (zmq_util::recv(sub_, m, zmq::recv_flags::dontwait)) answered |= m.frames()[1] == "DELAY_UNTIL";
      if (answered) {
        fence();
        return;
      }
    }
    ADD_FAILURE() << "the sockets never connected";
  }

  // Probes still in flight would each draw a DELAY_UNTIL that a test reads as
  // its own: one last probe, named, is answered after all of them (one
  // connection, in order), and everything up to its answer is dropped.
  void fence() {
    send({"probe\0"s, "ACCEPTED", "fence", std::to_string(now_ms_), ""});
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < end) {
      svc_.poll_once(std::chrono::milliseconds(1));
      zmq_util::multipart m;
      while (zmq_util::recv(sub_, m, zmq::recv_flags::dontwait)) {
        if (m.frames()[1] == "DELAY_UNTIL" && m.frames()[2] == "fence") return;
      }
    }
    ADD_FAILURE() << "the fence probe was never answered";
  }

  void send(const std::vector<std::string>& frames) {
    std::vector<std::string_view> v(frames.begin(), frames.end());
    ASSERT_TRUE(zmq_util::send(pub_, v));
  }
  void handle(const std::vector<std::string>& frames) {
    std::vector<std::string_view> v(frames.begin(), frames.end());
    svc_.handle(v);
  }
  // The next control message (POLICY too when `policies`), if one arrives
  // within a short bound. The loop turns meanwhile: what the master publishes
  // leaves at the end of a turn.
  std::optional<std::vector<std::string>> next_control(bool policies = false) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < end) {
      svc_.poll_once(std::chrono::milliseconds(0));
      zmq::pollitem_t item{sub_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(1)) <= 0) continue;
      zmq_util::multipart m;
      if (!zmq_util::recv(sub_, m, zmq::recv_flags::dontwait)) continue;
      if (!policies && m.frames()[1] == "POLICY") continue;
      return std::vector<std::string>(m.views.begin(), m.views.begin() + static_cast<std::ptrdiff_t>(m.count));
    }
    return std::nullopt;
  }
  std::string ts(std::int64_t offset_ms) const { return std::to_string(now_ms_ + offset_ms); }
  std::string metrics() const { return registry_.render(); }

  const std::int64_t now_ms_ = 1'700'000'000'000;
  zmq::context_t ctx_;
  manual_clock clock_;
  metrics::registry registry_;
  config::master_config cfg_;
  master::service svc_;
  zmq::socket_t pub_;
  zmq::socket_t sub_;
};
}  // namespace

TEST_F(MasterLoop, PublishesDelayUntilOnlyWhenThrottled) {
  // The constructor's probes each drew a DELAY_UNTIL (more than one when the
  // subscription was slow to join): count from here.
  const auto published = [&] {
    const std::string text = metrics();
    const std::string name = "\nsmockron_master_control_messages_total ";
    const auto at = text.find(name);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + name.size()));
  };
  const double before = published();
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});  // under the burst: nothing published
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});  // burst full
  auto m = next_control();
  ASSERT_TRUE(m);
  EXPECT_EQ(*m, (std::vector<std::string>{"api\0"s, "DELAY_UNTIL", "k", ts(100), "100"}));
  handle({"api\0"s, "DELAYED", "k", ts(0), ts(100)});
  m = next_control();
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[3], ts(200));
  EXPECT_EQ(published(), before + 2);
}

TEST_F(MasterLoop, SlowerRuleSetsTheIntervalFrame) {
  handle({"slow\0"s, "ACCEPTED", "k", ts(0), ""});
  handle({"slow\0"s, "ACCEPTED", "k", ts(0), ""});
  auto m = next_control();
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[3], ts(1000));
  EXPECT_EQ((*m)[4], "1000");
}

TEST_F(MasterLoop, DelayedMessagesFromSeveralGatekeepersEachCount) {
  handle({"api\0"s, "ACCEPTED", "h", ts(0), ""});
  handle({"api\0"s, "ACCEPTED", "h", ts(0), ""});
  ASSERT_EQ((*next_control())[3], ts(100));
  for (int g = 0; g < 3; ++g) handle({"api\0"s, "DELAYED", "h", ts(1), ts(100)});
  EXPECT_EQ((*next_control())[3], ts(200));
  EXPECT_EQ((*next_control())[3], ts(300));
  EXPECT_EQ((*next_control())[3], ts(400));
}

TEST_F(MasterLoop, MalformedMessagesAreCountedAndValidTrafficContinues) {
  handle({"api\0"s, "ACCEPTED", "k", ts(0)});
  handle({"api"s, "ACCEPTED", "k", ts(0), ""});
  handle({"api\0"s, "ACCEPTED", "k", "soon", ""});
  handle({"api\0"s, "MAYBE", "k", ts(0), ""});
  handle({"api\0"s, "DELAYED", "k", ts(0), ""});
  handle({"api\0"s, "ACCEPTED", std::string(5000, 'x'), ts(0), ""});
  handle({"other\0"s, "ACCEPTED", "k", ts(0), ""});
  const auto text = metrics();
  for (auto reason : {"frame_count", "domain_not_terminated", "timestamp_not_numeric", "unknown_status",
                      "delayed_missing", "frame_too_large"}) {
    EXPECT_NE(text.find("smockron_master_decode_errors_total{reason=\""s + reason + "\"} 1"), std::string::npos)
        << reason;
  }
  EXPECT_NE(text.find("smockron_master_unknown_domain_total 1"), std::string::npos);
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});
  ASSERT_TRUE(next_control());
}

TEST_F(MasterLoop, ReceivesOverZeroMqAndCountsOversizedMessages) {
  std::vector<std::string> twenty(20, "x");
  twenty[0] = "api\0"s;
  send(twenty);
  send({"api\0"s, "ACCEPTED", "z", ts(0), ""});
  send({"api\0"s, "ACCEPTED", "z", ts(0), ""});
  // The three may arrive over several polls: poll until both ACCEPTED are in.
  const std::string both = "smockron_master_accounting_messages_total{domain=\"api\",status=\"ACCEPTED\"} 2";
  for (int i = 0; i < 400 && metrics().find(both) == std::string::npos; ++i)
    svc_.poll_once(std::chrono::milliseconds(5));
  auto m = next_control();
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[2], "z");
  EXPECT_NE(metrics().find("smockron_master_decode_errors_total{reason=\"frame_count\"} 1"), std::string::npos);
  EXPECT_NE(metrics().find("smockron_master_accounting_messages_total{domain=\"api\",status=\"ACCEPTED\"} 2"),
            std::string::npos);
}

TEST_F(MasterLoop, SubscribesOnlyToOwnedDomains) {
  send({"elsewhere\0"s, "ACCEPTED", "k", ts(0), ""});
  send({"api2\0"s, "ACCEPTED", "k", ts(0), ""});  // "api" must not prefix-match "api2"
  send({"api\0"s, "ACCEPTED", "k", ts(0), ""});
  send({"api\0"s, "ACCEPTED", "k", ts(0), ""});
  const std::string both = "smockron_master_accounting_messages_total{domain=\"api\",status=\"ACCEPTED\"} 2";
  for (int i = 0; i < 400 && metrics().find(both) == std::string::npos; ++i)
    svc_.poll_once(std::chrono::milliseconds(5));
  ASSERT_TRUE(next_control());
  EXPECT_NE(metrics().find("smockron_master_unknown_domain_total 0"), std::string::npos);
}

TEST_F(MasterLoop, ReloadKeepsStateAndAppliesNewRules) {
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});
  auto next = cfg_;
  std::erase_if(next.domains, [](const auto& d) { return d.name == "slow"; });
  next.domains[0].rules[0].burst = 3;  // api: burst 2 -> 3
  svc_.request_reload([&] { return std::optional(next); });
  svc_.poll_once(std::chrono::milliseconds(1));
  EXPECT_NE(metrics().find("smockron_master_reloads_total 1"), std::string::npos);
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});  // 2 of 3: kept state, not yet throttled
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});
  auto m = next_control();
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[3], ts(100));
  EXPECT_EQ(svc_.status_json().find("\"slow\""), std::string::npos);
  handle({"slow\0"s, "ACCEPTED", "k", ts(0), ""});
  EXPECT_NE(metrics().find("smockron_master_unknown_domain_total 1"), std::string::npos);

  svc_.request_reload([] { return std::optional<config::master_config>(); });  // invalid file
  svc_.poll_once(std::chrono::milliseconds(1));
  EXPECT_NE(metrics().find("smockron_master_reload_failures_total 1"), std::string::npos);
}

TEST_F(MasterLoop, OverrideGivesOneIdentifierItsOwnLimitAndReloads) {
  for (int i = 0; i < 19; ++i) handle({"api\0"s, "ACCEPTED", "vip", ts(0), ""});  // 19 of its own burst of 20
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});  // the domain's burst of 2: throttled
  auto m = next_control();
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[2], "k") << "vip was not throttled";
  handle({"api\0"s, "ACCEPTED", "vip", ts(0), ""});  // 20 of 20
  m = next_control();
  ASSERT_TRUE(m);
  EXPECT_EQ(*m, (std::vector<std::string>{"api\0"s, "DELAY_UNTIL", "vip", ts(10), "10"}));
  // The admin thread asks; the loop answers within its next turn.
  std::optional<std::string> answer;
  std::atomic<bool> done{false};
  std::thread asker([&] {
    answer = svc_.identifier_status("api", "vip", std::chrono::seconds(5));
    done = true;
  });
  for (int i = 0; i < 500 && !done; ++i) svc_.poll_once(std::chrono::milliseconds(10));
  asker.join();
  ASSERT_TRUE(answer);
  const auto status = nlohmann::json::parse(*answer);
  EXPECT_EQ(status["override"], true);
  EXPECT_EQ(status["rules"][0]["burst"], 20);

  // Reload without the override: vip's state (20 uses under other rules of
  // the same shape) is kept, and the domain's burst of 2 applies to it now.
  auto next = cfg_;
  for (auto& d : next.domains) d.overrides.clear();
  svc_.request_reload([&] { return std::optional(next); });
  svc_.poll_once(std::chrono::milliseconds(1));
  EXPECT_NE(metrics().find("smockron_master_reloads_total 1"), std::string::npos);
  handle({"api\0"s, "ACCEPTED", "vip", ts(500), ""});
  m = next_control();
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[2], "vip");
  EXPECT_GT(std::stoll((*m)[3]), now_ms_ + 500) << "throttled under the domain's rules";
}

TEST_F(MasterLoop, StatusAndLiveness) {
  handle({"api\0"s, "ACCEPTED", "k", ts(0), ""});
  const auto status = svc_.status_json();
  EXPECT_NE(
      status.find(
          "{\"name\":\"api\",\"algorithm\":\"sliding-log\",\"rules\":[{\"rate\":\"10/s\",\"burst\":2}],"
          "\"overrides\":[{\"identifier\":\"vip\",\"rules\":[{\"rate\":\"100/s\",\"burst\":20}],\"source\":\"file\"}],"
          "\"tracked_identifiers\":1}"),
      std::string::npos)
      << status;
  EXPECT_TRUE(svc_.alive(std::chrono::seconds(5)));
  clock_.advance(std::chrono::seconds(10));
  EXPECT_FALSE(svc_.alive(std::chrono::seconds(5)));
}

TEST_F(MasterLoop, ExpiredStateIsSweptOnTheLoopTick) {
  handle({"api\0"s, "ACCEPTED", "gone", ts(0), ""});
  EXPECT_EQ(svc_.tracked(), 3u);  // + the probe identifiers (sync, fence)
  clock_.advance(std::chrono::seconds(1));
  svc_.poll_once(std::chrono::milliseconds(1));
  EXPECT_EQ(svc_.tracked(), 3u) << "kept a while for uses reported late";
  clock_.advance(std::chrono::microseconds(master::limiter::k_late_us));
  svc_.poll_once(std::chrono::milliseconds(1));
  EXPECT_EQ(svc_.tracked(), 2u);  // the 1/h probe states are still relevant
  EXPECT_NE(metrics().find("smockron_master_expirations_total 1"), std::string::npos);
}

TEST_F(MasterLoop, PublishesEveryDomainsPolicyEverySecond) {
  // Only what poll_once publishes from here on.
  for (zmq_util::multipart m; zmq_util::recv(sub_, m, zmq::recv_flags::dontwait);) {}
  std::set<std::vector<std::string>> seen;
  const auto collect = [&] {
    seen.clear();
    for (zmq_util::multipart m; zmq_util::recv(sub_, m, zmq::recv_flags::dontwait);) {
      seen.emplace(m.views.begin(), m.views.begin() + static_cast<std::ptrdiff_t>(m.count));
    }
  };
  clock_.advance(std::chrono::milliseconds(wire::policy_interval_ms));
  svc_.poll_once(std::chrono::milliseconds(1));
  ASSERT_TRUE(next_control(true));  // wait for the first one, then take the rest
  collect();
  EXPECT_GE(seen.size(), 2u);
  svc_.poll_once(std::chrono::milliseconds(1));  // less than a second later: nothing more
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  collect();
  EXPECT_TRUE(seen.empty());
  clock_.advance(std::chrono::milliseconds(wire::policy_interval_ms));
  svc_.poll_once(std::chrono::milliseconds(1));
  const auto first = next_control(true);
  ASSERT_TRUE(first);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  collect();
  seen.insert(*first);
  EXPECT_TRUE(seen.contains({"api\0"s, "POLICY", "", "100000/2"}));
  EXPECT_TRUE(seen.contains({"api\0"s, "POLICY", "vip", "10000/20"})) << "the override goes with its domain";
  EXPECT_TRUE(seen.contains({"slow\0"s, "POLICY", "", "100000/5 1000000/2"}));
  EXPECT_TRUE(seen.contains({"probe\0"s, "POLICY", "", "3600000000/1"}));
}

TEST_F(MasterLoop, NewSubscriberGetsItsDomainsPolicyAtOnce) {
  // Each new subscriber of a domain gets its POLICY without waiting for the
  // periodic one (a second subscriber to the same topic too: XPUB verbose),
  // at most one per domain per k_policy_gap.
  const auto wait_policy = [&](zmq::socket_t& sub) -> std::optional<std::vector<std::string>> {
    for (int i = 0; i < 200; ++i) {
      svc_.poll_once(std::chrono::milliseconds(5));
      zmq_util::multipart m;
      if (zmq_util::recv(sub, m, zmq::recv_flags::dontwait)) {
        return std::vector<std::string>(m.views.begin(), m.views.begin() + static_cast<std::ptrdiff_t>(m.count));
      }
    }
    return std::nullopt;
  };
  const std::vector<std::string> slow{"slow\0"s, "POLICY", "", "100000/5 1000000/2"};
  // The fixture's subscriber asked for every POLICY within the gap: those go out first.
  clock_.advance(master::control_publisher::k_policy_gap);
  for (int i = 0; i < 5; ++i) svc_.poll_once(std::chrono::milliseconds(1));
  zmq::socket_t first(ctx_, zmq::socket_type::sub), second(ctx_, zmq::socket_type::sub);
  first.connect(svc_.control_endpoint());
  first.set(zmq::sockopt::subscribe, "slow\0"s);
  clock_.advance(master::control_publisher::k_policy_gap);  // well under the periodic second
  EXPECT_EQ(wait_policy(first), slow);
  second.connect(svc_.control_endpoint());
  second.set(zmq::sockopt::subscribe, "slow\0"s);
  // Within the gap it waits; once the gap has passed it goes out.
  for (int i = 0; i < 20; ++i) svc_.poll_once(std::chrono::milliseconds(5));
  zmq_util::multipart m;
  EXPECT_FALSE(zmq_util::recv(second, m, zmq::recv_flags::dontwait));
  clock_.advance(master::control_publisher::k_policy_gap);
  EXPECT_EQ(wait_policy(second), slow);
}
