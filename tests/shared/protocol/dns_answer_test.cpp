// The TTL of a DNS answer, read from the message as a server sends it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shared/protocol/dns_answer.hpp"

using namespace smockron;

namespace {

struct message {
  std::vector<unsigned char> bytes;
  void u16(unsigned v) {
    bytes.push_back(static_cast<unsigned char>(v >> 8));
    bytes.push_back(static_cast<unsigned char>(v));
  }
  void u32(std::uint32_t v) {
    u16(v >> 16);
    u16(v & 0xffff);
  }
  void name(const std::string& dotted) {
    std::size_t at = 0;
    while (at < dotted.size()) {
      const auto dot = dotted.find('.', at);
      const std::string label = dotted.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
      bytes.push_back(static_cast<unsigned char>(label.size()));
      bytes.insert(bytes.end(), label.begin(), label.end());
      at = dot == std::string::npos ? dotted.size() : dot + 1;
    }
    bytes.push_back(0);
  }
  // An SRV record whose owner is a pointer to the question's name (offset 12).
  void srv(std::uint32_t ttl, const std::string& target) {
    u16(0xc00c);
    u16(33);
    u16(1);
    u32(ttl);
    message rdata;
    rdata.u16(0);
    rdata.u16(0);
    rdata.u16(10004);
    rdata.name(target);
    u16(static_cast<unsigned>(rdata.bytes.size()));
    bytes.insert(bytes.end(), rdata.bytes.begin(), rdata.bytes.end());
  }
};

message srv_answer(std::vector<std::uint32_t> ttls) {
  message m;
  m.u16(0x1234);
  m.u16(0x8400);
  m.u16(1);
  m.u16(static_cast<unsigned>(ttls.size()));
  m.u16(0);
  m.u16(0);
  m.name("_acc._tcp.masters.test");
  m.u16(33);
  m.u16(1);
  for (std::size_t i = 0; i < ttls.size(); ++i) m.srv(ttls[i], "m" + std::to_string(i) + ".masters.test");
  return m;
}

}  // namespace

TEST(DnsAnswer, TheSmallestTtlOfTheAnswerRecords) {
  EXPECT_EQ(dns::answer_ttl(srv_answer({30}).bytes), 30u);
  EXPECT_EQ(dns::answer_ttl(srv_answer({30, 5, 3600}).bytes), 5u);
  EXPECT_EQ(dns::answer_ttl(srv_answer({0x80000000u, 60}).bytes), 0u) << "a TTL with the top bit set is 0 (RFC 2181)";
  EXPECT_EQ(dns::answer_ttl(srv_answer({}).bytes), std::nullopt) << "no answer records";
}

TEST(DnsAnswer, EveryTruncationIsRefusedAndNothingIsReadPastTheEnd) {
  const auto whole = srv_answer({30, 5}).bytes;
  for (std::size_t n = 0; n < whole.size(); ++n) {
    const std::vector<unsigned char> cut(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(dns::answer_ttl(cut), std::nullopt) << n << " of " << whole.size() << " bytes";
  }
  auto extended = srv_answer({30}).bytes;  // a label type that does not exist (0x40)
  extended[12] = 0x45;
  EXPECT_EQ(dns::answer_ttl(extended), std::nullopt);
  std::vector<unsigned char> endless(12, 0);  // a question of 128 one-byte labels: longer than any name
  endless[5] = 1;
  endless[7] = 1;
  for (int i = 0; i < 200; ++i) endless.insert(endless.end(), {1, 'a'});
  EXPECT_EQ(dns::answer_ttl(endless), std::nullopt);
}
