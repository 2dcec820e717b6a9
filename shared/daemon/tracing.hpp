// Optional OpenTelemetry traces (trace_endpoint): spans exported as OTLP
// over HTTP with the JSON encoding (the OTLP specification's "OTLP/HTTP",
// Content-Type application/json) to a collector.
//
// What a daemon records is small and rare -- the proxy a span per held or
// refused request, the master a span per decision that throttled -- so the
// request's thread only fills a span of fixed size and copies it into the
// queue under a mutex (no allocation);
// one thread of the exporter batches them, encodes JSON and POSTs, never on
// the request's path. The queue is bounded (trace_max_queued): a span that
// does not fit is dropped and counted, as is a batch the collector refused
// or did not answer (no retry: traces are best effort, memory is bounded).
//
// W3C Trace Context: a request's `traceparent` is continued (its trace id,
// its span as the parent, its sampled flag decides); a request without one
// starts a trace, sampled at trace_sample.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shared/base/metrics.hpp"
#include "shared/base/net.hpp"
#include "shared/config/config.hpp"

namespace smockron::tracing {

using trace_id = std::array<std::uint8_t, 16>;
using span_id = std::array<std::uint8_t, 8>;

/// A request's place in a trace (W3C Trace Context, `traceparent`).
struct context {
  trace_id trace{};
  span_id parent{};  ///< the caller's span
  bool sampled = false;
};
/// "00-<32 hex>-<16 hex>-<2 hex flags>" (version 00, or a later version's
/// first four fields); nothing when malformed, or an id is all zeros.
std::optional<context> parse_traceparent(std::string_view value);

/// A span as the daemons record it: fixed in size and free of allocation, so
/// the request's thread fills one on its stack and copies it into the
/// exporter's queue (a few hundred bytes, one memcpy). The name and the
/// attributes' keys are literals of the code (static storage; dotted names:
/// nothing to escape in JSON); text values are copied into the span, up to
/// text_capacity bytes in all: a longer value is cut at a UTF-8 character
/// boundary, as OpenTelemetry SDKs cut values past their attribute length
/// limit. The code adds at most max_attributes to a span; more are ignored.
class span {
public:
  static constexpr std::size_t max_attributes = 8;
  static constexpr std::size_t text_capacity = 160;

  /// An attribute: an integer, a text (in the span's text; a literal: one of
  /// the code's, nothing in it to escape) or a 64-bit hash (written as 16 hex
  /// digits, e.g. a pseudonym of an identifier).
  struct attribute {
    enum class type : std::uint8_t { integer, text, literal, hash };
    std::string_view key;
    type kind;
    std::uint16_t at, size;  ///< text: where in the span's text; literal: its size
    union {
      std::int64_t number;  ///< integer; hash: its bits
      const char* chars;    ///< literal: its characters (static storage: not copied)
    };
  };

  trace_id trace{};
  span_id id{};
  std::optional<span_id> parent;
  std::string_view name;                  ///< a literal of the code
  int kind = 1;                           ///< OTLP SpanKind: 1 internal, 2 server
  std::int64_t start_ns = 0, end_ns = 0;  ///< Unix time
  bool error = false;                     ///< status code 2 (ERROR); else unset

