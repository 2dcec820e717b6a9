// The proxy's accounting sender against the master's receiver on loopback:
// the handshake, subscriptions, batching, reservations sent at once,
// REJECTED sampling, and a lost master counted by reason.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <zmq.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "master/io/zmtp_server.hpp"
#include "proxy/cluster/accounting_sender.hpp"
#include "shared/base/clock.hpp"
#include "shared/protocol/hash_ring.hpp"
#include "shared/protocol/wire_batch.hpp"
#include "shared/protocol/zmtp_curve.hpp"

using namespace smockron;
using namespace std::string_literals;

namespace {

class AccountingSender : public ::testing::Test {
protected:
  AccountingSender()
      : master_(std::make_unique<master::zmtp_server>(master_loop_, "tcp://127.0.0.1:*", master::zmtp_server::options{},
                                                      system_clock::instance(), master_registry_)),
        sender_(ioc_, {master_->endpoint()}, 1000, counters_) {
    master_->subscribe("api\0"s);
  }

  // Runs both ends until `done` or 5 s.
  template <class F>
  bool until(F done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
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
  // Connected and subscribed (the gauge says so): the first message sent arrives.
  void connect() {
    ASSERT_TRUE(until([&] { return metric("smockron_proxy_accounting_links_subscribed") == 1; }));
    EXPECT_EQ(sender_.connected(), 1u);
    account(wire::status::delayed, "first");
    ASSERT_TRUE(until([&] { return !got_.empty(); }));
    ASSERT_EQ(got_.size(), 1u);
    EXPECT_EQ(got_[0][2], "first");
    EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 0) << "nothing was sent before the subscription";
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
  master::event_loop master_loop_;
  std::unique_ptr<master::zmtp_server> master_;
  boost::asio::io_context ioc_;
  proxy::accounting_sender::counters counters_{registry_};
  proxy::accounting_sender sender_;
  std::vector<std::vector<std::string>> got_;
  std::vector<std::string> ids_;
};

TEST_F(AccountingSender, BatchesLeaveWithinTheFlushIntervalInOrder) {
  connect();
  const auto before = metric("smockron_proxy_accounting_messages_total");  // the probes
  for (int i = 0; i < 300; ++i)
    account(wire::status::accepted, "id" + std::to_string(i), {std::chrono::milliseconds(2), 1.0});
  ASSERT_TRUE(until([&] { return got_.size() == 300; }));
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(got_[static_cast<std::size_t>(i)].size(), 5u);
    EXPECT_EQ(got_[static_cast<std::size_t>(i)][2], "id" + std::to_string(i));
  }
  EXPECT_EQ(metric("smockron_proxy_accounting_messages_total") - before, 300);
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
  EXPECT_EQ(metric("smockron_proxy_accounting_links_subscribed"), 0);
  account(wire::status::delayed, "nobody");
  EXPECT_EQ(metric("smockron_proxy_accounting_unsent_total"), 1);
}

// Under CURVE the sender packs a flush's messages of one domain into BATCH
// messages; the master's receiver (a CURVE server) takes them, and unpacked
// they are every message, whole and in order, however the batches were cut.
TEST(AccountingSenderCurve, BatchesOverCurveCarryEveryMessageInOrder) {
  const auto server = zmtp::curve::generate(), client = zmtp::curve::generate();
  auto sk = std::make_shared<zmtp::curve::server_keys>();
  sk->own.push_back(server);
  sk->allowed.insert(client.public_key);
  auto ck = std::make_shared<zmtp::curve::client_keys>();
  ck->own = client;
  ck->server = server.public_key;
  metrics::registry registry, master_registry;
  master::event_loop loop;
  master::zmtp_server master(loop, "tcp://127.0.0.1:*", {.curve = sk}, system_clock::instance(), master_registry);
  master.subscribe("api\0"s);
  boost::asio::io_context ioc;
  proxy::accounting_sender::counters counters(registry);
  proxy::accounting_sender sender(ioc, {master.endpoint()}, 100'000, counters, {}, {{master.endpoint(), ck}});
  std::vector<std::vector<std::string>> got;
  std::size_t batches = 0;
  const auto until = [&](auto done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < end) {
      ioc.run_for(std::chrono::milliseconds(1));
      master.poll(std::chrono::milliseconds(0), [&](std::span<const std::string_view> f, bool) {
        if (!wire::is_batch(f)) return got.emplace_back(f.begin(), f.end()), void();
        ++batches;
        ASSERT_TRUE(wire::for_each_batch_record(f, [&](auto r) { got.emplace_back(r.begin(), r.end()); }));
      });
    }
    return done();
  };
  ASSERT_TRUE(until([&] { return master.peers() == 1 && sender.delivers("api"); }));
  std::minstd_rand rng(3);
  std::vector<std::string> ids;
  for (int i = 0; i < 2000; ++i) {
    ids.push_back("id-" + std::to_string(i) + std::string(rng() % 300, 'x'));
    wire::accounting m;
    m.domain = "api";
    m.state = i % 7 == 0 ? wire::status::delayed : wire::status::accepted;
    m.identifier = ids.back();
    m.received_ms = 1'700'000'000'000 + i;
    m.delayed_ms = m.state == wire::status::delayed ? m.received_ms + 5 : 0;
    sender.account(m, {std::chrono::milliseconds(2), 1.0});
    if (i % 100 == 0) ioc.run_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(until([&] { return got.size() == ids.size(); })) << got.size();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ASSERT_GE(got[i].size(), 5u);
    EXPECT_EQ(got[i][0], "api\0"s);
    EXPECT_EQ(got[i][2], ids[i]) << i;
  }
  EXPECT_GT(batches, 0u);
  EXPECT_LT(batches, ids.size() / 2) << "most messages share a batch";
}

// A domain split across two masters by identifier: each message goes to the
// one master that owns its identifier, the same one every time.
TEST(AccountingSenderShards, EachMessageGoesToTheShareOfItsIdentifier) {
  metrics::registry reg, mreg;
  master::event_loop loops[2];  // one master each, polled apart
  std::vector<std::unique_ptr<master::zmtp_server>> masters;
  for (int i = 0; i < 2; ++i) {
    masters.push_back(std::make_unique<master::zmtp_server>(
        loops[i], "tcp://127.0.0.1:*", master::zmtp_server::options{}, system_clock::instance(), mreg));
    masters.back()->subscribe("api\0"s);
    masters.back()->subscribe("other\0"s);
  }
  const std::vector<std::string> endpoints = {masters[0]->endpoint(), masters[1]->endpoint()};
  boost::asio::io_context ioc;
  proxy::accounting_sender::counters counters(reg);
  proxy::accounting_sender sender(ioc, endpoints, 1000, counters, {{"api", {{endpoints[0]}, {endpoints[1]}}}});
  std::vector<std::vector<std::string>> got[2];
  const auto pump = [&] {
    ioc.run_for(std::chrono::milliseconds(1));
    for (int i = 0; i < 2; ++i) {
      masters[static_cast<std::size_t>(i)]->poll(
          std::chrono::milliseconds(0),
          [&](std::span<const std::string_view> f, bool) { got[i].emplace_back(f.begin(), f.end()); });
    }
  };
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((sender.connected() < 2 || masters[0]->peers() < 1 || masters[1]->peers() < 1) &&
         std::chrono::steady_clock::now() < end) {
    pump();
  }
  ASSERT_EQ(sender.connected(), 2u);
  std::vector<std::string> ids;
  for (int i = 0; i < 200; ++i) ids.push_back("user-" + std::to_string(i));
  // Subscriptions travel asynchronously: send until both have one message, then the real batch.
  const auto send = [&](std::string_view domain, const std::string& id) {
    wire::accounting m;
    m.domain = domain;
    m.state = wire::status::delayed;
    m.identifier = id;
    m.received_ms = 1'700'000'000'000;
    m.delayed_ms = m.received_ms + 100;
    sender.account(m, {});
  };
  while (got[0].empty() || got[1].empty()) {
    ASSERT_LT(std::chrono::steady_clock::now(), end);
    send("other", "probe");
    pump();
  }
  got[0].clear();
  got[1].clear();
  for (int round = 0; round < 2; ++round) {
    for (const auto& id : ids) send("api", id);
  }
  send("other", "everyone");
  while (got[0].size() + got[1].size() < 2 * ids.size() + 2 && std::chrono::steady_clock::now() < end) pump();
  const hash_ring ring({endpoints[0], endpoints[1]});
  std::size_t api_messages = 0;
  for (int i = 0; i < 2; ++i) {
    for (const auto& m : got[i]) {
      if (m[0] != "api\0"s) {
        EXPECT_EQ(m[2], "everyone") << "an unsharded domain reaches every master";
        continue;
      }
      ++api_messages;
      EXPECT_EQ(ring.owner(m[2]), static_cast<std::size_t>(i)) << m[2] << " reached a master that does not own it";
    }
  }
  EXPECT_EQ(api_messages, 2 * ids.size()) << "each message exactly once";
  EXPECT_GT(got[0].size(), ids.size() / 2) << "both masters have a share";
  EXPECT_GT(got[1].size(), ids.size() / 2);
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

// Against libzmq's SUB (the reference receiver): random identifiers and log
// info of every size up to the wire's bounds (arbitrary bytes, frames over
// 255 bytes in the long size form), every status, a subscription changed at
// run time. Every message the SUB subscribed to arrives intact and in order,
// none of the others is sent, and the counters say exactly that.
TEST(AccountingSenderAgainstLibzmq, EveryMessageArrivesIntactInOrderAndTheCountersMatch) {
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::rcvtimeo, 0);
  sub.set(zmq::sockopt::rcvhwm, 0);
  sub.bind("tcp://127.0.0.1:*");
  sub.set(zmq::sockopt::subscribe, "api\0"s);
  metrics::registry registry;
  proxy::accounting_sender::counters counters(registry);
  boost::asio::io_context ioc;
  proxy::accounting_sender sender(ioc, {sub.get(zmq::sockopt::last_endpoint)}, 0, counters);
  std::vector<std::vector<std::string>> got;
  auto receive = [&] {
    for (;;) {
      std::vector<std::string> frames;
      zmq::message_t m;
      if (!sub.recv(m, zmq::recv_flags::dontwait)) return;
      frames.push_back(m.to_string());
      while (m.more()) {
        ASSERT_TRUE(sub.recv(m));
        frames.push_back(m.to_string());
      }
      got.push_back(std::move(frames));
    }
  };
  auto until = [&](auto done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < end) {
      ioc.run_for(std::chrono::milliseconds(1));
      receive();
    }
    return done();
  };
  const proxy::accounting_sender::policy now{std::chrono::microseconds(0), 1.0};
  std::deque<std::string> keep;  // the messages' bytes outlive account() (a deque: views stay valid as it grows)
  auto send = [&](std::string_view domain, wire::status st, std::string id, std::string info = {}) {
    keep.push_back(std::move(id));
    const std::string_view identifier = keep.back();
    keep.push_back(std::move(info));
    wire::accounting m{
        domain, st, identifier, 1'700'000'000'000, st == wire::status::delayed ? 1'700'000'000'100 : 0, keep.back()};
    sender.account(m, now);
  };
  // Connected and subscribed: probes until one arrives, then a marker behind the probes in flight.
  ASSERT_TRUE(until([&] {
    if (got.empty()) send("api", wire::status::accepted, "probe");
    return !got.empty();
  }));
  send("api", wire::status::accepted, "sync");
  ASSERT_TRUE(until([&] { return got.back()[2] == "sync"; }));
  got.clear();

