// The master's ZMTP accounting receiver: against a real libzmq PUB (the
// gatekeepers' socket) and against hand-written bytes for every way a peer
// can break the protocol. Everything runs on 127.0.0.1 with bounded loops.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "master/io/zmtp_server.hpp"
#include "shared/daemon/zmq_util.hpp"
#include "shared/protocol/zmtp.hpp"

using namespace smockron;
using namespace std::string_literals;
using master::zmtp_server;

namespace {

struct received {
  std::vector<std::string> frames;
  bool truncated = false;
};

class Zmtp : public ::testing::Test {
protected:
  explicit Zmtp(zmtp_server::options o = {}) : sub_(loop_, "tcp://127.0.0.1:*", o, clock_, registry_) {}

  // Polls until `done` or 3,000 rounds of at most 1 ms.
  template <class F>
  bool pump(F done) {
    for (int i = 0; i < 3000 && !done(); ++i) poll_once();
    return done();
  }
  void poll_once() {
    sub_.poll(std::chrono::milliseconds(1), [this](std::span<const std::string_view> f, bool truncated) {
      got_.push_back({std::vector<std::string>(f.begin(), f.end()), truncated});
    });
  }
  int port() const { return std::stoi(sub_.endpoint().substr(sub_.endpoint().rfind(':') + 1)); }
  double metric(const std::string& line_prefix) const {
    const std::string text = registry_.render();
    const auto at = text.find("\n" + line_prefix + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + line_prefix.size() + 2));
  }
  double faults(std::string_view reason) const {
    return metric("smockron_master_accounting_disconnects_total{reason=\"" + std::string(reason) + "\"}");
  }

  // A TCP client with a small receive buffer (set before connecting, so the
  // kernel does not grow it), reads giving up after 20 ms.
  int small_buffer_connect() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    fds_.push_back(fd);
    const int small = 4096;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{0, 20'000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
  }

