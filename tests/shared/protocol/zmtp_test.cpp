// ZMTP 3.0 pieces: byte-exact against the spec (rfc.zeromq.org/spec/23) and
// what libzmq sends; every malformed shape refused.
#include <gtest/gtest.h>

#include "shared/protocol/zmtp.hpp"

using namespace smockron;
using namespace std::string_literals;

namespace {

std::string peer_greeting(int major, int minor, std::string_view mechanism = "NULL") {
  std::string g(64, '\0');
  g[0] = '\xff';
  g[9] = '\x7f';
  g[10] = static_cast<char>(major);
  g[11] = static_cast<char>(minor);
  g.replace(12, mechanism.size(), mechanism);
  return g;
}

TEST(ZmtpWire, OurGreetingIsVersion30Null) {
  const std::string_view g = zmtp::greeting();
  ASSERT_EQ(g.size(), 64u);
  EXPECT_EQ(g.substr(0, 12), "\xff\0\0\0\0\0\0\0\0\x7f\x03\x00"s);
  EXPECT_EQ(g.substr(12, 20), "NULL"s + std::string(16, '\0'));
  EXPECT_EQ(g.substr(32), std::string(32, '\0')) << "as-server 0 and filler";
}

TEST(ZmtpWire, GreetingChecksDecideAsEarlyAsTheBytesAllow) {
  std::string detail;
  const std::string libzmq = peer_greeting(3, 1);
  for (std::size_t n = 0; n < 64; ++n) {
    EXPECT_EQ(zmtp::check_greeting(std::string_view(libzmq).substr(0, n), detail), zmtp::greeting_status::need_more)
        << n;
  }
  EXPECT_EQ(zmtp::check_greeting(libzmq, detail), zmtp::greeting_status::ok);
  EXPECT_EQ(zmtp::check_greeting("GET /", detail), zmtp::greeting_status::not_zmtp);
  EXPECT_EQ(zmtp::check_greeting(peer_greeting(2, 0).substr(0, 12), detail), zmtp::greeting_status::old_version);
  EXPECT_EQ(detail, "ZMTP 2.0 peer (ZeroMQ 4.x is needed)");
  std::string v1 = libzmq.substr(0, 10);
  v1[9] = 0;  // a ZMTP 1.0 identity frame length, not the signature's 0x7f
  EXPECT_EQ(zmtp::check_greeting(v1, detail), zmtp::greeting_status::old_version);
  EXPECT_EQ(zmtp::check_greeting(peer_greeting(3, 0, "CURVE"), detail), zmtp::greeting_status::mechanism);
  EXPECT_EQ(detail, "security mechanism \"CURVE\" (only NULL)");
  EXPECT_EQ(zmtp::check_greeting(peer_greeting(3, 0, "N\nULL"), detail), zmtp::greeting_status::mechanism);
  EXPECT_EQ(detail.find('\n'), std::string::npos) << "peer text is made printable for the log";
}

TEST(ZmtpWire, ReadyCommandRoundTrips) {
  const std::string r = zmtp::ready("SUB");
  EXPECT_EQ(r, "\x04\x19\x05READY\x0bSocket-Type\0\0\0\x03SUB"s);
  zmtp::frame f;
  ASSERT_EQ(zmtp::next_frame(r, 1024, f), zmtp::frame_status::ok);
  EXPECT_TRUE(f.command());
  EXPECT_EQ(f.size, r.size());
  const auto cmd = zmtp::split_command(f.body);
  ASSERT_TRUE(cmd);
  EXPECT_EQ(cmd->first, "READY");
  EXPECT_EQ(zmtp::ready_socket_type(cmd->second), "SUB");
  // libzmq may add properties (Identity for some socket types); names are case-insensitive.
  const std::string props = "\x08Identity\0\0\0\0"s + "\x0bsocket-type\0\0\0\x04XPUB"s;
  EXPECT_EQ(zmtp::ready_socket_type(props), "XPUB");
  EXPECT_EQ(zmtp::ready_socket_type(""), "") << "absent";
  EXPECT_FALSE(zmtp::ready_socket_type("\x0bSocket-Type\0\0\0\x09PUB"s)) << "value longer than the body";
  EXPECT_FALSE(zmtp::ready_socket_type("\x0bSocket")) << "name cut short";
  EXPECT_FALSE(zmtp::split_command(""));
  EXPECT_FALSE(zmtp::split_command("\x09PING"));
}

// A gatekeeper names itself on its accounting connections (X-Gatekeeper, a wire addition).
TEST(ZmtpWire, ReadyNamesTheGatekeeper) {
  const std::string r = zmtp::ready("PUB", "00000000000abc00");
  EXPECT_EQ(r, "\x04\x3a\x05READY\x0bSocket-Type\0\0\0\x03PUB\x0cX-Gatekeeper\0\0\0\x10"s + "00000000000abc00");
  zmtp::frame f;
  ASSERT_EQ(zmtp::next_frame(r, 1024, f), zmtp::frame_status::ok);
  const auto cmd = zmtp::split_command(f.body);
  ASSERT_TRUE(cmd);
  EXPECT_EQ(zmtp::ready_socket_type(cmd->second), "PUB");
  EXPECT_EQ(zmtp::ready_property(cmd->second, "x-gatekeeper"), "00000000000abc00") << "names are case-insensitive";
  EXPECT_EQ(zmtp::ready("PUB", ""), zmtp::ready("PUB")) << "no name: no property";
  EXPECT_EQ(zmtp::ready_property(zmtp::ready("PUB").substr(8), zmtp::gatekeeper_property), "") << "absent";
  EXPECT_FALSE(zmtp::ready_property("\x0cX-Gatekeeper\0\0\0\x10"s + "short", zmtp::gatekeeper_property));
}

TEST(ZmtpWire, FramesShortAndLong) {
  std::string out;
  zmtp::append_frame(out, zmtp::flag_more, "abc");
  zmtp::append_frame(out, 0, std::string(300, 'x'));
  EXPECT_EQ(out.substr(0, 5),
            "\x01\x03"
            "abc"s);
  EXPECT_EQ(out.substr(5, 9), "\x02\0\0\0\0\0\0\x01\x2c"s) << "over 255 bytes: the 8-byte size";
  zmtp::frame f;
  ASSERT_EQ(zmtp::next_frame(out, 1024, f), zmtp::frame_status::ok);
  EXPECT_TRUE(f.more());
  EXPECT_EQ(f.body, "abc");
  ASSERT_EQ(zmtp::next_frame(std::string_view(out).substr(f.size), 1024, f), zmtp::frame_status::ok);
  EXPECT_FALSE(f.more());
  EXPECT_EQ(f.body.size(), 300u);
  // Every cut of a frame asks for more, never misreads.
  for (std::size_t n = 0; n < out.size() - 5; ++n) {
    EXPECT_EQ(zmtp::next_frame(std::string_view(out).substr(5, n), 1024, f), zmtp::frame_status::need_more) << n;
  }
  EXPECT_EQ(zmtp::next_frame(std::string_view(out).substr(5), 299, f), zmtp::frame_status::too_large);
  EXPECT_EQ(zmtp::next_frame("\x02\xff\xff\xff\xff\xff\xff\xff\xff"s, 1 << 20, f), zmtp::frame_status::too_large)
      << "a 64-bit size is refused before anything is added to it";
  EXPECT_EQ(zmtp::next_frame("\x08\x00"s, 1024, f), zmtp::frame_status::reserved_flags);
}

TEST(ZmtpWire, PongEchoesThePingContext) {
  EXPECT_EQ(zmtp::pong_for("\x00\x64"
                           "ctx"s),
            "\x04\x08\x04PONGctx"s);
  EXPECT_EQ(zmtp::pong_for("\x00\x64"s), "\x04\x05\x04PONG"s) << "no context";
  EXPECT_EQ(zmtp::pong_for(""), "\x04\x05\x04PONG"s) << "no TTL either";
  EXPECT_EQ(zmtp::pong_for("\x00\x64"s + std::string(40, 'c')).size(), 2u + 5u + 16u) << "context capped at 16 bytes";
}

}  // namespace
