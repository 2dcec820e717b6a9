// OpenTelemetry spans over OTLP/HTTP JSON (see tracing.hpp).
#include "shared/daemon/tracing.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <random>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "shared/base/log.hpp"
#include "shared/protocol/hash_ring.hpp"
#include "smockron/version.hpp"

namespace smockron::tracing {

namespace {

constexpr char k_hex[] = "0123456789abcdef";

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // W3C: lowercase only
}

template <std::size_t N>
bool unhex(std::string_view text, std::array<std::uint8_t, N>& out) {
  if (text.size() != 2 * N) return false;
  bool zero = true;
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = hex_digit(text[2 * i]), lo = hex_digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
    zero = zero && out[i] == 0;
  }
  return !zero;  // an all-zero id is invalid
}

/// This thread's generator of ids: SplitMix64 (Steele, Lea, Flood 2014), seeded
/// from the system's entropy. W3C Trace Context asks for random ids, not
/// unpredictable ones; this costs a few instructions per 64 bits.
thread_local std::uint64_t random_state = 0;  // constant-initialized: no guard on each use; 0: not seeded

[[gnu::noinline]] void seed_random() {
  do random_state = std::uint64_t{std::random_device{}()} << 32 ^ std::random_device{}();
  while (random_state == 0);
}