  // A blocking TCP client that writes raw bytes.
  int raw_connect() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{0, 20'000};  // reads give up quickly; callers poll the subscriber in between
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    fds_.push_back(fd);
    return fd;
  }
  static void write_all(int fd, std::string_view bytes) {
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  // Reads what the subscriber sends until `n` bytes arrived, it closed, or
  // `tries` reads of 20 ms in a row found nothing (a read that finds bytes
  // does not count: how many reads n bytes take is the kernel's business).
  std::string raw_read(int fd, std::size_t n, int tries = 500) {
    std::string out;
    for (int empty = 0; empty < tries && out.size() < n;) {
      poll_once();
      char buf[4096];
      const ssize_t r = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
      if (r == 0) break;
      if (r > 0) {
        out.append(buf, static_cast<std::size_t>(r));
        empty = 0;
      } else {
        ++empty;
      }
    }
    return out;
  }
  // True once the subscriber closed the connection.
  bool closed_by_peer(int fd) {
    for (int i = 0; i < 500; ++i) {
      poll_once();
      char buf[4096];
      const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }

  static std::string frame(std::uint8_t flags, std::string_view body) {
    std::string out;
    if (body.size() > 255) {
      out += static_cast<char>(flags | 0x02);
      for (int s = 56; s >= 0; s -= 8) out += static_cast<char>((body.size() >> s) & 0xff);
    } else {
      out += static_cast<char>(flags);
      out += static_cast<char>(body.size());
    }
    return out + std::string(body);
  }
  static std::string greeting(int major = 3, int minor = 1, std::string_view mechanism = "NULL") {
    std::string g(64, '\0');
    g[0] = '\xff';
    g[9] = '\x7f';
    g[10] = static_cast<char>(major);
    g[11] = static_cast<char>(minor);
    std::memcpy(g.data() + 12, mechanism.data(), mechanism.size());
    return g;
  }
  static std::string ready(std::string_view socket_type) {
    std::string body = "\x05READY\x0bSocket-Type"s + std::string("\0\0\0", 3) + static_cast<char>(socket_type.size());
    return frame(0x04, body + std::string(socket_type));
  }
  // Connects raw, completes the handshake as a PUB, and returns the fd after
  // reading the subscriber's greeting and READY.
  int raw_publisher() {
    const int fd = raw_connect();
    write_all(fd, greeting() + ready("PUB"));
    const std::string hello = raw_read(fd, 64 + 27);
    EXPECT_EQ(hello.size(), 64u + 27u);
    return fd;
  }

  void TearDown() override {
    for (int fd : fds_) ::close(fd);
  }

  manual_clock clock_;
  metrics::registry registry_;
  master::event_loop loop_;
  zmtp_server sub_;
  std::vector<received> got_;
  std::vector<int> fds_;
};

TEST_F(Zmtp, LibzmqPublisherDeliversEveryMessageInOrder) {
  sub_.subscribe("api\0"s);
  zmq::context_t ctx;
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.set(zmq::sockopt::sndhwm, 0);
  pub.connect(sub_.endpoint());
  // The subscription reaches the publisher asynchronously: probe until one arrives.
  auto send = [&](std::vector<std::string> f) {
    std::vector<std::string_view> v(f.begin(), f.end());
    ASSERT_TRUE(zmq_util::send(pub, v));
  };
  ASSERT_TRUE(pump([&] {
    send({"api\0"s, "ACCEPTED", "probe", "1", ""});
    return !got_.empty();
  }));
  EXPECT_EQ(sub_.peers(), 1u);
  EXPECT_EQ(metric("smockron_master_accounting_peers"), 1);
  send({"api\0"s, "ACCEPTED", "sync", "1", ""});  // probes still in flight arrive before it
  ASSERT_TRUE(pump([&] { return got_.back().frames[2] == "sync"; }));
  got_.clear();
  const std::string long_identifier(300, 'x');  // a frame over 255 bytes: the 8-byte size form
  for (int i = 0; i < 5000; ++i) {
    send({"api\0"s, "DELAYED", i % 7 == 0 ? long_identifier : "id-" + std::to_string(i), std::to_string(i), "1"});
  }
  send({"other\0"s, "ACCEPTED", "not subscribed", "1", ""});  // filtered by the publisher
  send({"api\0"s, "ACCEPTED", "last", "1", ""});
  ASSERT_TRUE(pump([&] { return got_.size() >= 5001; }));
  ASSERT_EQ(got_.size(), 5001u);
  for (int i = 0; i < 5000; ++i) {
    ASSERT_EQ(got_[i].frames.size(), 5u);
    EXPECT_EQ(got_[i].frames[0], "api\0"s);
    EXPECT_EQ(got_[i].frames[2], i % 7 == 0 ? long_identifier : "id-" + std::to_string(i));
    EXPECT_EQ(got_[i].frames[3], std::to_string(i));
    EXPECT_FALSE(got_[i].truncated);
  }
  EXPECT_EQ(got_[5000].frames[2], "last");
}

// Against libzmq's PUB (the reference sender) under random contents: 1 to 8
// frames of arbitrary bytes, sizes from empty through the long-size form to
// well over the message bound, messages for a topic not subscribed. Every
// message within the bound arrives intact and in order, every one over it is
// skipped on its own and counted, and the connection stays.
TEST_F(Zmtp, LibzmqPublisherUnderRandomContents) {
  sub_.subscribe("api\0"s);
  zmq::context_t ctx;
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.set(zmq::sockopt::sndhwm, 0);
  pub.connect(sub_.endpoint());
  auto send = [&](const std::vector<std::string>& f) {
    std::vector<std::string_view> v(f.begin(), f.end());
    ASSERT_TRUE(zmq_util::send(pub, v));
  };
  ASSERT_TRUE(pump([&] {
    send({"api\0"s, "probe"});
    return !got_.empty();
  }));
  send({"api\0"s, "sync"});
  ASSERT_TRUE(pump([&] { return got_.back().frames.size() == 2 && got_.back().frames[1] == "sync"; }));
  got_.clear();
  const double oversized0 = metric("smockron_master_accounting_oversized_total");

  std::mt19937 rng(20261123);
  std::vector<std::vector<std::string>> want;
  int oversized = 0;
  for (int i = 0; i < 1500; ++i) {
    std::vector<std::string> frames{rng() % 6 == 0 ? "zzz\0"s : "api\0"s};
    const bool big = rng() % 25 == 0;
    const auto n = 1 + rng() % 7;
    for (std::size_t f = 0; f < n; ++f) {
      const auto r = rng() % 10;
      const std::size_t size = big && f == 0 ? 34 * 1024 + rng() % 100'000
                               : r == 0      ? 0
                               : r < 6       ? rng() % 40
                                             : rng() % 3000;
      std::string body(size, '\0');
      for (auto& c : body) c = static_cast<char>(rng() % 256);
      frames.push_back(std::move(body));
    }
    std::size_t wire_bytes = 0;  // what the bound counts: frames with their headers
    for (const auto& f : frames) wire_bytes += f.size() + (f.size() > 255 ? 9 : 2);
    ASSERT_TRUE(wire_bytes < 30 * 1024 || wire_bytes > zmtp_server::k_max_message);
    send(frames);
    if (frames[0] != "api\0"s) continue;  // filtered by the publisher
    if (wire_bytes > zmtp_server::k_max_message) ++oversized;
    else want.push_back(std::move(frames));
  }
  send({"api\0"s, "last"});
  ASSERT_TRUE(pump([&] { return !got_.empty() && got_.back().frames == std::vector<std::string>{"api\0"s, "last"}; }));
  got_.pop_back();
  ASSERT_EQ(got_.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got_[i].frames, want[i]) << "message " << i;
    EXPECT_FALSE(got_[i].truncated);
  }
  EXPECT_GT(oversized, 10);
  EXPECT_EQ(metric("smockron_master_accounting_oversized_total") - oversized0, oversized);
  EXPECT_EQ(faults("framing"), 0);
  EXPECT_EQ(sub_.peers(), 1u);
}

TEST_F(Zmtp, SubscriptionChangesReachConnectedPublishers) {
  sub_.subscribe("a\0"s);
  zmq::context_t ctx;
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.connect(sub_.endpoint());
  auto send = [&](std::string topic, std::string id) {
    std::vector<std::string> f{topic, "ACCEPTED", id, "1", ""};
    std::vector<std::string_view> v(f.begin(), f.end());
    ASSERT_TRUE(zmq_util::send(pub, v));
  };
  ASSERT_TRUE(pump([&] {
    send("a\0"s, "probe");
    return !got_.empty();
  }));
  sub_.unsubscribe("a\0"s);
  sub_.subscribe("b\0"s);
  // Both changes travel on the one connection in order: once b arrives, a is off.
  ASSERT_TRUE(pump([&] {
    send("b\0"s, "probe");
    return got_.back().frames[0] == "b\0"s;
  }));
  send("b\0"s, "sync");  // b probes still in flight arrive before it
  ASSERT_TRUE(pump([&] { return got_.back().frames[2] == "sync"; }));
  got_.clear();
  send("a\0"s, "dropped");
  send("b\0"s, "marker");
  ASSERT_TRUE(pump([&] { return !got_.empty(); }));
  ASSERT_EQ(got_.size(), 1u);
  EXPECT_EQ(got_[0].frames[2], "marker");
}

TEST_F(Zmtp, IpcEndpoint) {
  const std::string path = "/tmp/smockron-zmtp-test-" + std::to_string(::getpid()) + ".sock";
  {
    zmtp_server ipc(loop_, "ipc://" + path, {}, clock_, registry_);
    ipc.subscribe("d\0"s);
    zmq::context_t ctx;
    zmq::socket_t pub(ctx, zmq::socket_type::pub);
    pub.connect("ipc://" + path);
    bool got = false;
    const std::string topic = "d\0"s;  // outlives the views below
    for (int i = 0; i < 3000 && !got; ++i) {
      std::vector<std::string_view> v{topic, "ACCEPTED", "x", "1", ""};
      ASSERT_TRUE(zmq_util::send(pub, v));
      ipc.poll(std::chrono::milliseconds(1), [&](std::span<const std::string_view>, bool) { got = true; });
    }
    EXPECT_TRUE(got);
    EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the socket file is removed with the subscriber";
}

TEST_F(Zmtp, BadEndpointsAreClearErrors) {
  for (const std::string e : {"tcp://127.0.0.1", "tcp://127.0.0.1:99999", "inproc://x", "udp://1:2"}) {
    try {
      zmtp_server bad(loop_, e, {}, clock_, registry_);
      ADD_FAILURE() << e << " was accepted";
    } catch (const std::runtime_error& err) {
      EXPECT_NE(std::string(err.what()).find(e), std::string::npos) << err.what();
    }
  }
  // A port already bound.
  EXPECT_THROW(zmtp_server(loop_, sub_.endpoint(), {}, clock_, registry_), std::runtime_error);
}

TEST_F(Zmtp, HandshakeThenSubscriptionsAfterPeersReady) {
  sub_.subscribe("api\0"s);
  const int fd = raw_connect();
  const std::string hello = raw_read(fd, 64 + 27);
  ASSERT_EQ(hello.size(), 64u + 27u);
  EXPECT_EQ(hello.substr(0, 12), greeting(3, 0).substr(0, 12)) << "announces ZMTP 3.0";
  EXPECT_EQ(hello.substr(12, 4), "NULL");
  EXPECT_EQ(hello.substr(64), ready("SUB"));
  // Nothing else before our READY: a libzmq peer would take a subscription
  // for a handshake command.
  EXPECT_EQ(raw_read(fd, 1, 10), "");
  write_all(fd, greeting() + ready("XPUB"));
  EXPECT_EQ(raw_read(fd, 7), frame(0,
                                   "\x01"
                                   "api\0"s));
  EXPECT_TRUE(pump([&] { return sub_.peers() == 1; }));
}

TEST_F(Zmtp, MessagesSplitAcrossReadsAndPipelinedWithTheHandshake) {
  const int fd = raw_connect();
  std::string bytes = greeting() + ready("PUB");
  for (int i = 0; i < 3; ++i) bytes += frame(1, "api\0"s) + frame(1, "ACCEPTED") + frame(0, "id" + std::to_string(i));
  bytes += frame(1, "api\0"s) + frame(0, std::string(1000, 'L'));
  for (char c : bytes) {  // one byte per write: every header and body split
    write_all(fd, std::string_view(&c, 1));
    poll_once();
  }
  ASSERT_TRUE(pump([&] { return got_.size() == 4; }));
  EXPECT_EQ(got_[2].frames, (std::vector<std::string>{"api\0"s, "ACCEPTED", "id2"}));
  EXPECT_EQ(got_[3].frames[1].size(), 1000u);
}

TEST_F(Zmtp, TooManyFramesIsDeliveredAsTruncated) {
  const int fd = raw_publisher();
  std::string bytes;
  for (int i = 0; i < 10; ++i) bytes += frame(i < 9 ? 1 : 0, std::to_string(i));
  write_all(fd, bytes);
  ASSERT_TRUE(pump([&] { return got_.size() == 1; }));
  EXPECT_TRUE(got_[0].truncated);
  EXPECT_EQ(got_[0].frames.size(), zmtp_server::k_max_frames);
}

TEST_F(Zmtp, PingIsAnsweredWithPongAndItsContext) {
  const int fd = raw_publisher();
  write_all(fd, frame(0x04, "\x04PING\x00\x64"s + "ctx-123"));
  EXPECT_EQ(raw_read(fd, 2 + 5 + 7), frame(0x04,
                                           "\x04PONG"
                                           "ctx-123"));
  // libzmq sends a due heartbeat even between the frames of a message.
  write_all(fd, frame(1, "first") + frame(0x04, "\x04PING\x00\x64"s + "mid"));
  EXPECT_EQ(raw_read(fd, 2 + 5 + 3), frame(0x04,
                                           "\x04PONG"
                                           "mid"));
  write_all(fd, frame(0, "last"));
  ASSERT_TRUE(pump([&] { return got_.size() == 1; }));
  EXPECT_EQ(got_[0].frames, (std::vector<std::string>{"first", "last"}));
}

class ZmtpSmallBuffers : public Zmtp {
protected:
  ZmtpSmallBuffers() : Zmtp({.sndbuf = 4096, .allow = {}}) {}
};

TEST_F(ZmtpSmallBuffers, SubscriptionsLargerThanTheSocketBufferAllArrive) {
  // 8,000 topics of 250 bytes: 2 MB, far more than the kernel takes at once
  // into a small send buffer, so the rest waits for EPOLLOUT.
  std::string expected;
  for (int i = 0; i < 8000; ++i) {
    std::string topic = std::to_string(i) + std::string(250 - std::to_string(i).size(), 't');
    sub_.subscribe(topic);
    expected += frame(0, "\x01" + topic);
  }
  const int fd = small_buffer_connect();
  write_all(fd, greeting() + ready("PUB"));
  ASSERT_EQ(raw_read(fd, 64 + 27).size(), 64u + 27u);
  for (int i = 0; i < 20; ++i) poll_once();  // the subscriber meets a full socket
  const std::string subs = raw_read(fd, expected.size());
  EXPECT_EQ(subs.size(), expected.size());
  EXPECT_TRUE(subs == expected);
  EXPECT_EQ(faults("stalled"), 0);
}

TEST_F(Zmtp, ProtocolBreakersAreDisconnectedAndCounted) {
  struct breaker {
    std::string bytes;
    std::string reason;
  };
  const std::vector<breaker> cases{
      {"GET / HTTP/1.1\r\n\r\n", "greeting"},
      {greeting(2, 0).substr(0, 12), "greeting"},  // all a ZMTP 2.0 peer sends before it hears from us
      {greeting(3, 1, "PLAIN"), "mechanism"},
      {greeting() + ready("DEALER"), "handshake"},
      {greeting() + frame(0, "message before READY"), "handshake"},
      {greeting() + frame(0x04,
                          "\x05READY\x0bSocket-Type\x00\x00\x00\xff"
                          "PUB"s),
       "handshake"},
      {greeting() + frame(0x04,
                          "\x05"
                          "ERROR\x05"
                          "nope"),
       "peer_error"},
      {greeting() + ready("PUB") + "\x08\x01x", "framing"},
      {greeting() + ready("PUB") + frame(0x05, "\x04PING\0\0"s), "framing"},
      {greeting() + ready("PUB") + "\x06" + std::string("\x00\x00\x00\x00\x00\x01\x00\x00", 8),
       "framing"},  // 64 KiB command
      {greeting() + ready("PUB") + "\x02" + std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8), "framing"},
  };
  for (const auto& c : cases) {
    const double before = faults(c.reason);
    const int fd = raw_connect();
    write_all(fd, c.bytes);
    EXPECT_TRUE(closed_by_peer(fd)) << c.reason;
    EXPECT_EQ(faults(c.reason), before + 1) << c.reason;
  }
  // Still serving: a well-behaved peer gets through afterwards.
  const int ok = raw_publisher();
  write_all(ok, frame(0, "fine"));
  EXPECT_TRUE(pump([&] { return got_.size() == 1; }));
}

// A proxy has one accounting connection per worker, each naming its
// gatekeeper: the master is told the gatekeeper is gone when the last of
// them closes, not before (its pace counts go then, pace_share.hpp).
TEST_F(Zmtp, AGatekeeperIsGoneWithItsLastConnection) {
  std::vector<std::uint64_t> gone;
  sub_.on_peer_closed([&](std::uint64_t, std::uint64_t gatekeeper) { gone.push_back(gatekeeper); });
  const auto named = [&](std::string_view gatekeeper) {
    const int fd = raw_connect();
    write_all(fd, greeting() + zmtp::ready("PUB", gatekeeper));
    EXPECT_EQ(raw_read(fd, 64 + 27).size(), 64u + 27u);
    return fd;
  };
  const int w1 = named("00000000000abc00"), w2 = named("00000000000abc00"), other = named("0000000000000def"),
            unnamed = named("");
  ASSERT_TRUE(pump([&] { return sub_.peers() == 4; }));
  const auto close_one = [&](int fd) {
    std::erase(fds_, fd);
    ::close(fd);
    const std::size_t before = gone.size();
    EXPECT_TRUE(pump([&] { return gone.size() == before + 1; }));
    return gone.empty() ? ~0ull : gone.back();
  };
  EXPECT_EQ(close_one(w1), 0u) << "its other worker's connection still names it";
  EXPECT_EQ(close_one(unnamed), 0u);
  EXPECT_EQ(close_one(w2), 0xabc00u);
  EXPECT_EQ(close_one(other), 0xdefu);
}

// A message over the bound is skipped on its own, consumed by length, and
// what the peer sends after it arrives: as a libzmq SUB would, the connection
// stays. One frame of 40 KiB, 40 frames of 1,000 bytes (with a PING between
// them), and one of 5 MiB arriving in pieces.
TEST_F(Zmtp, OversizedMessagesAreSkippedAndTheConnectionStays) {
  const int fd = raw_publisher();
  write_all(fd, frame(0, "before"));
  write_all(fd, frame(0, std::string(40 * 1024, 'x')));
  write_all(fd, frame(0, "after one frame"));
  std::string many;
  for (int i = 0; i < 40; ++i) {
    many += frame(1, std::string(1000, 'y'));
    if (i == 20) many += frame(0x04, "\x04PING\0\0"s);
  }
  many += frame(0, "last of many");
  write_all(fd, many + frame(0, "after many frames"));
  EXPECT_TRUE(pump([&] { return got_.size() == 3; }));
  const std::string huge = frame(0, std::string(5 * 1024 * 1024, 'z'));
  for (std::size_t at = 0; at < huge.size(); at += 256 * 1024) {
    write_all(fd, huge.substr(at, 256 * 1024));
    for (int i = 0; i < 5; ++i) poll_once();
  }
  write_all(fd, frame(0, "after a huge one"));
  EXPECT_TRUE(pump([&] { return got_.size() == 4; }));
  ASSERT_EQ(got_.size(), 4u);
  EXPECT_EQ(got_[0].frames[0], "before");
  EXPECT_EQ(got_[1].frames[0], "after one frame");
  EXPECT_EQ(got_[2].frames[0], "after many frames");
  EXPECT_EQ(got_[3].frames[0], "after a huge one");
  EXPECT_EQ(metric("smockron_master_accounting_oversized_total"), 3);
  EXPECT_EQ(faults("framing"), 0);
  EXPECT_EQ(sub_.peers(), 1u);
}

TEST_F(Zmtp, UnfinishedHandshakeTimesOut) {
  const int fd = raw_connect();
  write_all(fd, greeting());  // and then nothing
  ASSERT_EQ(raw_read(fd, 64 + 27).size(), 64u + 27u);
  clock_.advance(std::chrono::seconds(9));
  EXPECT_EQ(raw_read(fd, 1, 10), "") << "still open before the timeout";
  clock_.advance(std::chrono::seconds(2));
  EXPECT_TRUE(closed_by_peer(fd));
  EXPECT_EQ(faults("timeout"), 1);
}

class ZmtpOnePeer : public Zmtp {
protected:
  ZmtpOnePeer() : Zmtp({.max_peers = 1, .allow = {}}) {}
};

TEST_F(ZmtpOnePeer, ConnectionsOverTheCapAreRefused) {
  const int first = raw_publisher();
  const int second = raw_connect();
  EXPECT_TRUE(closed_by_peer(second));
  EXPECT_EQ(faults("peer_limit"), 1);
  write_all(first, frame(0, "still served"));
  EXPECT_TRUE(pump([&] { return got_.size() == 1; }));
}

}  // namespace

