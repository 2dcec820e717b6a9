// The chunked decoder fed in arbitrary splits: never crashes, and decides and
// decodes exactly as when fed everything at once (payload, end, error).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_frames.hpp"
#include "proxy/codec/http1.hpp"

using namespace smockron::proxy;

namespace {
struct outcome {
  std::string payload;
  std::size_t consumed = 0;
  bool done = false, failed = false;
};

// Feeds `in` in pieces of the given sizes (cycled; 0 means "the rest").
outcome run(std::string_view in, std::string_view sizes) {
  http1::chunked_decoder dec(64);
  outcome o;
  std::size_t k = 0;
  while (o.consumed < in.size() && !o.done && !o.failed) {
    std::size_t piece = sizes.empty() ? 0 : static_cast<std::uint8_t>(sizes[k++ % sizes.size()]);
    if (piece == 0 || piece > in.size() - o.consumed) piece = in.size() - o.consumed;
    std::string_view window = in.substr(o.consumed, piece);
    while (!window.empty() && !o.done) {
      std::string_view run_data;
      const auto n = dec.feed(window, run_data);
      if (!n) {
        o.failed = true;
        break;
      }
      // Progress on every call with bytes, and the data run is inside what was consumed.
      FUZZ_CHECK(*n > 0 && *n <= window.size());
      FUZZ_CHECK(run_data.empty() ||
                 (run_data.data() >= window.data() && run_data.data() + run_data.size() <= window.data() + *n));
      o.payload.append(run_data);
      window.remove_prefix(*n);
      o.consumed += *n;
      o.done = dec.done();
    }
  }
  return o;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t n_sizes = std::min<std::size_t>(data[0] % 8, size - 1);
  const std::string_view sizes(reinterpret_cast<const char*>(data) + 1, n_sizes);
  const std::string_view body(reinterpret_cast<const char*>(data) + 1 + n_sizes, size - 1 - n_sizes);
  const outcome whole = run(body, {});
  const outcome split = run(body, sizes);
  FUZZ_CHECK(whole.failed == split.failed);
  FUZZ_CHECK(whole.done == split.done);
  if (!whole.failed) {
    FUZZ_CHECK(whole.payload == split.payload);
    FUZZ_CHECK(whole.consumed == split.consumed);
  }
  return 0;
}