inline std::uint64_t next_random() {
  if (random_state == 0) [[unlikely]]
    seed_random();
  std::uint64_t z = (random_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <std::size_t N>
std::array<std::uint8_t, N> random_id() {
  static_assert(N % 8 == 0);
  std::array<std::uint8_t, N> id;
  std::uint64_t any = 0;
  do {
    for (std::size_t i = 0; i < N; i += 8) {
      const std::uint64_t v = next_random();
      std::memcpy(id.data() + i, &v, 8);
      any |= v;
    }
  } while (any == 0);  // all zeros is not an id
  return id;
}

}  // namespace

std::optional<context> parse_traceparent(std::string_view v) {
  // version "-" trace-id "-" parent-id "-" flags; a later version may append "-..." fields.
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  std::array<std::uint8_t, 1> version{}, flags{};
  const auto byte = [](std::string_view t, std::uint8_t& out) {
    const int hi = hex_digit(t[0]), lo = hex_digit(t[1]);
    if (hi < 0 || lo < 0) return false;
    out = static_cast<std::uint8_t>(hi << 4 | lo);
    return true;
  };
  if (!byte(v.substr(0, 2), version[0]) || version[0] == 0xff) return std::nullopt;
  if (version[0] == 0 && v.size() != 55) return std::nullopt;
  if (version[0] != 0 && v.size() > 55 && v[55] != '-') return std::nullopt;
  context c;
  if (!unhex(v.substr(3, 32), c.trace) || !unhex(v.substr(36, 16), c.parent) || !byte(v.substr(53, 2), flags[0]))
    return std::nullopt;
  c.sampled = (flags[0] & 1) != 0;
  return c;
}

namespace {

/// Copies `n` bytes: a short run (most of what a span holds) by two
/// overlapping moves of a size known when compiled, no call.
[[gnu::always_inline]] inline void copy_bytes(char* to, const char* from, std::size_t n) {
  if (n > 32) {
    std::memcpy(to, from, n);
  } else if (n >= 16) {
    std::memcpy(to, from, 16);
    std::memcpy(to + n - 16, from + n - 16, 16);
  } else if (n >= 8) {
    std::memcpy(to, from, 8);
    std::memcpy(to + n - 8, from + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(to, from, 4);
    std::memcpy(to + n - 4, from + n - 4, 4);
  } else if (n > 0) {
    to[0] = from[0];
    to[n / 2] = from[n / 2];
    to[n - 1] = from[n - 1];
  }
}

}  // namespace

void span::add(std::string_view key, std::string_view value) {
  std::size_t n = std::min(value.size(), text_capacity - text_used_);
  // Cut before a UTF-8 continuation byte (10xxxxxx): a character whole or not at all.
  if (n < value.size())
    while (n > 0 && (static_cast<unsigned char>(value[n]) & 0xc0) == 0x80) --n;
  copy_bytes(text_.data() + text_used_, value.data(), n);
  push(key, attribute::type::text, text_used_, static_cast<std::uint16_t>(n));
  text_used_ = static_cast<std::uint16_t>(text_used_ + n);
}

namespace {

// JSON by hand: a span is a dozen short fields, and a general JSON library
// spent about 100,000 instructions on each (callgrind), more than a refused
// request costs the proxy. Each span is written through a raw pointer into
// room made for its worst case (every text byte escaped as \u00XX); the
// buffer is reused from batch to batch, so it is neither allocated nor
// cleared per span. Strings are escaped as RFC 8259 requires (quote,
// backslash, control characters); what the daemons put in them is UTF-8.

/// Bytes written through a pointer into room made first (grown, never shrunk or cleared).
class json_buffer {
public:
  /// Room for `n` more bytes: where to write them.
  char* room(std::size_t n) {
    if (bytes_.size() < size_ + n) bytes_.resize(std::max(size_ + n, 2 * bytes_.size()));
    return bytes_.data() + size_;
  }
  /// What was written ends at `end` (in the room last made).
  void wrote(const char* end) { size_ = static_cast<std::size_t>(end - bytes_.data()); }
  std::string_view view() const { return {bytes_.data(), size_}; }
  void clear() { size_ = 0; }

private:
  std::string bytes_;
  std::size_t size_ = 0;
};

/// "00" .. "99": two decimal digits at once.
constexpr std::array<std::array<char, 2>, 100> k_digit_pairs = [] {
  std::array<std::array<char, 2>, 100> t{};
  for (std::size_t i = 0; i < 100; ++i) t[i] = {static_cast<char>('0' + i / 10), static_cast<char>('0' + i % 10)};
  return t;
}();

/// Whether `v` has nothing JSON must escape (a quote, a backslash, a control
/// character): eight bytes at a time ("Bit Twiddling Hacks": a byte below
/// 0x20, a byte equal to '"' or '\\' sets its top bit in the test).
bool plain(std::string_view v) {
  constexpr std::uint64_t ones = 0x0101010101010101ULL, tops = 0x8080808080808080ULL;
  const auto flagged = [&](std::uint64_t x) {
    const std::uint64_t quote = x ^ (ones * '"'), backslash = x ^ (ones * '\\');
    return (((x - ones * 0x20) & ~x) | ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash)) & tops;
  };
  const std::size_t n = v.size();
  if (n < 8) {
    for (const char c : v)
      if (static_cast<unsigned char>(c) < 0x20 || c == '"' || c == '\\') return false;
    return true;
  }
  std::uint64_t x = 0;
  for (std::size_t i = 0; i + 8 < n; i += 8) {
    std::memcpy(&x, v.data() + i, 8);
    if (flagged(x) != 0) return false;
  }
  std::memcpy(&x, v.data() + n - 8, 8);  // the last 8 (overlapping what was checked)
  return flagged(x) == 0;
}

/// The digits of the last timestamp's top part (its value / 10^8, a tenth of a
/// second): the spans of a batch mostly share it, so most timestamps cost
/// their last 8 digits only.
struct timestamp_digits {
  std::uint64_t high = ~std::uint64_t{0};
  std::array<char, 12> digits{};  // at most 11: 2^63 / 10^8 < 10^11
  std::size_t size = 0;
};

struct writer {
  char* p;
  timestamp_digits* last = nullptr;  ///< timestamp(): what the last one began with
  /// A literal: its size known when compiled (a few moves, no call).
  template <std::size_t N>
  void lit(const char (&v)[N]) {
    std::memcpy(p, v, N - 1);
    p += N - 1;
  }
  void raw(std::string_view v) {
    copy_bytes(p, v.data(), v.size());
    p += v.size();
  }
  void str(std::string_view v) {
    if (plain(v)) {
      *p++ = '"';
      raw(v);
      *p++ = '"';
      return;
    }
    escaped(v);
  }
  void escaped(std::string_view v) {
    *p++ = '"';
    for (const char c : v) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && c != '"' && c != '\\') {
        *p++ = c;
      } else if (u < 0x20) {
        lit("\\u00");
        *p++ = k_hex[u >> 4];
        *p++ = k_hex[u & 15];
      } else {
        *p++ = '\\';
        *p++ = c;
      }
    }
    *p++ = '"';
  }
  void integer(std::int64_t v) {
    if (v < 0) {
      *p++ = '-';
      digits(0 - static_cast<std::uint64_t>(v));
    } else {
      digits(static_cast<std::uint64_t>(v));
    }
  }
  /// `v` in decimal: 8 digits at a time in 32-bit arithmetic, two at a time from a table.
  void digits(std::uint64_t v) {
    if (v < 100'000'000) return lead(static_cast<std::uint32_t>(v));
    const std::uint64_t high = v / 100'000'000;
    if (high < 100'000'000) {
      lead(static_cast<std::uint32_t>(high));
    } else {
      lead(static_cast<std::uint32_t>(high / 100'000'000));
      eight(static_cast<std::uint32_t>(high % 100'000'000));
    }
    eight(static_cast<std::uint32_t>(v % 100'000'000));
  }
  /// A Unix time in nanoseconds (not negative), its top digits from `last` when they are the same.
  void timestamp(std::int64_t ns) {
    const auto v = static_cast<std::uint64_t>(std::max<std::int64_t>(ns, 0));
    const std::uint64_t high = v / 100'000'000;
    if (high == 0) return digits(v);
    if (high != last->high) {
      char* at = p;
      digits(high);
      last->high = high;
      last->size = static_cast<std::size_t>(p - at);
      std::memcpy(last->digits.data(), at, last->size);
    } else {
      copy_bytes(p, last->digits.data(), last->size);
      p += last->size;
    }
    eight(static_cast<std::uint32_t>(v % 100'000'000));
  }
  /// Up to 8 digits (v < 10^8), without leading zeros: written from the last.
  void lead(std::uint32_t v) {
    const int n = v < 10'000      ? (v < 100 ? (v < 10 ? 1 : 2) : (v < 1'000 ? 3 : 4))
                  : v < 1'000'000 ? (v < 100'000 ? 5 : 6)
                                  : (v < 10'000'000 ? 7 : 8);
    p += n;
    char* q = p;
    while (v >= 100) {
      q -= 2;
      std::memcpy(q, k_digit_pairs[v % 100].data(), 2);
      v /= 100;
    }
    if (v >= 10) std::memcpy(q - 2, k_digit_pairs[v].data(), 2);
    else q[-1] = static_cast<char>('0' + v);
  }
  /// Exactly 8 digits (v < 10^8).
  void eight(std::uint32_t v) {
    const std::uint32_t high = v / 10'000, low = v % 10'000;
    std::memcpy(p, k_digit_pairs[high / 100].data(), 2);
    std::memcpy(p + 2, k_digit_pairs[high % 100].data(), 2);
    std::memcpy(p + 4, k_digit_pairs[low / 100].data(), 2);
    std::memcpy(p + 6, k_digit_pairs[low % 100].data(), 2);
    p += 8;
  }
  /// An id as a quoted string of lowercase hex digits.
  template <std::size_t N>
  void hex(const std::array<std::uint8_t, N>& bytes) {
    static_assert(N % 8 == 0);
    *p++ = '"';
    for (std::size_t i = 0; i < N; i += 8) hex_eight(bytes.data() + i);
    *p++ = '"';
  }
  void hex64(std::uint64_t v) {
    std::array<std::uint8_t, 8> bytes{};
    for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<std::uint8_t>(v >> (56 - 8 * i));
    hex(bytes);
  }
  /// 8 bytes as 16 hex digits.
  void hex_eight(const std::uint8_t* bytes) {
#if defined(__SSE2__)
    // All 16 nibbles at once (SSE2 is part of x86-64): high and low nibbles
    // interleaved in output order, then '0' + n, plus 39 more where n > 9 ('a' + n - 10).
    const __m128i in = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(in, 4), nibble), _mm_and_si128(in, nibble));
    const __m128i letters = _mm_and_si128(_mm_cmpgt_epi8(n, _mm_set1_epi8(9)), _mm_set1_epi8('a' - '0' - 10));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_add_epi8(_mm_add_epi8(n, _mm_set1_epi8('0')), letters));
    p += 16;