namespace {
class ZmtpAllowList : public Zmtp {
protected:
  ZmtpAllowList() : Zmtp({.allow = {*smockron::parse_cidr("10.0.0.0/8")}}) {}
};
}  // namespace

TEST_F(ZmtpAllowList, PeersOutsideTheListAreClosedAtAcceptAndCounted) {
  const int fd = raw_connect();  // from 127.0.0.1, not in 10.0.0.0/8
  ASSERT_TRUE(pump([&] { return metric("smockron_master_refused_connections_total{endpoint=\"accounting\"}") == 1; }));
  char buf[1];
  EXPECT_EQ(::recv(fd, buf, 1, 0), 0) << "closed without a greeting";
  EXPECT_EQ(sub_.peers(), 0u);
  ::close(fd);
}

// ---- role pub: the control endpoint ---------------------------------------

namespace {
class ZmtpPublisher : public Zmtp {
protected:
  explicit ZmtpPublisher(std::size_t max_queued = 0)
      : Zmtp({.role = zmtp::session::role::pub, .name = "control", .sndbuf = 4096, .max_queued = max_queued}) {
    sub_.on_subscription([this](std::string_view topic) { told_.emplace_back(topic); });
  }
  zmtp_server::published publish(const std::vector<std::string>& frames) {
    const std::vector<std::string_view> v(frames.begin(), frames.end());
    return sub_.publish(v);
  }
  // A raw SUB with a small receive buffer: handshake and `topics` sent, the
  // server's greeting and READY read.
  int raw_subscriber(const std::vector<std::string>& topics) {
    const int fd = small_buffer_connect();
    std::string hello = greeting() + ready("SUB");
    for (const auto& t : topics) hello += frame(0, "\x01" + t);
    write_all(fd, hello);
    EXPECT_EQ(raw_read(fd, 64 + 27).size(), 64u + 27u);
    return fd;
  }
  // Reads `n` messages from a raw subscriber (turning the loop meanwhile, so
  // what waits for EPOLLOUT is written); fewer if they stop coming.
  std::vector<std::vector<std::string>> raw_messages(int fd, std::size_t n) {
    std::vector<std::vector<std::string>> out;
    std::vector<std::string> current;
    std::string buf;
    for (int empty = 0; empty < 500 && out.size() < n;) {
      poll_once();
      char chunk[65536];
      const ssize_t r = ::recv(fd, chunk, sizeof chunk, 0);
      if (r <= 0) {
        ++empty;
        continue;
      }
      empty = 0;
      buf.append(chunk, static_cast<std::size_t>(r));
      std::size_t at = 0;
      zmtp::frame f;
      while (zmtp::next_frame(std::string_view(buf).substr(at), 1 << 20, f) == zmtp::frame_status::ok) {
        current.emplace_back(f.body);
        at += f.size;
        if (!f.more()) out.push_back(std::exchange(current, {}));
      }
      buf.erase(0, at);
    }
    return out;
  }
  std::vector<std::string> told_;
};

class ZmtpPublisherBounded : public ZmtpPublisher {
protected:
  ZmtpPublisherBounded() : ZmtpPublisher(100) {}
};
}  // namespace

