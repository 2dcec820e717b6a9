// W3C traceparent (a request header: anyone's bytes) and OTLP/JSON strings:
// parsing never crashes, a parsed traceparent has non-zero ids and formats
// back to the text it came from (version 00), and any text a span carries
// (what fits of it) encodes to JSON that keeps it (checked by decoding the
// escapes back); a collector's answer head is read without crashing.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_frames.hpp"
#include "shared/daemon/tracing.hpp"

using namespace smockron;

namespace {
std::string hex(const std::uint8_t* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

// The JSON string starting at `at` (its opening quote), escapes decoded; npos at the end when malformed.
std::string unescape(std::string_view json, std::size_t& at) {
  std::string out;
  FUZZ_CHECK(json[at] == '"');
  for (++at; at < json.size() && json[at] != '"'; ++at) {
    if (json[at] != '\\') {
      out += json[at];
      continue;
    }
    const char e = json[++at];
    if (e == 'u') {
      out += static_cast<char>(std::stoi(std::string(json.substr(at + 1, 4)), nullptr, 16));
      at += 4;
    } else {
      FUZZ_CHECK(e == '"' || e == '\\');
      out += e;
    }
  }
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (const auto c = tracing::parse_traceparent(text)) {
    const std::string again = std::string(text.substr(0, 3)) + hex(c->trace.data(), 16) + "-" +
                              hex(c->parent.data(), 8) + "-" + std::string(text.substr(53, 2));
    FUZZ_CHECK(std::string_view(again) == text.substr(0, 55));
    FUZZ_CHECK(text.substr(0, 2) != "ff");
  }
  tracing::span s;
  s.trace = tracing::exporter::new_trace_id();
  s.id = tracing::exporter::new_span_id();
  s.name = "smockron.fuzz";
  s.add("smockron.text", text);  // what fits of it (text_capacity), cut between characters
  const std::string_view kept = s.text(s.attributes()[0]);
  FUZZ_CHECK(text.starts_with(kept));
  const std::string json = tracing::encode_json({&s, 1}, "svc", "1");
  const std::size_t value = json.find("\"stringValue\":", json.find("\"spans\""));
  FUZZ_CHECK(value != std::string::npos);
  std::size_t at = value + 14;
  FUZZ_CHECK(unescape(json, at) == kept);
  // The same bytes as a collector's answer: its head read within its bounds, a length only with a 2xx or not.
  const tracing::answer_head answer = tracing::read_answer_head(text);
  FUZZ_CHECK(!answer.ok || text.starts_with("HTTP/1."));
  FUZZ_CHECK(!answer.length || text.starts_with("HTTP/1.1"));
  for (const char c : json) FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20);
  return 0;
}