#else
    static constexpr auto pairs = [] {  // "00" .. "ff"
      std::array<std::array<char, 2>, 256> t{};
      for (std::size_t i = 0; i < 256; ++i) t[i] = {k_hex[i >> 4], k_hex[i & 15]};
      return t;
    }();
    for (std::size_t i = 0; i < 8; ++i, p += 2) std::memcpy(p, pairs[bytes[i]].data(), 2);
#endif
  }
  /// A key is one of the code's literals (dotted names: nothing to escape).
  void key(std::string_view k) {
    lit("{\"key\":\"");
    raw(k);
  }
  void attribute(const span& s, const span::attribute& a) {
    key(a.key);
    switch (a.kind) {
      case span::attribute::type::text:
        lit("\",\"value\":{\"stringValue\":");
        str(s.text(a));
        break;
      case span::attribute::type::literal:
        lit("\",\"value\":{\"stringValue\":\"");
        raw(s.text(a));
        *p++ = '"';
        break;
      case span::attribute::type::hash:
        lit("\",\"value\":{\"stringValue\":");
        hex64(static_cast<std::uint64_t>(a.number));
        break;
      case span::attribute::type::integer:
        lit("\",\"value\":{\"intValue\":\"");  // OTLP/JSON: 64-bit integers as decimal strings
        integer(a.number);
        *p++ = '"';
        break;
    }
    lit("}}");
  }
};