// Two libzmq SUBs (the gatekeepers' socket), one subscribed to a domain, one
// to everything: each gets exactly what it subscribed to, whole and in order,
// frames over 255 bytes included; every subscription is told.
TEST_F(ZmtpPublisher, LibzmqSubscribersGetWhatTheySubscribedToWholeAndInOrder) {
  zmq::context_t ctx;
  zmq::socket_t api(ctx, zmq::socket_type::sub), all(ctx, zmq::socket_type::sub);
  for (auto* s : {&api, &all}) s->set(zmq::sockopt::rcvhwm, 0);
  api.set(zmq::sockopt::subscribe, "api\0"s);
  all.set(zmq::sockopt::subscribe, "");
  api.connect(sub_.endpoint());
  all.connect(sub_.endpoint());
  ASSERT_TRUE(pump([&] { return told_.size() == 2; }));
  EXPECT_TRUE((told_ == std::vector{"api\0"s, ""s}) || (told_ == std::vector{""s, "api\0"s}));
  EXPECT_EQ(metric("smockron_master_control_peers"), 2);
  const std::string long_identifier(300, 'x');
  std::vector<std::vector<std::string>> sent;
  for (int i = 0; i < 3000; ++i) {
    sent.push_back({i % 3 == 0 ? "other\0"s : "api\0"s, "DELAY_UNTIL",
                    i % 7 == 0 ? long_identifier : "id-" + std::to_string(i), std::to_string(i), "1"});
    const auto r = publish(sent.back());
    EXPECT_EQ(r.queued, i % 3 == 0 ? 1u : 2u);
    EXPECT_EQ(r.dropped, 0u);
    if (i % 100 == 0) poll_once();  // some leave mid-way, the rest at the end of a turn
  }
  const auto drain = [&](zmq::socket_t& s, std::size_t n) {
    std::vector<std::vector<std::string>> got;
    for (int i = 0; i < 10'000 && got.size() < n; ++i) {
      poll_once();
      zmq_util::multipart m;
      while (zmq_util::recv(s, m, zmq::recv_flags::dontwait)) {
        got.emplace_back(m.views.begin(), m.views.begin() + static_cast<std::ptrdiff_t>(m.count));
      }
    }
    return got;
  };
  std::vector<std::vector<std::string>> want_api;
  for (const auto& m : sent)
    if (m[0] == "api\0"s) want_api.push_back(m);
  EXPECT_EQ(drain(api, want_api.size()), want_api);
  EXPECT_EQ(drain(all, sent.size()), sent);
}