  std::mt19937 rng(20261123);
  auto random_bytes = [&](std::size_t n) {
    std::string b(n, '\0');
    for (auto& c : b) c = static_cast<char>(rng() % 256);
    return b;
  };
  auto size_up_to = [&](std::size_t bound) {  // short and long frames, and the bound itself
    const auto r = rng() % 8;
    return r == 0 ? bound : r < 4 ? 1 + rng() % 32 : 1 + rng() % bound;
  };
  struct expected {
    std::string domain, status, identifier, delayed, loginfo;
  };
  std::vector<expected> want;
  constexpr std::array statuses{wire::status::accepted, wire::status::delayed, wire::status::rejected};
  constexpr std::array names{"ACCEPTED", "DELAYED", "REJECTED"};
  auto burst = [&](std::string_view subscribed, std::string_view other, int n) {
    int other_count = 0;
    for (int i = 0; i < n; ++i) {
      const auto k = rng() % 3;
      auto id = random_bytes(size_up_to(wire::max_identifier_bytes));
      auto info = rng() % 3 == 0 ? random_bytes(size_up_to(wire::max_loginfo_bytes)) : std::string();
      if (rng() % 5 == 0) {  // for a domain the SUB does not want: filtered at the sender
        send(other, statuses[k], std::move(id), std::move(info));
        ++other_count;
        continue;
      }
      want.push_back({std::string(subscribed) + '\0', names[k], id, k == 1 ? "1700000000100" : "", info});
      send(subscribed, statuses[k], std::move(id), std::move(info));
    }
    return other_count;
  };
  burst("api", "web", 1500);
  ASSERT_TRUE(until([&] { return got.size() >= want.size(); })) << got.size() << " of " << want.size();