/// The most bytes `s` can take as JSON: its texts fully escaped, and the fixed text.
std::size_t worst_case(const span& s) {
  std::size_t n = 256 + s.name.size() + 6 * span::text_capacity;  // ids, times, status; every text byte escaped
  for (const auto& a : s.attributes()) {
    n += 64 + a.key.size();  // the attribute's own text, a number or a hash
    if (a.kind == span::attribute::type::literal) n += a.size;
  }
  return n;
}

/// Appends `s` as OTLP/JSON (after a comma: not the batch's first).
void append_span(json_buffer& out, const span& s, bool comma, timestamp_digits& last) {
  writer w{out.room(worst_case(s)), &last};
  if (comma) *w.p++ = ',';
  w.lit("{\"traceId\":");
  w.hex(s.trace);
  w.lit(",\"spanId\":");
  w.hex(s.id);
  if (s.parent) {
    w.lit(",\"parentSpanId\":");
    w.hex(*s.parent);
  }
  w.lit(",\"name\":\"");
  w.raw(s.name);
  w.lit("\",\"kind\":");
  w.integer(s.kind);
  w.lit(",\"startTimeUnixNano\":\"");
  w.timestamp(s.start_ns);
  w.lit("\",\"endTimeUnixNano\":\"");
  w.timestamp(s.end_ns);
  w.lit("\",\"attributes\":[");
  bool first = true;
  for (const auto& a : s.attributes()) {
    if (!first) *w.p++ = ',';
    first = false;
    w.attribute(s, a);
  }
  if (s.error) w.lit("],\"status\":{\"code\":2}}");
  else w.lit("]}");  // status unset: left out (its default)
  out.wrote(w.p);
}

/// Appends an ExportTraceServiceRequest of `spans`.
void append_request(json_buffer& out, std::span<const span> spans, std::string_view service, std::string_view version) {
  writer w{out.room(256 + 6 * (service.size() + 2 * version.size()))};
  w.lit("{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
  w.key("service.name");
  w.lit("\",\"value\":{\"stringValue\":");
  w.str(service);
  w.lit("}},");
  w.key("service.version");
  w.lit("\",\"value\":{\"stringValue\":");
  w.str(version);
  w.lit("}}]},\"scopeSpans\":[{\"scope\":{\"name\":\"smockron\",\"version\":");
  w.str(version);
  w.lit("},\"spans\":[");
  out.wrote(w.p);
  timestamp_digits last;
  for (std::size_t i = 0; i < spans.size(); ++i) append_span(out, spans[i], i > 0, last);
  w.p = out.room(8);
  w.lit("]}]}]}");
  out.wrote(w.p);
}

}  // namespace

std::string encode_json(std::span<const span> spans, std::string_view service, std::string_view version) {
  json_buffer out;
  append_request(out, spans, service, version);
  return std::string(out.view());
}

std::uint64_t identifier_hash(std::string_view identifier) { return stable_hash(identifier); }

trace_id exporter::new_trace_id() { return random_id<16>(); }
span_id exporter::new_span_id() { return random_id<8>(); }

exporter::exporter(options o, metrics::registry& reg, std::string_view prefix)
    : opt_(std::move(o)),
      exported_(reg.add_counter(std::string(prefix) + "_trace_spans_total",
                                "Trace spans, by what became of them (exported: the collector took them; dropped: "
                                "the queue was full; failed: the collector refused or did not answer)",
                                metrics::labels({{"result", "exported"}}))),
      dropped_(
          reg.add_counter(std::string(prefix) + "_trace_spans_total", "", metrics::labels({{"result", "dropped"}}))),
      failed_(
          reg.add_counter(std::string(prefix) + "_trace_spans_total", "", metrics::labels({{"result", "failed"}}))) {
  thread_ = std::thread([this] { run(); });
}