// A subscriber that stops reading: once the kernel's buffers are full, its
// queue takes max_queued messages and the rest are dropped for it (as a
// libzmq PUB past its high-water mark); it stays connected, and when it reads
// again every message queued arrives whole and in order.
TEST_F(ZmtpPublisherBounded, ASubscriberThatDoesNotReadLosesWhatIsPastItsQueueAndStays) {
  const int fd = raw_subscriber({"api\0"s});
  ASSERT_TRUE(pump([&] { return told_.size() == 1; }));
  const std::string body(1024, 'b');
  std::size_t queued = 0, dropped = 0;
  for (int i = 0; i < 20'000; ++i) {  // 20 MB: far more than any socket buffer holds
    const auto r = publish({"api\0"s, body, std::to_string(i)});
    queued += r.queued;
    dropped += r.dropped;
  }
  EXPECT_EQ(queued + dropped, 20'000u);
  EXPECT_GT(dropped, 0u);
  EXPECT_GE(queued, 100u);
  EXPECT_EQ(sub_.peers(), 1u);
  const auto got = raw_messages(fd, queued);
  ASSERT_EQ(got.size(), queued);
  long last = -1;
  for (const auto& m : got) {
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m[0], "api\0"s);
    EXPECT_EQ(m[1], body);
    const long id = std::stol(m[2]);
    EXPECT_GT(id, last);
    last = id;
  }
  // Drained: its queue takes messages again.
  EXPECT_EQ(publish({"api\0"s, "after", "x"}).queued, 1u);
  const auto after = raw_messages(fd, 1);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0][1], "after");
}

