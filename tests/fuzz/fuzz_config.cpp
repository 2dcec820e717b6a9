// Configuration loading (what --check runs) on arbitrary text: never crashes;
// a configuration it accepts is accepted again (loading is deterministic).
#include <cstdint>
#include <string_view>

#include "fuzz_frames.hpp"
#include "shared/config/config.hpp"

using namespace smockron;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto r = config::load_string(text, "fuzz");
  if (r.cfg) FUZZ_CHECK(config::load_string(text, "fuzz").cfg.has_value());
  return 0;
}
