// The TTL of a DNS answer on arbitrary bytes (what any DNS server may send),
// differential against c-ares: wherever c-ares parses an SRV answer with
// records, answer_ttl() finds a TTL, and it is never above 2^31 - 1.
#include <ares.h>

#include <cstdint>
#include <span>

#include "fuzz_frames.hpp"
#include "shared/protocol/dns_answer.hpp"

using namespace smockron;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto ttl = dns::answer_ttl(std::span<const unsigned char>(data, size));
  if (ttl) FUZZ_CHECK(*ttl <= 0x7fffffffu);
  ares_srv_reply* reply = nullptr;
  if (size <= 65535 && ares_parse_srv_reply(data, static_cast<int>(size), &reply) == ARES_SUCCESS) {
    if (reply) FUZZ_CHECK(ttl.has_value());
    ares_free_data(reply);
  }
  return 0;
}