std::unique_ptr<exporter> exporter::from_config(const config::trace_config& c, std::string service,
                                                metrics::registry& reg, std::string_view prefix) {
  if (!c.on()) return nullptr;
  return std::make_unique<exporter>(
      options{.to = c.to,
              .service = std::move(service),
              .sample = c.sample,
              .max_queued = static_cast<std::size_t>(c.max_queued),
              .interval = std::chrono::duration_cast<std::chrono::milliseconds>(c.interval)},
      reg, prefix);
}

exporter::~exporter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (connection_ >= 0) ::close(connection_);
}

bool exporter::sampled(const std::optional<context>& parent) {
  if (parent) return parent->sampled;  // the caller decided for its whole trace
  if (opt_.sample >= 1.0) return true;
  // The top 53 bits as a double in [0, 1).
  return static_cast<double>(next_random() >> 11) * 0x1.0p-53 < opt_.sample;
}

void exporter::submit(const span& s) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    if (queue_.size() >= opt_.max_queued) {
      dropped_.inc();
      return;
    }
    queue_.push_back(s);
    wake = queue_.size() == opt_.max_batch;
  }
  if (wake) cv_.notify_one();
}

void exporter::run() {
  std::vector<span> taken;
  json_buffer body;
  std::optional<std::chrono::steady_clock::time_point> stopped;
  // Stopping: what is left goes in batches for one timeout at most, the rest is counted as failed.
  const auto out_of_time = [&] { return stopped && std::chrono::steady_clock::now() - *stopped > opt_.timeout; };
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (!stop_) cv_.wait_for(lock, opt_.interval, [&] { return stop_ || queue_.size() >= opt_.max_batch; });
      if (stop_ && !stopped) stopped = std::chrono::steady_clock::now();
      if (stopped && (queue_.empty() || out_of_time())) {
        failed_.inc(queue_.size());
        queue_.clear();
        return;
      }
      taken.swap(queue_);  // queue_ gets taken's room back, empty
    }
    for (std::size_t i = 0; i < taken.size(); i += opt_.max_batch) {
      const std::size_t n = std::min(opt_.max_batch, taken.size() - i);
      if (out_of_time()) {
        failed_.inc(taken.size() - i);
        break;
      }
      body.clear();
      append_request(body, std::span(taken).subspan(i, n), opt_.service, version_string);
      if (post(body.view())) exported_.inc(n);
      else failed_.inc(n);
    }
    taken.clear();
  }
}

namespace {

using steady = std::chrono::steady_clock;

/// Milliseconds left before `deadline` (0 when past it), for poll().
int left_ms(steady::time_point deadline) {
  return static_cast<int>(std::max<std::int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()).count()));
}

/// Waits for `events` on `fd` until `deadline`; true when they (or a hang-up or error) came.
bool wait_for(int fd, short events, steady::time_point deadline) {
  pollfd p{fd, events, 0};
  return ::poll(&p, 1, left_ms(deadline)) == 1 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
}

/// A connection to `to` (each of its addresses in turn: "localhost" may be ::1
/// first and the collector on 127.0.0.1 only), non-blocking; -1 when none.
int connect_to(const http_url& to, steady::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(to.host.c_str(), std::to_string(to.port).c_str(), &hints, &found) != 0 || !found) return -1;
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  for (const addrinfo* a = found; a && left_ms(deadline) > 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!ok && errno == EINPROGRESS) {
      int err = 0;
      socklen_t len = sizeof err;
      ok = wait_for(fd, POLLOUT, deadline) && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    if (ok) return fd;
    ::close(fd);
  }
  return -1;
}

/// Writes `parts` whole (partial writes resumed where they stopped).
bool send_all(int fd, std::array<iovec, 2> parts, steady::time_point deadline) {
  for (std::size_t first = 0;;) {
    while (first < parts.size() && parts[first].iov_len == 0) ++first;
    if (first == parts.size()) return true;
    msghdr m{};
    m.msg_iov = parts.data() + first;
    m.msg_iovlen = parts.size() - first;
    const ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    if (n <= 0) {
      if (!wait_for(fd, POLLOUT, deadline)) return false;
      continue;
    }
    for (auto left = static_cast<std::size_t>(n); left > 0; ++first) {
      const std::size_t used = std::min(left, parts[first].iov_len);
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + used;
      parts[first].iov_len -= used;
      left -= used;
      if (parts[first].iov_len > 0) break;
    }
  }
}