TEST_F(ZmtpPublisher, MoreSubscriptionsThanAllowedIsAFault) {
  std::vector<std::string> topics;
  for (int i = 0; i < 10'001; ++i) topics.push_back("t" + std::to_string(i));
  const int fd = raw_subscriber(topics);
  EXPECT_TRUE(closed_by_peer(fd));
  EXPECT_EQ(metric("smockron_master_control_disconnects_total{reason=\"subscriptions\"}"), 1);
}

TEST_F(ZmtpPublisher, APubPeerIsAHandshakeFault) {
  const int fd = raw_connect();
  write_all(fd, greeting() + ready("PUB"));  // a PUB cannot talk to a PUB
  EXPECT_TRUE(closed_by_peer(fd));
  EXPECT_EQ(metric("smockron_master_control_disconnects_total{reason=\"handshake\"}"), 1);
}

// ---- CURVE keys changed by a reload ------------------------------------------

namespace {

// The master's two keys (a rotation's previous and next) and two gatekeepers'.
struct rotation_keys {
  zmtp::curve::keypair previous = zmtp::curve::generate(), next = zmtp::curve::generate();
  zmtp::curve::keypair kept = zmtp::curve::generate(), removed = zmtp::curve::generate();
  std::shared_ptr<const zmtp::curve::server_keys> server(std::vector<zmtp::curve::keypair> own,
                                                         std::vector<zmtp::curve::key> allowed) const {
    auto k = std::make_shared<zmtp::curve::server_keys>();
    k->own = std::move(own);
    k->allowed.insert(allowed.begin(), allowed.end());
    return k;
  }
  std::shared_ptr<const zmtp::curve::client_keys> client(const zmtp::curve::keypair& own,
                                                         const zmtp::curve::keypair& master) const {
    auto k = std::make_shared<zmtp::curve::client_keys>();
    k->own = own;
    k->server = master.public_key;
    return k;
  }
};
const rotation_keys& rk() {
  static const rotation_keys k;
  return k;
}

// A gatekeeper's accounting connection: our CURVE client session over a socket.
struct curve_peer {
  struct events final : zmtp::session_events {
    bool ready = false;
    void on_ready() override { ready = true; }
  } ev;
  zmtp::session s;
  std::string in, out;
  int fd;
  curve_peer(int socket, std::shared_ptr<const zmtp::curve::client_keys> keys)
      : s(zmtp::session::role::pub, {}, {.client = std::move(keys), .server = nullptr}), fd(socket) {
    s.start(out);
  }
};

class ZmtpCurveReload : public Zmtp {
protected:
  ZmtpCurveReload()
      : Zmtp({.curve = rk().server({rk().next, rk().previous}, {rk().kept.public_key, rk().removed.public_key})}) {}

  // Moves bytes both ways, polling the server in between, until `done`, the
  // server closes, or 500 reads in a row find nothing.
  template <class F>
  bool converse(curve_peer& p, F done) {
    for (int quiet = 0; quiet < 500 && !done();) {
      if (!p.out.empty()) write_all(p.fd, std::exchange(p.out, {}));
      poll_once();
      char buf[4096];
      const ssize_t r = ::recv(p.fd, buf, sizeof buf, 0);
      if (r == 0) break;
      if (r < 0) {
        ++quiet;
        continue;
      }
      quiet = 0;
      p.in.append(buf, static_cast<std::size_t>(r));
      p.in.erase(0, p.s.feed(p.in, p.ev, p.out));
    }
    return done();
  }
  curve_peer connected(const zmtp::curve::keypair& own, const zmtp::curve::keypair& master) {
    curve_peer p(raw_connect(), rk().client(own, master));
    EXPECT_TRUE(converse(p, [&] { return p.ev.ready; })) << p.s.detail();
    return p;
  }
  void send_message(curve_peer& p, std::string_view text) {
    p.s.append(p.out, 0, text);
    write_all(p.fd, std::exchange(p.out, {}));
  }
};

}  // namespace

// A reload that retires the previous master key closes the connections made
// with it (they connect again under the next one); those made with the next
// key go on with nothing lost; a gatekeeper still holding only the previous
// key is then refused.
TEST_F(ZmtpCurveReload, RetiringAMasterKeyClosesOnlyTheConnectionsThatUsedIt) {
  curve_peer old_key = connected(rk().kept, rk().previous);
  curve_peer new_key = connected(rk().kept, rk().next);
  send_message(old_key, "before, previous key");
  send_message(new_key, "before, next key");
  ASSERT_TRUE(pump([&] { return got_.size() == 2; }));

  sub_.set_curve(rk().server({rk().next}, {rk().kept.public_key, rk().removed.public_key}));
  EXPECT_TRUE(closed_by_peer(old_key.fd));
  send_message(new_key, "after, next key");
  ASSERT_TRUE(pump([&] { return got_.size() == 3; }));
  EXPECT_EQ(got_[2].frames[0], "after, next key");
  EXPECT_EQ(sub_.peers(), 1u);
  EXPECT_EQ(faults("unknown_key"), 0) << "a retired master key is not a refusal";

  curve_peer stale(raw_connect(), rk().client(rk().kept, rk().previous));
  EXPECT_FALSE(converse(stale, [&] { return stale.ev.ready; }));
  EXPECT_EQ(faults("bad_box"), 1);
}

// A gatekeeper whose handshake began before a reload removed its key (HELLO
// judged under the old list) is refused at INITIATE's READY by the list in
// force then, and nothing it sent is delivered.
TEST_F(ZmtpCurveReload, AHandshakeUnderWayIsJudgedByTheKeysInForceWhenItCompletes) {
  curve_peer p(raw_connect(), rk().client(rk().removed, rk().next));
  write_all(p.fd, std::exchange(p.out, {}));  // greeting and HELLO
  // Until the WELCOME made the client's INITIATE (kept back for now).
  ASSERT_TRUE(converse(p, [&] { return !p.out.empty(); })) << p.s.detail();
  sub_.set_curve(rk().server({rk().next, rk().previous}, {rk().kept.public_key}));
  EXPECT_TRUE(converse(p, [&] { return p.ev.ready; }) == false);
  EXPECT_EQ(faults("unknown_key"), 1);
  EXPECT_TRUE(got_.empty());
  EXPECT_EQ(sub_.peers(), 0u);
  // The one still listed gets in.
  curve_peer kept = connected(rk().kept, rk().next);
  send_message(kept, "listed");
  EXPECT_TRUE(pump([&] { return got_.size() == 1; }));
}
