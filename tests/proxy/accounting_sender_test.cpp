// The proxy's accounting sender against the master's receiver on loopback:
// the handshake, subscriptions, batching, reservations sent at once,
// REJECTED sampling, and a lost master counted by reason.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "master/zmtp_subscriber.hpp"
#include "proxy/accounting_sender.hpp"
#include "smockron/clock.hpp"

using namespace smockron;
using namespace std::string_literals;

namespace {

class AccountingSender : public ::testing::Test {
protected:
  AccountingSender()
      : master_(std::make_unique<master::zmtp_subscriber>("tcp://127.0.0.1:*", master::zmtp_subscriber::options{},
                                                          system_clock::instance(), master_registry_)),
        sender_(ioc_, {master_->endpoint()}, 1000, counters_) {
    master_->subscribe("api\0"s);
  }

  // Runs both ends until `done` or 5 s.
  template <class F>
  bool until(F done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done() && std::chrono::steady_clock::now() < end) {
      ioc_.run_for(std::chrono::milliseconds(1));
      poll_master();
    }
    return done();
  }
  void poll_master() {
    if (!master_) return;
    master_->poll(std::chrono::milliseconds(0),
                  [this](std::span<const std::string_view> f, bool) { got_.emplace_back(f.begin(), f.end()); });
  }
  // Connected and subscribed: a probe arrives.
  void connect() {
    ASSERT_TRUE(until([&] { return sender_.connected() == 1 && master_->peers() == 1; }));
    ASSERT_TRUE(until([&] {
      if (got_.empty()) account(wire::status::delayed, "probe");
      return !got_.empty();
    }));
    got_.clear();
  }
  void account(wire::status st, std::string id, proxy::accounting_sender::policy p = {}) {
    ids_.push_back(std::move(id));
    wire::accounting m;
    m.domain = "api";
    m.state = st;
    m.identifier = ids_.back();
    m.received_ms = 1'700'000'000'000;
    m.delayed_ms = st == wire::status::delayed ? m.received_ms + 100 : 0;
    sender_.account(m, p);
  }
  double metric(const std::string& line) const {
    const std::string text = registry_.render();
    const auto at = text.find("\n" + line + " ");
    return at == std::string::npos ? 0 : std::stod(text.substr(at + line.size() + 2));
  }

  metrics::registry registry_, master_registry_;
  std::unique_ptr<master::zmtp_subscriber> master_;
  boost::asio::io_context ioc_;
  proxy::accounting_sender::counters counters_{registry_};
  proxy::accounting_sender sender_;
  std::vector<std::vector<std::string>> got_;
  std::vector<std::string> ids_;
};

TEST_F(AccountingSender, BatchesLeaveWithinTheFlushIntervalInOrder) {
  connect();
  for (int i = 0; i < 300; ++i)
    account(wire::status::accepted, "id" + std::to_string(i), {std::chrono::milliseconds(2), 1.0});
  ASSERT_TRUE(until([&] { return got_.size() == 300; }));
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(got_[static_cast<std::size_t>(i)].size(), 5u);
    EXPECT_EQ(got_[static_cast<std::size_t>(i)][2], "id" + std::to_string(i));
  }
  EXPECT_EQ(metric("smockron_proxy_accounting_messages_total"), 301);  // + the probe
}

TEST_F(AccountingSender, AReservationLeavesWithoutWaitingForTheTimer) {
  connect();
  account(wire::status::accepted, "batched", {std::chrono::seconds(60), 1.0});
  account(wire::status::delayed, "held", {std::chrono::seconds(60), 1.0});
  // No timer runs: only the immediate flush can have sent them.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (got_.size() < 2 && std::chrono::steady_clock::now() < end) poll_master();
  ASSERT_EQ(got_.size(), 2u);
  EXPECT_EQ(got_[0][2], "batched") << "the batch goes with it, in order";
  EXPECT_EQ(got_[1][1], "DELAYED");
}

TEST_F(AccountingSender, RejectedMessagesAreSampled) {
  connect();
  for (int i = 0; i < 50; ++i) account(wire::status::rejected, "r", {std::chrono::milliseconds(1), 0.0});
  account(wire::status::delayed, "marker");
  ASSERT_TRUE(until([&] { return !got_.empty(); }));
  ASSERT_EQ(got_.size(), 1u) << "rejected_sample = 0 sends none";
  EXPECT_EQ(got_[0][2], "marker");
}

TEST_F(AccountingSender, ALostMasterIsCountedByReasonAndUnsentAfter) {
  connect();
  master_.reset();
  ASSERT_TRUE(until([&] { return sender_.connected() == 0; }));
  EXPECT_EQ(metric("smockron_proxy_accounting_disconnects_total{reason=\"closed\"}"), 1);
  const double unsent = metric("smockron_proxy_accounting_unsent_total");  // probes sent before the subscription
  account(wire::status::delayed, "nobody");
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), unsent + 1);
}

TEST_F(AccountingSender, ANonZeroMqPeerIsAGreetingFault) {
  // A plain TCP server that answers with HTTP instead of a ZMTP greeting.
  boost::asio::ip::tcp::acceptor acceptor(ioc_, {boost::asio::ip::make_address("127.0.0.1"), 0});
  proxy::accounting_sender to_http(ioc_, {"tcp://127.0.0.1:" + std::to_string(acceptor.local_endpoint().port())}, 10,
                                   counters_);
  boost::asio::ip::tcp::socket peer(ioc_);
  const std::string answer = "HTTP/1.1 400 Bad Request\r\n\r\n";
  acceptor.async_accept(peer, [&](const boost::system::error_code& ec) {
    if (!ec) boost::asio::write(peer, boost::asio::buffer(answer));
  });
  ASSERT_TRUE(until([&] { return metric("smockron_proxy_accounting_disconnects_total{reason=\"greeting\"}") >= 1; }));
  EXPECT_EQ(to_http.connected(), 0u);
}

}  // namespace
