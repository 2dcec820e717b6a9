// PROXY protocol v1 and v2 parsing: the examples of HAProxy's specification,
// truncated, oversized and malformed headers, and byte-by-byte arrival.
#include "proxy/codec/proxy_protocol.hpp"

#include <gtest/gtest.h>

#include <string>

#include "proxy/identify/identify.hpp"

namespace smockron::proxy::proxy_protocol {
namespace {

constexpr std::size_t k_max = 4096;

std::string source_of(const result& r) { return r.source ? format_ip(*r.source) : std::string("<peer>"); }

// A version 2 header: command (0 LOCAL, 1 PROXY), family/transport byte, address block and TLVs.
std::string v2(std::uint8_t command, std::uint8_t family_transport, const std::string& block) {
  std::string h("\r\n\r\n\0\r\nQUIT\n", 12);
  h.push_back(static_cast<char>(0x20 | command));
  h.push_back(static_cast<char>(family_transport));
  h.push_back(static_cast<char>(block.size() >> 8));
  h.push_back(static_cast<char>(block.size() & 0xff));
  return h + block;
}

std::string bytes(std::initializer_list<int> list) {
  std::string s;
  for (const int b : list) s.push_back(static_cast<char>(b));
  return s;
}

// Every proper prefix of a valid header asks for more.
void expect_incomplete_prefixes(const std::string& header) {
  for (std::size_t n = 0; n < header.size(); ++n) {
    EXPECT_EQ(parse(header.substr(0, n), k_max).state, status::incomplete) << n << " of " << header.size();
  }
}

TEST(ProxyProtocolV1, Tcp4AndTcp6) {
  const std::string tcp4 = "PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n";
  auto r = parse(tcp4 + "GET / HTTP/1.1\r\n", k_max);
  ASSERT_EQ(r.state, status::complete) << r.reason;
  EXPECT_EQ(r.consumed, tcp4.size());
  EXPECT_EQ(source_of(r), "192.0.2.1");
  EXPECT_EQ(r.source_port, 56324);
  expect_incomplete_prefixes(tcp4);

  const std::string tcp6 = "PROXY TCP6 2001:db8::1 2001:db8::2 65535 0\r\n";
  r = parse(tcp6, k_max);
  ASSERT_EQ(r.state, status::complete) << r.reason;
  EXPECT_EQ(source_of(r), "2001:db8::1");
  EXPECT_EQ(r.source_port, 65535);
}

TEST(ProxyProtocolV1, UnknownKeepsThePeer) {
  for (const std::string line :
       {"PROXY UNKNOWN\r\n", "PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n"}) {
    const auto r = parse(line, k_max);
    ASSERT_EQ(r.state, status::complete) << line;
    EXPECT_EQ(r.consumed, line.size());
    EXPECT_FALSE(r.source);
  }
}

TEST(ProxyProtocolV1, MalformedLines) {
  for (const std::string line : {
           "PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\n",      // bare LF
           "PROXY TCP4  192.0.2.1 198.51.100.1 56324 443\r\n",   // two spaces
           "PROXY TCP4 192.0.2.1 198.51.100.1 56324\r\n",        // a port missing
           "PROXY TCP4 192.0.2.1 198.51.100.1 56324 443 7\r\n",  // a field too many
           "PROXY TCP4 192.0.2.1 198.51.100.1 65536 443\r\n",    // port out of range
           "PROXY TCP4 192.0.2.1 198.51.100.1 -1 443\r\n",       // not a number
           "PROXY TCP4 2001:db8::1 198.51.100.1 1 443\r\n",      // family mismatch
           "PROXY TCP6 192.0.2.1 2001:db8::2 1 443\r\n",         // family mismatch
           "PROXY TCP4 192.0.2.256 198.51.100.1 1 443\r\n",      // not an address
           "PROXY UDP4 192.0.2.1 198.51.100.1 1 443\r\n",        // unknown protocol
           "PROXY \r\n",                                         // nothing
           "proxy TCP4 192.0.2.1 198.51.100.1 1 443\r\n",        // case matters
           "GET / HTTP/1.1\r\nHost: a\r\n\r\n",                  // no header at all
       }) {
    EXPECT_EQ(parse(line, k_max).state, status::invalid) << line;
  }
  // Found by fuzz_proxy_protocol: a NUL ended the address for inet_pton, and a
  // bare LF inside the line was only noticed when the line arrived cut there.
  EXPECT_EQ(parse(std::string("PROXY TCP6 2008::1\0\r\xaa\r~\0\r\xa7\n~\0\0\0 1:d6:: 1070 5\r\n", 47), k_max).state,
            status::invalid);
  EXPECT_EQ(parse(std::string("PROXY TCP4 192.0.2.1\0 198.51.100.1 1 443\r\n", 42), k_max).state, status::invalid);
  EXPECT_EQ(parse("PROXY UNKNOWN \xff\r\n", k_max).state, status::invalid);
  // No CRLF within 107 bytes: invalid, without waiting for more.
  const std::string long_line = "PROXY UNKNOWN " + std::string(100, 'x');
  EXPECT_EQ(parse(long_line, k_max).state, status::invalid);
  EXPECT_EQ(parse(long_line.substr(0, 106), k_max).state, status::incomplete);
  // Exactly 107 bytes with its CRLF is the longest allowed.
  const std::string longest = "PROXY UNKNOWN " + std::string(107 - 16, 'x') + "\r\n";
  ASSERT_EQ(longest.size(), 107u);
  EXPECT_EQ(parse(longest, k_max).state, status::complete);
}

TEST(ProxyProtocolV2, ProxyInetAndInet6) {
  const std::string inet = v2(1, 0x11, bytes({192, 0, 2, 1, 198, 51, 100, 1, 0xdc, 0x04, 0x01, 0xbb}));
  auto r = parse(inet + "GET /", k_max);
  ASSERT_EQ(r.state, status::complete) << r.reason;
  EXPECT_EQ(r.consumed, inet.size());
  EXPECT_EQ(source_of(r), "192.0.2.1");
  EXPECT_EQ(r.source_port, 56324);
  expect_incomplete_prefixes(inet);

  std::string block(36, '\0');
  block[0] = '\x20';
  block[1] = '\x01';
  block[2] = '\x0d';
  block[3] = '\xb8';
  block[15] = '\x07';
  block[32] = '\x01';
  block[33] = '\x02';
  // TLVs after the addresses (here a PP2_TYPE_AUTHORITY) are skipped.
  const std::string inet6 = v2(1, 0x21, block + bytes({0x02, 0x00, 0x03}) + "a.b");
  r = parse(inet6, k_max);
  ASSERT_EQ(r.state, status::complete) << r.reason;
  EXPECT_EQ(r.consumed, inet6.size());
  EXPECT_EQ(source_of(r), "2001:db8::7");
  EXPECT_EQ(r.source_port, 258);
}

TEST(ProxyProtocolV2, LocalUnspecAndUnixKeepThePeer) {
  // LOCAL (the balancer's own health check), with or without an address block.
  for (const auto& h :
       {v2(0, 0x00, ""), v2(0, 0x11, std::string(12, '\x01')), v2(1, 0x00, ""), v2(1, 0x31, std::string(216, '/'))}) {
    const auto r = parse(h, k_max);
    ASSERT_EQ(r.state, status::complete) << r.reason;
    EXPECT_EQ(r.consumed, h.size());
    EXPECT_FALSE(r.source);
  }
}

TEST(ProxyProtocolV2, MalformedHeaders) {
  const std::string ok_block = bytes({192, 0, 2, 1, 198, 51, 100, 1, 0, 80, 0, 80});
  auto with_byte = [&](std::size_t i, int value) {
    auto h = v2(1, 0x11, ok_block);
    h[i] = static_cast<char>(value);
    return h;
  };
  EXPECT_EQ(parse(with_byte(11, 'X'), k_max).state, status::invalid) << "wrong signature";
  EXPECT_EQ(parse(with_byte(12, 0x11), k_max).state, status::invalid) << "version 1 in a v2 header";
  EXPECT_EQ(parse(with_byte(12, 0x22), k_max).state, status::invalid) << "unknown command";
  EXPECT_EQ(parse(with_byte(13, 0x41), k_max).state, status::invalid) << "unknown family";
  EXPECT_EQ(parse(with_byte(13, 0x13), k_max).state, status::invalid) << "unknown transport";
  EXPECT_EQ(parse(v2(1, 0x11, ok_block.substr(0, 11)), k_max).state, status::invalid) << "short INET block";
  EXPECT_EQ(parse(v2(1, 0x21, std::string(35, '\0')), k_max).state, status::invalid) << "short INET6 block";
  // Larger than the bound: refused at once, not waited for.
  const auto big = v2(1, 0x11, ok_block + std::string(5000, '\0'));
  EXPECT_EQ(parse(big.substr(0, 16), k_max).state, status::invalid);
  EXPECT_EQ(parse(big, big.size()).state, status::complete);
}

TEST(ProxyProtocol, EmptyInputWaits) { EXPECT_EQ(parse("", k_max).state, status::incomplete); }

}  // namespace
}  // namespace smockron::proxy::proxy_protocol
