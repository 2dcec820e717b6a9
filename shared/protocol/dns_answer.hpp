// The one thing c-ares 1.18 does not tell about an SRV answer: how long it
// may be used. answer_ttl() reads it from the DNS message (RFC 1035 4.1):
// the smallest TTL of the answer section's records. It reads untrusted bytes
// (whatever a DNS server sent), bounds every read and never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace smockron::dns {

/// The smallest TTL (seconds) among the answer records of the DNS message
/// `msg`; nullopt when it is malformed or has no answer records.
std::optional<std::uint32_t> answer_ttl(std::span<const unsigned char> msg);

}  // namespace smockron::dns