/// What a collector answered a POST.
struct answer {
  bool came = false;  ///< some of an answer came (so the POST reached the collector)
  bool ok = false;    ///< a 2xx status
  bool keep = false;  ///< the connection may carry the next POST: the answer read whole, no "Connection: close"
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

/// Reads the answer to a POST: its status line and fields (16 KiB at most), then
/// its body when Content-Length frames it (64 KiB at most), so that the
/// connection can be used again; any other framing is read no further.
answer read_answer(int fd, steady::time_point deadline) {
  constexpr std::size_t max_head = 16 * 1024, max_body = 64 * 1024;
  answer got;
  std::string in;
  std::size_t head_end = std::string::npos;
  char chunk[4096];
  const auto read_more = [&] {
    for (;;) {
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n > 0) {
        in.append(chunk, static_cast<std::size_t>(n));
        got.came = true;
        return true;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) return false;
      if (!wait_for(fd, POLLIN, deadline)) return false;
    }
  };
  while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
    if (in.size() > max_head || !read_more()) {
      got.ok = read_answer_head(in).ok;  // the status line may be all there is
      return got;
    }
  }
  const answer_head h = read_answer_head(std::string_view(in).substr(0, head_end + 4));
  got.ok = h.ok;
  if (!h.length || *h.length > max_body) return got;
  while (in.size() - (head_end + 4) < *h.length)
    if (!read_more()) return got;
  got.keep = in.size() - (head_end + 4) == *h.length;  // nothing more than the body came
  return got;
}

}  // namespace

answer_head read_answer_head(std::string_view head) {
  answer_head h;
  h.ok = head.size() >= 12 && head.starts_with("HTTP/1.") && head[9] == '2';
  bool close = !head.starts_with("HTTP/1.1");
  std::optional<std::size_t> length;
  const std::size_t first = head.find("\r\n");
  for (std::size_t at = first == std::string_view::npos ? head.size() : first + 2; at < head.size();) {
    std::size_t end = head.find("\r\n", at);
    if (end == std::string_view::npos) end = head.size();
    const std::string_view line = head.substr(at, end - at);
    at = end + 2;
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (iequals(name, "content-length")) {
      std::size_t n = 0;
      const auto r = std::from_chars(value.data(), value.data() + value.size(), n);
      if (r.ec == std::errc{} && r.ptr == value.data() + value.size() && !length) length = n;
      else close = true;  // malformed or repeated
    } else if (iequals(name, "transfer-encoding") || (iequals(name, "connection") && iequals(value, "close"))) {
      close = true;
    }
  }
  if (!close) h.length = length;
  return h;
}

// A POST on the connection kept from the last one, or on a new one; bounded
// by opt_.timeout from the connect to the answer; true for a 2xx answer.
// A kept connection the collector closed while it was idle (or as the POST
// went out, before any answer) costs one more try on a new connection.
bool exporter::post(std::string_view body) {
  const auto deadline = steady::now() + opt_.timeout;
  const auto drop = [this] {
    ::close(connection_);
    connection_ = -1;
  };
  if (connection_ >= 0) {
    // Idle, a kept connection has nothing to read: something (an end, a reset) means it is done.
    pollfd p{connection_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 0) drop();
  }
  const std::string host = opt_.to.host.find(':') != std::string::npos ? "[" + opt_.to.host + "]" : opt_.to.host;
  const std::string head = "POST " + opt_.to.path + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(opt_.to.port) +
                           "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                           "\r\n\r\n";
  for (;;) {
    const bool kept = connection_ >= 0;
    if (!kept && (connection_ = connect_to(opt_.to, deadline)) < 0) return false;
    // The head and the body from where they are (the body is not copied behind the head).
    const bool sent = send_all(
        connection_,
        {iovec{const_cast<char*>(head.data()), head.size()}, iovec{const_cast<char*>(body.data()), body.size()}},
        deadline);
    const answer got = sent ? read_answer(connection_, deadline) : answer{};
    if (!got.keep) drop();
    if (got.came || !kept) return got.ok;
  }
}

}  // namespace smockron::tracing