  // The SUB changes its mind: web instead of api. Once a web probe arrives, api is off.
  sub.set(zmq::sockopt::unsubscribe, "api\0"s);
  sub.set(zmq::sockopt::subscribe, "web\0"s);
  const auto before_switch = got.size();
  ASSERT_TRUE(until([&] {
    if (got.size() == before_switch || got.back()[0] != "web\0"s) {
      send("web", wire::status::accepted, "probe");
    }
    return got.size() > before_switch && got.back()[0] == "web\0"s;
  }));
  send("web", wire::status::accepted, "sync");
  ASSERT_TRUE(until([&] { return got.back()[2] == "sync"; }));
  const auto switch_sent = counters.sent.value(), switch_unsent = counters.unsent.value();
  got.erase(got.begin() + static_cast<std::ptrdiff_t>(before_switch), got.end());
  const auto first_web = want.size();
  const int filtered = burst("web", "api", 1500);
  ASSERT_TRUE(until([&] { return got.size() >= want.size(); })) << got.size() << " of " << want.size();
  send("web", wire::status::accepted, "end");
  ASSERT_TRUE(until([&] { return got.back()[2] == "end"; }));
  got.pop_back();

  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto& w = want[i];
    std::vector<std::string> frames{w.domain, w.status, w.identifier, "1700000000000", w.delayed};
    if (!w.loginfo.empty()) frames.push_back(w.loginfo);
    ASSERT_EQ(got[i], frames) << "message " << i << (i >= first_web ? " (after the switch)" : "");
  }
  // Counted after the switch: what left for the subscriber as sent (with
  // "end"), what it no longer wanted as unsent; nothing dropped or lost.
  EXPECT_EQ(counters.sent.value() - switch_sent, want.size() - first_web + 1);
  EXPECT_EQ(counters.unsent.value() - switch_unsent, static_cast<std::uint64_t>(filtered));
  EXPECT_EQ(counters.dropped.value(), 0u);
  EXPECT_EQ(counters.lost.value(), 0u);
}

}  // namespace

