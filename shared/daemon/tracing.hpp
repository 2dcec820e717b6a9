// Optional OpenTelemetry traces (trace_endpoint): spans exported as OTLP
// over HTTP with the JSON encoding (the OTLP specification's "OTLP/HTTP",
// Content-Type application/json) to a collector.
//
// What a daemon records is small and rare -- the proxy a span per held or
// refused request, the master a span per decision that throttled -- so the
// request's thread only fills a span and hands it over (a mutex and a move);
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
#include <string>
#include <string_view>
#include <thread>
#include <variant>
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

using attribute_value = std::variant<std::string, std::int64_t>;
/// A key is a literal of the code (static storage: nothing to copy per span;
/// a dotted name: nothing to escape in JSON).
struct attribute {
  std::string_view key;
  attribute_value value;
};

struct span {
  trace_id trace{};
  span_id id{};
  std::optional<span_id> parent;
  std::string name;
  int kind = 1;                           ///< OTLP SpanKind: 1 internal, 2 server
  std::int64_t start_ns = 0, end_ns = 0;  ///< Unix time
  std::vector<attribute> attributes;
  bool error = false;  ///< status code 2 (ERROR); else unset
};

/// One ExportTraceServiceRequest (OTLP/JSON: ids as lowercase hex, 64-bit
/// integers as decimal strings, enums as numbers) for `service`.
std::string encode_json(const std::vector<span>& spans, std::string_view service, std::string_view version);

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
  /// Queues a span (dropped and counted when the queue is full). Thread-safe.
  void submit(span s);
  /// New random ids (never all zeros).
  static trace_id new_trace_id();
  static span_id new_span_id();

private:
  void run();
  bool post(const std::string& body);

  options opt_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<span> queue_;
  bool stop_ = false;
  metrics::counter& exported_;
  metrics::counter& dropped_;
  metrics::counter& failed_;
  std::thread thread_;
};

/// Unix time in nanoseconds from the wall clock in microseconds.
inline std::int64_t unix_ns(std::int64_t wall_us) { return wall_us * 1000; }
/// The 16 hex digits of a stable 64-bit hash of `identifier`: a span names
/// whom it is about without carrying the identifier (a pseudonym: a guessable
/// identifier, an IP address say, can be found from it).
std::string identifier_hash(std::string_view identifier);

}  // namespace smockron::tracing
