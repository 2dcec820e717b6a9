// The ZMTP session both ends of the accounting stream use: end against end
// in every split of the bytes, against libzmq PUB and SUB sockets on
// loopback, and every protocol fault with its label; the same for CURVE
// (libzmq as client and as server, and every refusal).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "shared/protocol/zmtp.hpp"
#include "shared/protocol/zmtp_curve.hpp"
#include "shared/protocol/zmtp_session.hpp"
#include "tests/support/loopback.hpp"

using namespace smockron;
using namespace std::string_literals;
using zmtp::session;

namespace {

// Records what a session reports.
struct recorder final : zmtp::session_events {
  int ready = 0;
  std::vector<std::vector<std::string>> messages;
  std::vector<bool> truncated;
  std::vector<std::uint64_t> oversized;
  std::vector<std::pair<bool, std::string>> subscriptions;
  void on_ready() override { ++ready; }
  void on_message(std::span<const std::string_view> f, bool t) override {
    messages.emplace_back(f.begin(), f.end());
    truncated.push_back(t);
  }
  void on_oversized(std::uint64_t bytes) override { oversized.push_back(bytes); }
  void on_subscription(bool sub, std::string_view topic) override {
    subscriptions.emplace_back(sub, std::string(topic));
  }
};

// A session and the bytes it has received but not consumed.
struct end {
  session s;
  recorder ev;
  std::string in, out;
  end(session::role r, session::limits l = {}, session::security sec = {}) : s(r, l, std::move(sec)) {}
  void receive(std::string_view bytes) {
    in += bytes;
    in.erase(0, s.feed(in, ev, out));
  }
};

std::string message(std::initializer_list<std::string> frames) {
  std::string out;
  std::size_t i = 0;
  for (const auto& f : frames) zmtp::append_frame(out, ++i < frames.size() ? zmtp::flag_more : 0, f);
  return out;
}

std::string command(std::string_view name, std::string_view rest = "") {
  std::string body(1, static_cast<char>(name.size()));
  body.append(name).append(rest);
  std::string out;
  zmtp::append_frame(out, zmtp::flag_command, body);
  return out;
}

// Feeds `bytes` to `e` in pieces cut at random.
void feed_split(end& e, const std::string& bytes, std::minstd_rand& rng) {
  for (std::size_t at = 0; at < bytes.size();) {
    const std::size_t n = std::min<std::size_t>(bytes.size() - at, 1 + rng() % 7);
    e.receive(std::string_view(bytes).substr(at, n));
    at += n;
  }
}

TEST(ZmtpSession, EndAgainstEndInEverySplit) {
  std::minstd_rand rng(7);
  for (int round = 0; round < 200; ++round) {
    end pub(session::role::pub), sub(session::role::sub);
    feed_split(sub, std::string(session::hello(session::role::pub)), rng);
    feed_split(pub, std::string(session::hello(session::role::sub)), rng);
    ASSERT_TRUE(pub.s.ready() && sub.s.ready());
    EXPECT_EQ(pub.ev.ready, 1);
    EXPECT_EQ(sub.ev.ready, 1);
    // The subscriber's subscriptions (3.0 form and 3.1 commands), a PING among them.
    feed_split(pub,
               message({"\x01"s + "api\0"s}) + command("SUBSCRIBE", "web\0"s) +
                   command("PING",
                           "\0\x10"
                           "ctx"s) +
                   message({"\x00"s + "api\0"s}) + command("CANCEL", "web\0"s),
               rng);
    ASSERT_EQ(pub.ev.subscriptions.size(), 4u);
    EXPECT_EQ(pub.ev.subscriptions[0], std::pair(true, "api\0"s));
    EXPECT_EQ(pub.ev.subscriptions[1], std::pair(true, "web\0"s));
    EXPECT_EQ(pub.ev.subscriptions[2], std::pair(false, "api\0"s));
    EXPECT_EQ(pub.ev.subscriptions[3], std::pair(false, "web\0"s));
    EXPECT_EQ(pub.out, command("PONG", "ctx")) << "PING's context is echoed";
    // Messages the other way, with a PING between two frames of one.
    const std::string two = message({"api\0"s, "ACCEPTED", "id", "1700000000000", ""});
    feed_split(
        sub, message({"a"}) + two.substr(0, 6) + command("PING", "\0\x01"s) + two.substr(6) + message({"b", "c"}), rng);
    ASSERT_EQ(sub.ev.messages.size(), 3u) << round;
    EXPECT_EQ(sub.ev.messages[0], std::vector<std::string>{"a"});
    EXPECT_EQ(sub.ev.messages[1], (std::vector<std::string>{"api\0"s, "ACCEPTED", "id", "1700000000000", ""}));
    EXPECT_EQ(sub.ev.messages[2], (std::vector<std::string>{"b", "c"}));
    EXPECT_EQ(sub.out, command("PONG")) << "the PING between frames is answered once, however the bytes were cut";
    EXPECT_FALSE(pub.s.failed() || sub.s.failed());
  }
}

TEST(ZmtpSession, ACommandBetweenFramesIsServedOnce) {
  // Found by fuzz_zmtp_session: the bytes of a command inside an unfinished
  // message are parsed again with the rest of it; a SUBSCRIBE there was
  // counted twice (and could never be cancelled).
  const std::string bytes =
      std::string(session::hello(session::role::sub)) + "\x01\x01x"s + command("SUBSCRIBE", "api\0"s) + "\x00\x01y"s;
  for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
    end pub(session::role::pub);
    pub.receive(std::string_view(bytes).substr(0, cut));
    pub.receive(std::string_view(bytes).substr(cut));
    ASSERT_EQ(pub.ev.subscriptions.size(), 1u) << "cut at " << cut;
    EXPECT_EQ(pub.ev.subscriptions[0], std::pair(true, "api\0"s));
  }
}