// Masters found by DNS: set_masters() connects the masters a name stands
// for and drops the gone ones; a sharded domain's shares are keyed by the
// configured names, so a share whose master moved to a new address keeps
// its identifiers.
TEST(AccountingSenderDiscovery, MastersComeAndGoAndAShareFollowsItsNameToANewAddress) {
  metrics::registry reg, mreg;
  master::event_loop loops[3];
  std::vector<std::unique_ptr<master::zmtp_server>> masters;
  for (auto& loop : loops) {
    masters.push_back(std::make_unique<master::zmtp_server>(loop, "tcp://127.0.0.1:*", master::zmtp_server::options{},
                                                            system_clock::instance(), mreg));
    masters.back()->subscribe("api\0"s);
  }
  const std::vector<std::string> names = {"srv+tcp://_acc._tcp.s0.test", "srv+tcp://_acc._tcp.s1.test"};
  boost::asio::io_context ioc;
  proxy::accounting_sender::counters counters(reg);
  proxy::accounting_sender sender(ioc, names, 1000, counters, {{"api", {{names[0]}, {names[1]}}}});
  EXPECT_EQ(sender.connected(), 0u) << "a name's masters come with its first answer";

  std::vector<std::vector<std::string>> got[3];
  const auto pump = [&] {
    ioc.run_for(std::chrono::milliseconds(1));
    for (std::size_t i = 0; i < 3; ++i) {
      masters[i]->poll(std::chrono::milliseconds(0),
                       [&](std::span<const std::string_view> f, bool) { got[i].emplace_back(f.begin(), f.end()); });
    }
  };
  const auto send = [&](const std::string& id) {
    wire::accounting m;
    m.domain = "api";
    m.state = wire::status::delayed;
    m.identifier = id;
    m.received_ms = 1'700'000'000'000;
    m.delayed_ms = m.received_ms + 100;
    sender.account(m, {});
  };
  const auto subscribed = [&] { return reg.render().find("smockron_proxy_accounting_links_subscribed 2\n"); };
  const auto settle = [&] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (subscribed() == std::string::npos && std::chrono::steady_clock::now() < end) pump();
    ASSERT_NE(subscribed(), std::string::npos) << reg.render();
    for (auto& g : got) g.clear();
  };
  const hash_ring ring(names);
  // Sends 100 identifiers; each must reach exactly the master serving its share (and none `gone`).
  const auto round = [&](std::size_t share0, std::size_t share1, std::optional<std::size_t> gone = std::nullopt) {
    for (int i = 0; i < 100; ++i) send("user-" + std::to_string(i));
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (got[share0].size() + got[share1].size() < 100 && std::chrono::steady_clock::now() < end) pump();
    const std::size_t serving[2] = {share0, share1};
    for (std::size_t s = 0; s < 2; ++s) {
      for (const auto& m : got[serving[s]]) EXPECT_EQ(ring.owner(m[2]), s) << m[2];
    }
    EXPECT_EQ(got[share0].size() + got[share1].size(), 100u);
    EXPECT_GT(got[share0].size(), 20u);
    EXPECT_GT(got[share1].size(), 20u);
    if (gone) {
      EXPECT_TRUE(got[*gone].empty()) << "the gone master receives nothing more";
    }
    for (auto& g : got) g.clear();
  };

  sender.set_masters(names[0], {masters[0]->endpoint()});
  sender.set_masters(names[1], {masters[1]->endpoint()});
  settle();
  round(0, 1);

  // Share 0's master moved: its name now answers master 2. Master 1's link is untouched.
  sender.set_masters(names[0], {masters[2]->endpoint()});
  settle();
  round(2, 1, 0);
  EXPECT_EQ(sender.connected(), 2u);
  const std::string text = reg.render();
  for (std::size_t at = text.find("smockron_proxy_accounting_disconnects_total{"); at != std::string::npos;
       at = text.find("smockron_proxy_accounting_disconnects_total{", at + 1)) {
    const auto line_end = text.find('\n', at);
    EXPECT_TRUE(text.substr(at, line_end - at).ends_with(" 0"))
        << "dropping a master is not a failure: " << text.substr(at, line_end - at);
  }

  // The same answer again changes nothing; an empty list drops the name's masters.
  sender.set_masters(names[1], {masters[1]->endpoint()});
  EXPECT_EQ(sender.connected(), 2u);
  sender.set_masters(names[0], {});
  EXPECT_EQ(sender.connected(), 1u);
}