  void add(std::string_view key, std::int64_t value) { push(key, attribute::type::integer, 0, 0)->number = value; }
  /// A text, copied (up to what is left of text_capacity).
  void add(std::string_view key, std::string_view text);
  /// A text of the code's own, in static storage (not copied): no quote,
  /// backslash or control character in it, at most 65535 bytes.
  void add_literal(std::string_view key, std::string_view text) {
    push(key, attribute::type::literal, 0, static_cast<std::uint16_t>(text.size()))->chars = text.data();
  }
  void add_hash(std::string_view key, std::uint64_t hash) {
    push(key, attribute::type::hash, 0, 0)->number = static_cast<std::int64_t>(hash);
  }
  std::span<const attribute> attributes() const { return {attributes_.data(), count_}; }
  /// A text or literal attribute's value.
  std::string_view text(const attribute& a) const {
    return {a.kind == attribute::type::literal ? a.chars : text_.data() + a.at, a.size};
  }

private:
  /// The next attribute, its value left to the caller (a scratch one past max_attributes: ignored).
  attribute* push(std::string_view key, attribute::type t, std::uint16_t at, std::uint16_t size) {
    attribute& a = count_ < max_attributes ? attributes_[count_++] : ignored_;
    a.key = key;
    a.kind = t;
    a.at = at;
    a.size = size;
    return &a;
  }
  std::uint8_t count_ = 0;
  std::uint16_t text_used_ = 0;
  // All set (zeros beyond what was added), so that copying a span copies no indeterminate value.
  std::array<attribute, max_attributes> attributes_{};
  std::array<char, text_capacity> text_{};
  attribute ignored_{};  // where an attribute past max_attributes goes
};

/// One ExportTraceServiceRequest (OTLP/JSON: ids as lowercase hex, 64-bit
/// integers as decimal strings, enums as numbers) for `service`.
std::string encode_json(std::span<const span> spans, std::string_view service, std::string_view version);

class exporter {
public:
  struct options {
    http_url to;          ///< the collector's OTLP/HTTP traces URL
    std::string service;  ///< service.name: "smockron-proxy", "smockron-master"
    double sample = 1.0;  ///< a trace started here is recorded with this probability
    std::size_t max_queued = 10'000;
    std::chrono::milliseconds interval{1000};  ///< a batch leaves at least this often
    std::size_t max_batch = 512;
    std::chrono::milliseconds timeout{2000};  ///< connect + write + answer, per batch
  };
  /// `prefix`: the metrics' ("smockron_proxy" / "smockron_master").
  exporter(options o, metrics::registry& reg, std::string_view prefix);
  /// The exporter a daemon's trace_* keys ask for (`service`: its name); null when traces are off.
  static std::unique_ptr<exporter> from_config(const config::trace_config& c, std::string service,
                                               metrics::registry& reg, std::string_view prefix);
  ~exporter();  ///< sends what is queued (bounded by the timeout), then stops
  exporter(const exporter&) = delete;
  exporter& operator=(const exporter&) = delete;

  /// Whether a span for a request in `parent`'s trace (none: a new trace) is recorded.
  bool sampled(const std::optional<context>& parent);
  /// Queues a copy of `s` (dropped and counted when the queue is full). Thread-safe.
  void submit(const span& s);
  /// New random ids (never all zeros).
  static trace_id new_trace_id();
  static span_id new_span_id();

private:
  void run();
  bool post(std::string_view body);

  options opt_;
  std::mutex mutex_;
  std::condition_variable cv_;
  // Spans wait in queue_ (at most max_queued); the exporter swaps it with an
  // empty vector and sends what it took in batches of max_batch. Both keep
  // their capacity: no allocation per span once the first batches have gone.
  std::vector<span> queue_;
  bool stop_ = false;
  metrics::counter& exported_;
  metrics::counter& dropped_;
  metrics::counter& failed_;
  int connection_ = -1;  ///< to the collector, kept from one POST to the next (the exporter's thread); -1: none
  std::thread thread_;
};

/// What the head of a collector's answer (its status line and fields, up to
/// the blank line) says: a 2xx status, and the body's length when
/// Content-Length alone frames it on a connection that may carry the next
/// POST (HTTP/1.1, no "Connection: close", no Transfer-Encoding, one valid
/// Content-Length); nothing otherwise: the connection ends with the answer.
struct answer_head {
  bool ok = false;
  std::optional<std::size_t> length;
};
answer_head read_answer_head(std::string_view head);

/// Unix time in nanoseconds from the wall clock in microseconds.
inline std::int64_t unix_ns(std::int64_t wall_us) { return wall_us * 1000; }
/// A stable 64-bit hash of `identifier` (span::add_hash): a span names whom
/// it is about without carrying the identifier (a pseudonym: a guessable
/// identifier, an IP address say, can be found from it).
std::uint64_t identifier_hash(std::string_view identifier);

}  // namespace smockron::tracing