TEST(ZmtpSession, HelloIsGreetingAndReady) {
  EXPECT_EQ(session::hello(session::role::pub), std::string(zmtp::greeting()) + zmtp::ready("PUB"));
  EXPECT_EQ(session::hello(session::role::sub), std::string(zmtp::greeting()) + zmtp::ready("SUB"));
}

// The master reads the gatekeeper a connection names (X-Gatekeeper); a
// name that is not 16 hex digits, or none, reads as 0 (the connection is
// then a gatekeeper of its own).
TEST(ZmtpSession, ThePeerNamesItsGatekeeper) {
  end pub(session::role::pub), sub(session::role::sub);
  pub.s.name_gatekeeper("00000000000abc00");
  pub.s.start(pub.out);
  sub.receive(pub.out);
  ASSERT_TRUE(sub.s.ready());
  EXPECT_EQ(sub.s.peer_gatekeeper(), 0xabc00u);
  for (const std::string& bytes : {std::string(session::hello(session::role::pub)),
                                   std::string(zmtp::greeting()) + zmtp::ready("PUB", "not-hex-at-all!!"),
                                   std::string(zmtp::greeting()) + zmtp::ready("PUB", "abc00")}) {
    end other(session::role::sub);
    other.receive(bytes);
    ASSERT_TRUE(other.s.ready());
    EXPECT_EQ(other.s.peer_gatekeeper(), 0u);
  }
}

