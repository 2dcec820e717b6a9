// Splits fuzzer input into message frames: each frame is one length byte
// followed by that many bytes (a cut-short last frame takes what is left), so
// the fuzzer explores frame counts and contents independently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace smockron::fuzz {

inline std::vector<std::string_view> frames(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string_view> out;
  const char* p = reinterpret_cast<const char*>(data);
  while (size > 0 && out.size() < 10) {
    const std::size_t n = std::min<std::size_t>(static_cast<std::uint8_t>(*p), size - 1);
    out.emplace_back(p + 1, n);
    p += 1 + n;
    size -= 1 + n;
  }
  return out;
}

// Fails loudly (libFuzzer reports the input) when a property does not hold.
#define FUZZ_CHECK(cond)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      __builtin_printf("%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                         \
    }                                                                           \
  } while (0)

}  // namespace smockron::fuzz
