// Body relay without I/O: what goes out for the bytes received, for each
// framing pair, fed in every split.
#include <gtest/gtest.h>

#include <string>

#include "proxy/codec/body_relay.hpp"

using namespace smockron;
using namespace smockron::proxy;
using http1::framing;

namespace {

std::string gather(const buffer_list& b) {
  std::string out;
  for (const auto& x : b.span()) out.append(static_cast<const char*>(x.data()), x.size());
  return out;
}

// Relays `in` cut into pieces of `piece` bytes; returns what went out and
// what was left unused (the next message). Sets `ok` false on a framing error.
std::pair<std::string, std::string> relay(framing from, framing to, std::uint64_t length, const std::string& in,
                                          std::size_t piece, bool eof_at_end, bool& ok) {
  body_relay r(from, to, length, 64);
  std::string out, pending;
  ok = true;
  std::size_t at = 0;
  while (!r.done) {
    if (at < in.size()) {
      pending += in.substr(at, piece);
      at += piece;
    } else if (eof_at_end && !r.eof) {
      r.eof = true;
    } else {
      break;
    }
    while (!r.done) {
      buffer_list b;
      const auto used = r.step(pending, b);
      if (!used) {
        ok = false;
        return {out, pending + in.substr(std::min(at, in.size()))};
      }
      out += gather(b);
      pending.erase(0, *used);
      if (*used == 0) break;
    }
  }
  return {out, pending + in.substr(std::min(at, in.size()))};  // what the relay left, and what it never saw
}

TEST(BodyRelay, LengthBodiesStopAtTheirEnd) {
  for (std::size_t piece : {1u, 3u, 100u}) {
    bool ok = false;
    const auto [out, rest] = relay(framing::length, framing::length, 5,
                                   "hello"
                                   "GET / HTTP/1.1\r\n",
                                   piece, false, ok);
    EXPECT_TRUE(ok);
    EXPECT_EQ(out, "hello") << piece;
    EXPECT_EQ(rest.substr(0, 3), "GET") << "the next request is left alone";
  }
}

TEST(BodyRelay, ChunkedPassesThroughOrIsDechunked) {
  const std::string chunked = "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Checksum: x\r\n\r\nNEXT";
  for (std::size_t piece : {1u, 2u, 7u, 1000u}) {
    bool ok = false;
    auto [same, rest] = relay(framing::chunked, framing::chunked, 0, chunked, piece, false, ok);
    EXPECT_TRUE(ok);
    EXPECT_EQ(same, chunked.substr(0, chunked.size() - 4)) << piece;
    auto [plain, rest2] = relay(framing::chunked, framing::until_close, 0, chunked, piece, false, ok);
    EXPECT_TRUE(ok);
    EXPECT_EQ(plain, "hello world") << "for an HTTP/1.0 client";
    EXPECT_EQ(rest2.substr(0, 4), "NEXT");
  }
}

TEST(BodyRelay, UntilCloseIsRechunkedForHttp11) {
  bool ok = false;
  const auto [out, rest] = relay(framing::until_close, framing::chunked, 0, "abcdef", 4, true, ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(out, "4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n");
  const auto [raw, rest2] = relay(framing::until_close, framing::until_close, 0, "abcdef", 4, true, ok);
  EXPECT_EQ(raw, "abcdef");
}

TEST(BodyRelay, MalformedChunksAreRefused) {
  bool ok = true;
  relay(framing::chunked, framing::chunked, 0, "zz\r\nhello\r\n0\r\n\r\n", 3, false, ok);
  EXPECT_FALSE(ok);
}

TEST(BodyRelay, NoBodyIsDoneAtOnce) {
  body_relay r(framing::none, framing::none, 0, 64);
  EXPECT_TRUE(r.done);
  buffer_list b;
  EXPECT_EQ(r.step("GET /", b), 0u);
  EXPECT_TRUE(b.empty());
}

TEST(BufferList, ConsumeDropsWhatWasSent) {
  buffer_list b;
  b.add("abc", 3);
  b.add("defg", 4);
  b.consume(2);
  EXPECT_EQ(gather(b), "cdefg");
  b.consume(1);
  EXPECT_EQ(gather(b), "defg");
  b.consume(4);
  EXPECT_TRUE(b.empty());
}

}  // namespace