TEST(ZmtpSession, OversizedMessagesAreSkippedOnTheirOwnWhenAllowed) {
  end sub(session::role::sub, {.max_message = 100, .max_skip = 10'000});
  sub.receive(std::string(session::hello(session::role::pub)));
  sub.receive(message({std::string(60, 'x'), std::string(60, 'y')}) + message({"after"}));
  EXPECT_EQ(sub.ev.oversized.size(), 1u);
  ASSERT_EQ(sub.ev.messages.size(), 1u);
  EXPECT_EQ(sub.ev.messages[0][0], "after");
  sub.receive(message({std::string(20'000, 'z')}));
  ASSERT_TRUE(sub.s.failed());
  EXPECT_EQ(*sub.s.failed(), zmtp::fault::framing);
  // Without max_skip, an oversized message is a fault at once.
  end strict(session::role::pub, {.max_message = 100});
  strict.receive(std::string(session::hello(session::role::sub)) + message({"\x01" + std::string(200, 't')}));
  ASSERT_TRUE(strict.s.failed());
  EXPECT_EQ(*strict.s.failed(), zmtp::fault::framing);
}

TEST(ZmtpSession, FramesBeyondTheBoundMarkTheMessageTruncated) {
  end sub(session::role::sub, {.max_frames = 2});
  sub.receive(std::string(session::hello(session::role::pub)) + message({"1", "2", "3"}));
  ASSERT_EQ(sub.ev.messages.size(), 1u);
  EXPECT_EQ(sub.ev.messages[0].size(), 2u);
  EXPECT_TRUE(sub.ev.truncated[0]);
}

TEST(ZmtpSession, PongsStopWhenThePeerDoesNotRead) {
  end pub(session::role::pub, {.max_pong_backlog = 10});
  pub.receive(std::string(session::hello(session::role::sub)));
  pub.receive(command("PING", "\0\x01"s) + command("PING", "\0\x01"s) + command("PING", "\0\x01"s));
  EXPECT_EQ(pub.out, command("PONG") + command("PONG")) << "the third finds 14 bytes waiting";
}

TEST(ZmtpSession, EveryFaultHasItsLabel) {
  const std::string sub_hello(session::hello(session::role::sub));
  const std::string greeting(zmtp::greeting());
  std::string curve = greeting;
  curve.replace(12, 5, "CURVE");
  struct row {
    session::role role;
    std::string bytes;
    zmtp::fault fault;
    std::string_view label;
  };
  const std::vector<row> table = {
      {session::role::pub, "GET / HTTP/1.1\r\n", zmtp::fault::greeting, "greeting"},
      {session::role::pub, curve, zmtp::fault::mechanism, "mechanism"},
      {session::role::pub, greeting + zmtp::ready("PUB"), zmtp::fault::handshake, "handshake"},
      {session::role::sub, greeting + zmtp::ready("SUB"), zmtp::fault::handshake, "handshake"},
      {session::role::pub, greeting + message({"early"}), zmtp::fault::handshake, "handshake"},
      {session::role::pub, greeting + command("PING"), zmtp::fault::handshake, "handshake"},
      {session::role::pub, sub_hello + zmtp::ready("SUB"), zmtp::fault::handshake, "handshake"},
      {session::role::pub, sub_hello + "\x08\x00"s, zmtp::fault::framing, "framing"},
      {session::role::pub, sub_hello + "\x05\x01x"s, zmtp::fault::framing, "framing"},
      {session::role::pub, sub_hello + "\x04\x00"s, zmtp::fault::framing, "framing"},
      {session::role::pub, sub_hello + command("ERROR", "\x04nope"), zmtp::fault::peer_error, "peer_error"},
  };
  for (const auto& r : table) {
    std::minstd_rand rng(1);
    end e(r.role);
    feed_split(e, r.bytes, rng);
    ASSERT_TRUE(e.s.failed()) << r.label << ": " << zmtp::printable(r.bytes);
    EXPECT_EQ(*e.s.failed(), r.fault) << e.s.detail();
    EXPECT_EQ(zmtp::to_string(*e.s.failed()), r.label);
    EXPECT_FALSE(e.s.detail().empty());
    const auto used = e.s.feed(sub_hello, e.ev, e.out);
    EXPECT_EQ(used, 0u) << "nothing is parsed after a fault";
  }
  EXPECT_EQ(zmtp::to_string(zmtp::fault::io), "io");
  EXPECT_EQ(zmtp::to_string(zmtp::fault::subscriptions), "subscriptions");
}

TEST(ZmtpSubscriptionSet, CountsLikeZeroMqAndMatchesByPrefix) {
  zmtp::subscription_set s(2);
  EXPECT_FALSE(s.matches("api\0"s));
  EXPECT_TRUE(s.apply(true, "api\0"s));
  EXPECT_TRUE(s.apply(true, "api\0"s));
  EXPECT_TRUE(s.matches("api\0"s));
  EXPECT_FALSE(s.matches("apix\0"s)) << "a topic ending in \\0 matches only itself";
  EXPECT_TRUE(s.apply(false, "api\0"s));
  EXPECT_TRUE(s.matches("api\0"s)) << "subscribed twice: one cancel leaves one";
  EXPECT_TRUE(s.apply(true, "we"));
  EXPECT_TRUE(s.matches("web\0"s)) << "an open prefix";
  EXPECT_FALSE(s.apply(true, "third")) << "full";
  EXPECT_TRUE(s.apply(false, "api\0"s));
  EXPECT_FALSE(s.matches("api\0"s));
  EXPECT_TRUE(s.apply(true, ""));
  EXPECT_TRUE(s.matches("anything\0"s)) << "the empty prefix matches everything";
}

// ---- against libzmq --------------------------------------------------------

int listen_loopback(int& port) {
  std::uint16_t p = 0;
  const int fd = test_support::bind_loopback(p);
  port = p;
  return fd;
}

// A libzmq socket connected to a plain loopback listener; `fd` is our end.
struct libzmq_peer {
  zmq::context_t ctx{1};
  zmq::socket_t sock;
  int lfd = -1, fd = -1;
  libzmq_peer(zmq::socket_type type, const std::function<void(zmq::socket_t&)>& setup) : sock(ctx, type) {
    int port = 0;
    lfd = listen_loopback(port);
    setup(sock);
    sock.connect("tcp://127.0.0.1:" + std::to_string(port));
    if (lfd >= 0) fd = ::accept(lfd, nullptr, nullptr);
  }
  ~libzmq_peer() {
    ::close(fd);
    ::close(lfd);
  }
};

// Moves bytes between a socket and a session until `done` (at most 5 s).
template <class Done>
bool converse(int fd, end& e, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buf[65536];
  while (!done() && !e.s.failed() && std::chrono::steady_clock::now() < until) {
    if (!e.out.empty()) {
      const auto n = ::send(fd, e.out.data(), e.out.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      e.out.erase(0, static_cast<std::size_t>(n));
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10) > 0) {
      const auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      e.receive(std::string_view(buf, static_cast<std::size_t>(n)));
    }
  }
  return done();
}

TEST(ZmtpSession, PublishesToALibzmqSub) {
  libzmq_peer peer(zmq::socket_type::sub, [](zmq::socket_t& s) {
    s.set(zmq::sockopt::rcvtimeo, 5000);
    s.set(zmq::sockopt::subscribe, "api\0"s);
  });
  ASSERT_GE(peer.fd, 0);
  zmq::socket_t& sub = peer.sock;
  const int fd = peer.fd;
  end pub(session::role::pub);
  pub.out = std::string(session::hello(session::role::pub));
  ASSERT_TRUE(converse(fd, pub, [&] { return !pub.ev.subscriptions.empty(); })) << pub.s.detail();
  EXPECT_EQ(pub.ev.subscriptions[0], std::pair(true, "api\0"s));
  // Messages of every size class, in order.
  std::minstd_rand rng(3);
  std::vector<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    ids.push_back(std::string(rng() % (i % 10 == 0 ? 5000 : 300), static_cast<char>('a' + i % 26)));
    pub.out += message({"api\0"s, "ACCEPTED", ids.back(), std::to_string(i), ""});
  }
  ASSERT_TRUE(converse(fd, pub, [&] { return pub.out.empty(); }));
  for (int i = 0; i < 200; ++i) {
    std::vector<zmq::message_t> parts;
    for (bool more = true; more;) {
      zmq::message_t m;
      ASSERT_TRUE(sub.recv(m)) << "message " << i;
      more = m.more();
      parts.push_back(std::move(m));
    }
    ASSERT_EQ(parts.size(), 5u);
    EXPECT_EQ(parts[2].to_string(), ids[static_cast<std::size_t>(i)]);
    EXPECT_EQ(parts[3].to_string(), std::to_string(i));
  }
  // A subscription changed at runtime reaches the session.
  sub.set(zmq::sockopt::unsubscribe, "api\0"s);
  ASSERT_TRUE(converse(fd, pub, [&] { return pub.ev.subscriptions.size() == 2; }));
  EXPECT_EQ(pub.ev.subscriptions[1], std::pair(false, "api\0"s));
}

TEST(ZmtpSession, ReceivesFromALibzmqPub) {
  libzmq_peer peer(zmq::socket_type::pub, [](zmq::socket_t& s) { s.set(zmq::sockopt::linger, 0); });
  ASSERT_GE(peer.fd, 0);
  zmq::socket_t& pub = peer.sock;
  const int fd = peer.fd;
  end sub(session::role::sub);
  sub.out = std::string(session::hello(session::role::sub));
  ASSERT_TRUE(converse(fd, sub, [&] { return sub.s.ready(); })) << sub.s.detail();
  zmtp::append_frame(sub.out, 0, "\x01"s + "api\0"s);
  // libzmq applies the subscription asynchronously: publish probes until one arrives.
  ASSERT_TRUE(converse(fd, sub, [&] {
    pub.send(zmq::buffer("api\0"s), zmq::send_flags::sndmore);
    pub.send(zmq::buffer("probe"s));
    return !sub.ev.messages.empty();
  }));
  const std::size_t probes = sub.ev.messages.size();
  std::minstd_rand rng(5);
  std::vector<std::string> ids;
  for (int i = 0; i < 300; ++i) {
    ids.push_back(std::string(rng() % (i % 10 == 0 ? 3000 : 200), static_cast<char>('A' + i % 26)));
    pub.send(zmq::buffer("api\0"s), zmq::send_flags::sndmore);
    pub.send(zmq::buffer("DELAYED"s), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(ids.back()));
  }
  // Until the last one sent arrives (late probes may come first: counting would stop early).
  ASSERT_TRUE(converse(fd, sub, [&] {
    return !sub.ev.messages.empty() && sub.ev.messages.back().size() == 3 && sub.ev.messages.back()[2] == ids.back();
  }));
  // Probes may still arrive after the first one; the rest is exactly what was sent, in order.
  std::size_t at = probes;
  while (at < sub.ev.messages.size() && sub.ev.messages[at].size() == 2) ++at;
  ASSERT_EQ(sub.ev.messages.size() - at, 300u);
  for (int i = 0; i < 300; ++i) {
    const auto& m = sub.ev.messages[at + static_cast<std::size_t>(i)];
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m[2], ids[static_cast<std::size_t>(i)]);
  }
}

// ---- CURVE -------------------------------------------------------------------

struct curve_world {
  zmtp::curve::keypair server = zmtp::curve::generate(), client = zmtp::curve::generate();
  std::shared_ptr<zmtp::curve::server_keys> server_keys() const {
    auto k = std::make_shared<zmtp::curve::server_keys>();
    k->own.push_back(server);
    k->allowed.insert(client.public_key);
    return k;
  }
  std::shared_ptr<zmtp::curve::client_keys> client_keys() const {
    auto k = std::make_shared<zmtp::curve::client_keys>();
    k->own = client;
    k->server = server.public_key;
    return k;
  }
};

// A connected pair: `pub` a CURVE client (the proxy's accounting), `sub` a server (the master's).
struct curve_pair {
  end pub, sub;
  curve_pair(const curve_world& w, std::shared_ptr<zmtp::curve::client_keys> ck = nullptr)
      : pub(session::role::pub, {}, {.client = ck ? ck : w.client_keys(), .server = nullptr}),
        sub(session::role::sub, {}, {.client = nullptr, .server = w.server_keys()}) {
    pub.s.start(pub.out);
    sub.s.start(sub.out);
  }
  // Moves what each has to send to the other, in pieces cut at random, until both are quiet.
  void exchange(std::minstd_rand& rng) {
    while (!pub.out.empty() || !sub.out.empty()) {
      const std::string a = std::exchange(pub.out, {}), b = std::exchange(sub.out, {});
      feed_split(sub, a, rng);
      feed_split(pub, b, rng);
    }
  }
};

TEST(ZmtpCurve, EndAgainstEndInEverySplit) {
  const curve_world w;
  std::minstd_rand rng(11);
  for (int round = 0; round < 50; ++round) {
    curve_pair c(w);
    c.exchange(rng);
    ASSERT_TRUE(c.pub.s.ready() && c.sub.s.ready()) << c.pub.s.detail() << c.sub.s.detail();
    EXPECT_EQ(*c.sub.s.peer_key(), w.client.public_key);
    // The subscriber subscribes (a sealed 0x01 message) and pings (a sealed command).
    c.sub.s.append(c.sub.out, 0, "\x01"s + "api\0"s);
    c.sub.s.append(c.sub.out, zmtp::flag_command, "\x04PING\0\x10"s + "ctx");
    c.exchange(rng);
    ASSERT_EQ(c.pub.ev.subscriptions.size(), 1u);
    EXPECT_EQ(c.pub.ev.subscriptions[0], std::pair(true, "api\0"s));
    // Messages of several frames, framed in the clear and sealed frame by frame.
    const std::string plain = message({"api\0"s, "ACCEPTED", std::string(round * 40, 'x'), "1700000000000", ""});
    c.pub.s.append_framed(c.pub.out, plain + message({"b", "c"}));
    const std::string wire = c.pub.out;
    EXPECT_EQ(wire.find("ACCEPTED"), std::string::npos) << "sealed";
    c.exchange(rng);
    ASSERT_EQ(c.sub.ev.messages.size(), 2u) << round;
    EXPECT_EQ(c.sub.ev.messages[0][1], "ACCEPTED");
    EXPECT_EQ(c.sub.ev.messages[0][2].size(), static_cast<std::size_t>(round * 40));
    EXPECT_EQ(c.sub.ev.messages[1], (std::vector<std::string>{"b", "c"}));
    EXPECT_FALSE(c.pub.s.failed() || c.sub.s.failed());
  }
}

// The first MESSAGE of `c.pub` after the handshake, and the bytes after it.
std::pair<std::string, std::string> first_message(curve_pair& c, std::minstd_rand& rng) {
  c.exchange(rng);
  c.pub.s.append_framed(c.pub.out, message({"api\0"s, "ACCEPTED", "victim", "1", ""}));
  zmtp::frame f;
  EXPECT_EQ(zmtp::next_frame(c.pub.out, 1 << 20, f), zmtp::frame_status::ok);
  return {c.pub.out.substr(0, f.size), c.pub.out.substr(f.size)};
}

TEST(ZmtpCurve, ThePeerNamesItsGatekeeper) {
  const curve_world w;
  std::minstd_rand rng(3);
  curve_pair c(w);
  c.pub.s.name_gatekeeper("0123456789abcdef");  // before WELCOME: INITIATE's metadata carries it
  c.exchange(rng);
  ASSERT_TRUE(c.sub.s.ready()) << c.sub.s.detail();
  EXPECT_EQ(c.sub.s.peer_gatekeeper(), 0x0123456789abcdefu);
}

TEST(ZmtpCurve, RefusalsHaveTheirLabels) {
  const curve_world w;
  std::minstd_rand rng(5);
  {  // a client key that is not listed
    auto ck = w.client_keys();
    ck->own = zmtp::curve::generate();
    curve_pair c(w, ck);
    c.exchange(rng);
    EXPECT_EQ(c.sub.s.failed(), zmtp::fault::unknown_key);
    EXPECT_TRUE(c.sub.ev.messages.empty());
  }
  {  // a client with the wrong server key: HELLO does not open
    auto ck = w.client_keys();
    ck->server = zmtp::curve::generate().public_key;
    curve_pair c(w, ck);
    c.exchange(rng);
    EXPECT_EQ(c.sub.s.failed(), zmtp::fault::bad_box);
  }
  {  // a tampered box
    curve_pair c(w);
    auto [m, rest] = first_message(c, rng);
    m.back() = static_cast<char>(m.back() ^ 1);
    c.sub.receive(m);
    EXPECT_EQ(c.sub.s.failed(), zmtp::fault::bad_box);
    EXPECT_TRUE(c.sub.ev.messages.empty());
  }
  {  // a replayed box
    curve_pair c(w);
    auto [m, rest] = first_message(c, rng);
    c.sub.receive(m);
    EXPECT_FALSE(c.sub.s.failed());
    c.sub.receive(m);
    EXPECT_EQ(c.sub.s.failed(), zmtp::fault::nonce);
  }
  {  // reordered boxes: the second frame first
    curve_pair c(w);
    auto [m, rest] = first_message(c, rng);
    zmtp::frame f;
    ASSERT_EQ(zmtp::next_frame(rest, 1 << 20, f), zmtp::frame_status::ok);
    c.sub.receive(rest.substr(0, f.size));
    EXPECT_FALSE(c.sub.s.failed());
    c.sub.receive(m);
    EXPECT_EQ(c.sub.s.failed(), zmtp::fault::nonce);
  }
  {  // a plaintext peer
    end sub(session::role::sub, {}, {.client = nullptr, .server = w.server_keys()});
    sub.receive(session::hello(session::role::pub));
    EXPECT_EQ(sub.s.failed(), zmtp::fault::mechanism);
  }
  {  // a data frame in the handshake, and a second HELLO
    end sub(session::role::sub, {}, {.client = nullptr, .server = w.server_keys()});
    sub.receive(zmtp::curve_greeting(false));
    sub.receive(message({"hello?"}));
    EXPECT_EQ(sub.s.failed(), zmtp::fault::handshake);
  }
}

TEST(ZmtpCurve, EitherOfTwoServerKeysIsAcceptedDuringARotation) {
  const curve_world w;
  std::minstd_rand rng(9);
  const auto next = zmtp::curve::generate();
  auto sk = w.server_keys();
  sk->own.insert(sk->own.begin(), next);
  for (const auto& server : {w.server.public_key, next.public_key}) {
    auto ck = w.client_keys();
    ck->server = server;
    end pub(session::role::pub, {}, {.client = ck, .server = nullptr});
    end sub(session::role::sub, {}, {.client = nullptr, .server = sk});
    pub.s.start(pub.out);
    sub.s.start(sub.out);
    while (!pub.out.empty() || !sub.out.empty()) {
      const std::string a = std::exchange(pub.out, {}), b = std::exchange(sub.out, {});
      feed_split(sub, a, rng);
      feed_split(pub, b, rng);
    }
    EXPECT_TRUE(pub.s.ready() && sub.s.ready()) << sub.s.detail();
  }
}

std::string z85(const zmtp::curve::key& k) { return zmtp::curve::z85_encode(k); }

TEST(ZmtpCurve, PublishesToALibzmqCurveSub) {
  // Our client (the proxy's accounting) to a libzmq SUB that is the CURVE server.
  const curve_world w;
  libzmq_peer peer(zmq::socket_type::sub, [&](zmq::socket_t& s) {
    s.set(zmq::sockopt::rcvtimeo, 5000);
    s.set(zmq::sockopt::curve_server, true);
    s.set(zmq::sockopt::curve_secretkey, z85(w.server.secret_key));
    s.set(zmq::sockopt::subscribe, "api\0"s);
  });
  ASSERT_GE(peer.fd, 0);
  end pub(session::role::pub, {}, {.client = w.client_keys(), .server = nullptr});
  pub.s.start(pub.out);
  ASSERT_TRUE(converse(peer.fd, pub, [&] { return !pub.ev.subscriptions.empty(); })) << pub.s.detail();
  EXPECT_EQ(pub.ev.subscriptions[0], std::pair(true, "api\0"s));
  std::vector<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    ids.push_back(std::string(static_cast<std::size_t>(i % 10 == 0 ? 3000 : 1 + i), static_cast<char>('a' + i % 26)));
    pub.s.append_framed(pub.out, message({"api\0"s, "ACCEPTED", ids.back(), std::to_string(i), ""}));
  }
  ASSERT_TRUE(converse(peer.fd, pub, [&] { return pub.out.empty(); }));
  for (int i = 0; i < 100; ++i) {
    std::vector<zmq::message_t> parts;
    for (bool more = true; more;) {
      zmq::message_t m;
      ASSERT_TRUE(peer.sock.recv(m)) << "message " << i;
      more = m.more();
      parts.push_back(std::move(m));
    }
    ASSERT_EQ(parts.size(), 5u);
    EXPECT_EQ(parts[2].to_string(), ids[static_cast<std::size_t>(i)]);
  }
}

TEST(ZmtpCurve, ReceivesFromALibzmqCurvePubAndPublishesToALibzmqCurveSub) {
  // Our server (the master's accounting and control) to libzmq CURVE clients.
  const curve_world w;
  const auto client_opts = [&](zmq::socket_t& s) {
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::curve_serverkey, z85(w.server.public_key));
    s.set(zmq::sockopt::curve_publickey, z85(w.client.public_key));
    s.set(zmq::sockopt::curve_secretkey, z85(w.client.secret_key));
  };
  libzmq_peer pub_peer(zmq::socket_type::pub, client_opts);
  ASSERT_GE(pub_peer.fd, 0);
  end sub(session::role::sub, {}, {.client = nullptr, .server = w.server_keys()});
  sub.s.start(sub.out);
  ASSERT_TRUE(converse(pub_peer.fd, sub, [&] { return sub.s.ready(); })) << sub.s.detail();
  sub.s.append(sub.out, 0, "\x01"s + "api\0"s);
  ASSERT_TRUE(converse(pub_peer.fd, sub, [&] {
    pub_peer.sock.send(zmq::buffer("api\0"s), zmq::send_flags::sndmore);
    pub_peer.sock.send(zmq::buffer("probe"s));
    return !sub.ev.messages.empty();
  })) << sub.s.detail();
  EXPECT_EQ(sub.ev.messages[0], (std::vector<std::string>{"api\0"s, "probe"}));

  libzmq_peer sub_peer(zmq::socket_type::sub, [&](zmq::socket_t& s) {
    client_opts(s);
    s.set(zmq::sockopt::rcvtimeo, 5000);
    s.set(zmq::sockopt::subscribe, "web\0"s);
  });
  ASSERT_GE(sub_peer.fd, 0);
  end pub(session::role::pub, {}, {.client = nullptr, .server = w.server_keys()});
  pub.s.start(pub.out);
  ASSERT_TRUE(converse(sub_peer.fd, pub, [&] { return !pub.ev.subscriptions.empty(); })) << pub.s.detail();
  pub.s.append_framed(pub.out, message({"web\0"s, "DELAY_UNTIL", "someone", "1700000000000"}));
  ASSERT_TRUE(converse(sub_peer.fd, pub, [&] { return pub.out.empty(); }));
  zmq::message_t m;
  ASSERT_TRUE(sub_peer.sock.recv(m));
  EXPECT_EQ(m.to_string(), "web\0"s);
}

// A libzmq CURVE PUB with heartbeats on: 1,000 messages of 1 to 4 frames and
// random sizes arrive whole and in order at our CURVE server, and libzmq's
// PINGs (commands, flagged inside their boxes) are answered and never
// delivered as data. Conversed until more boxes came than data frames were
// sent, so at least one PING was read, however long libzmq takes to send one.
TEST(ZmtpCurve, ALibzmqCurvePublisherWithHeartbeatsUnderRandomContents) {
  const curve_world w;
  libzmq_peer pub_peer(zmq::socket_type::pub, [&](zmq::socket_t& s) {
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 0);
    s.set(zmq::sockopt::heartbeat_ivl, 5);
    s.set(zmq::sockopt::heartbeat_timeout, 60'000);
    s.set(zmq::sockopt::curve_serverkey, z85(w.server.public_key));
    s.set(zmq::sockopt::curve_publickey, z85(w.client.public_key));
    s.set(zmq::sockopt::curve_secretkey, z85(w.client.secret_key));
  });
  ASSERT_GE(pub_peer.fd, 0);
  end sub(session::role::sub, {.max_message = 1 << 20, .max_frames = 8},
          {.client = nullptr, .server = w.server_keys()});
  sub.s.start(sub.out);
  // Every box libzmq sends after the greeting, counted on the raw bytes.
  std::string tap;
  std::size_t tapped = 64, boxes = 0;
  const auto count_boxes = [&](std::string_view bytes) {
    tap.append(bytes);
    while (tap.size() > tapped) {
      zmtp::frame f;
      if (zmtp::next_frame(std::string_view(tap).substr(tapped), 1 << 21, f) != zmtp::frame_status::ok) break;
      if (f.body.starts_with("\x07MESSAGE")) ++boxes;
      tapped += f.size;
    }
  };
  const auto converse_tapped = [&](const auto& done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    char buf[65536];
    while (!done() && !sub.s.failed() && std::chrono::steady_clock::now() < until) {
      if (!sub.out.empty()) {
        const auto n = ::send(pub_peer.fd, sub.out.data(), sub.out.size(), MSG_NOSIGNAL);
        if (n <= 0) return false;
        sub.out.erase(0, static_cast<std::size_t>(n));
      }
      pollfd p{pub_peer.fd, POLLIN, 0};
      if (::poll(&p, 1, 10) > 0) {
        const auto n = ::recv(pub_peer.fd, buf, sizeof buf, 0);
        if (n <= 0) return false;
        count_boxes(std::string_view(buf, static_cast<std::size_t>(n)));
        sub.receive(std::string_view(buf, static_cast<std::size_t>(n)));
      }
    }
    return done();
  };
  ASSERT_TRUE(converse_tapped([&] { return sub.s.ready(); })) << sub.s.detail();
  sub.s.append(sub.out, 0, "\x01"s + "api\0"s);
  // The subscription reached libzmq once a probe comes back.
  ASSERT_TRUE(converse_tapped([&] {
    pub_peer.sock.send(zmq::buffer("api\0"s), zmq::send_flags::sndmore);
    pub_peer.sock.send(zmq::buffer("probe"s));
    return !sub.ev.messages.empty();
  })) << sub.s.detail();
  const std::size_t probes = sub.ev.messages.size();
  std::minstd_rand rng(2026);
  std::vector<std::vector<std::string>> sent;
  std::size_t frames = 0;
  for (int i = 0; i < 1000; ++i) {
    std::vector<std::string> m{"api\0"s};
    const std::size_t extra = 1 + rng() % 3;
    for (std::size_t j = 0; j < extra; ++j) {
      std::string body(rng() % (j == 0 && i % 50 == 0 ? 70'000 : 300), '\0');
      for (auto& c : body) c = static_cast<char>(rng());
      m.push_back(std::move(body));
    }
    for (std::size_t j = 0; j < m.size(); ++j)
      pub_peer.sock.send(zmq::buffer(m[j]), j + 1 < m.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    frames += m.size();
    sent.push_back(std::move(m));
  }
  // Probes may still come after the first; then exactly what was sent, in order.
  ASSERT_TRUE(converse_tapped([&] {
    return sub.ev.messages.size() >= probes && sub.ev.messages.back() == sent.back();
  })) << sub.s.detail();
  std::size_t at = probes;
  while (at < sub.ev.messages.size() && sub.ev.messages[at].size() == 2 && sub.ev.messages[at][1] == "probe") ++at;
  ASSERT_EQ(sub.ev.messages.size() - at, sent.size());
  for (std::size_t i = 0; i < sent.size(); ++i) ASSERT_EQ(sub.ev.messages[at + i], sent[i]) << "message " << i;
  // Boxes beyond the data frames are libzmq's PINGs: wait for one, answered without a fault.
  const std::size_t data_boxes = frames + 2 * sub.ev.messages.size() - 2 * sent.size();  // probes: 2 frames each
  ASSERT_TRUE(converse_tapped([&] { return boxes > data_boxes + 2; })) << sub.s.detail();
  EXPECT_FALSE(sub.s.failed());
  EXPECT_EQ(sub.ev.messages.size() - at, sent.size()) << "no PING delivered as data";
}

TEST(ZmtpCurve, Z85AndKeyFiles) {
  // rfc.zeromq.org/spec/32's example, in a key's length.
  zmtp::curve::key k{};
  const unsigned char hello[8] = {0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = hello[i % 8];
  EXPECT_EQ(z85(k).substr(0, 10), "HelloWorld");
  EXPECT_EQ(zmtp::curve::z85_decode(z85(k)), k);
  EXPECT_FALSE(zmtp::curve::z85_decode("HelloWorld"));
  EXPECT_FALSE(zmtp::curve::z85_decode(std::string(40, '~')));
  EXPECT_FALSE(zmtp::curve::z85_decode(std::string(40, '#')));  // in the alphabet, over 2^32 per block

  const std::string dir = ::testing::TempDir();
  const auto kp = zmtp::curve::generate();
  // A key starting with '#' is a key, not a comment.
  std::string secret = z85(kp.secret_key);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const auto bare = write("bare.key", "# a comment line\n\n" + secret + "  trailing words\n");
  EXPECT_EQ(zmtp::curve::read_secret_key(bare).public_key, kp.public_key);
  const auto cert = write("cert.key", "#   ****  Generated by CZMQ  ****\nmetadata\ncurve\n    public-key = \"" +
                                          z85(kp.public_key) + "\"\n    secret-key = \"" + secret + "\"\n");
  EXPECT_EQ(zmtp::curve::read_secret_key(cert).secret_key, kp.secret_key);
  EXPECT_EQ(zmtp::curve::read_public_key(cert), kp.public_key);
  EXPECT_EQ(zmtp::curve::read_public_key(z85(kp.public_key)), kp.public_key) << "the key itself, not a file";
  EXPECT_THROW(zmtp::curve::read_secret_key(write("bad.key", "not a key\n")), std::runtime_error);
  EXPECT_THROW(zmtp::curve::read_secret_key(dir + "/missing.key"), std::runtime_error);
  const auto other = zmtp::curve::generate();
  const auto list =
      write("allowed", "# gatekeepers\n" + z85(kp.public_key) + " gk-1\n\n" + z85(other.public_key) + "\n");
  EXPECT_EQ(zmtp::curve::read_key_list(list), (std::set<zmtp::curve::key>{kp.public_key, other.public_key}));
  try {
    zmtp::curve::read_key_list(write("broken", z85(kp.public_key) + "\nshort\n"));
    ADD_FAILURE() << "a line that is not a key";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("broken:2"), std::string::npos) << e.what();
  }
}

}  // namespace
