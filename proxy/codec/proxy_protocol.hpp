// The PROXY protocol header (HAProxy's spec, versions 1 and 2) that a load
// balancer in front (AWS NLB, HAProxy, ...) sends first on each connection,
// naming the client it accepted. Pure: bytes in, the client address out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "shared/base/net.hpp"

namespace smockron::proxy::proxy_protocol {

/// Version 1 is one line of at most 107 bytes; version 2 is a 16-byte
/// header and its announced length.
inline constexpr std::size_t v1_max_bytes = 107;
inline constexpr std::size_t v2_header_bytes = 16;

enum class status : std::uint8_t { incomplete, complete, invalid };

struct result {
  status state = status::incomplete;
  std::size_t consumed = 0;          ///< header bytes, when complete
  std::optional<ip_address> source;  ///< the client; none: keep the socket peer (LOCAL, UNKNOWN, AF_UNIX)
  std::uint16_t source_port = 0;
  std::string_view reason;  ///< why invalid (static text)
};

/// Parses the header at the start of `data`. `max_bytes` bounds a version 2
/// header with its TLVs (a longer one is invalid); incomplete means more bytes
/// are needed, and is only returned while `data` could still begin a valid header.
result parse(std::string_view data, std::size_t max_bytes);

}  // namespace smockron::proxy::proxy_protocol
