// OpenTelemetry spans over OTLP/HTTP JSON (see tracing.hpp).
#include "shared/daemon/tracing.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <random>

#include "shared/base/log.hpp"
#include "shared/protocol/hash_ring.hpp"
#include "smockron/version.hpp"

namespace smockron::tracing {

namespace {

constexpr char k_hex[] = "0123456789abcdef";

template <std::size_t N>
std::string hex(const std::array<std::uint8_t, N>& bytes) {
  std::string out(2 * N, '0');
  for (std::size_t i = 0; i < N; ++i) {
    out[2 * i] = k_hex[bytes[i] >> 4];
    out[2 * i + 1] = k_hex[bytes[i] & 15];
  }
  return out;
}

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

std::mt19937_64& rng() {
  thread_local std::mt19937_64 r{std::random_device{}() ^ (std::uint64_t{std::random_device{}()} << 32)};
  return r;
}

template <std::size_t N>
std::array<std::uint8_t, N> random_id() {
  std::array<std::uint8_t, N> id{};
  do {
    for (std::size_t i = 0; i < N; i += 8) {
      const std::uint64_t v = rng()();
      std::memcpy(id.data() + i, &v, std::min<std::size_t>(8, N - i));
    }
  } while (std::all_of(id.begin(), id.end(), [](std::uint8_t b) { return b == 0; }));
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

// JSON by hand: a span is a dozen short fields, and a general JSON library
// spent about 100,000 instructions on each (callgrind), more than a refused
// request costs the proxy. Each span is written through a raw pointer into
// room reserved for its worst case (every string byte escaped as \u00XX),
// then the string is cut to what was written. Strings are escaped as RFC 8259
// requires (quote, backslash, control characters); what the daemons put in
// them is UTF-8.
struct writer {
  char* p;
  void raw(std::string_view v) {
    std::memcpy(p, v.data(), v.size());
    p += v.size();
  }
  void str(std::string_view v) {
    *p++ = '"';
    // Most strings need no escaping: checked first, then copied at once.
    const bool plain = std::all_of(
        v.begin(), v.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x20 && c != '"' && c != '\\'; });
    if (plain) {
      raw(v);
      *p++ = '"';
      return;
    }
    for (const char c : v) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && c != '"' && c != '\\') {
        *p++ = c;
      } else if (u < 0x20) {
        raw("\\u00");
        *p++ = k_hex[u >> 4];
        *p++ = k_hex[u & 15];
      } else {
        *p++ = '\\';
        *p++ = c;
      }
    }
    *p++ = '"';
  }
  void integer(std::int64_t v) { p = std::to_chars(p, p + 20, v).ptr; }
  template <std::size_t N>
  void hex(const std::array<std::uint8_t, N>& bytes) {
    *p++ = '"';
    for (const std::uint8_t b : bytes) {
      *p++ = k_hex[b >> 4];
      *p++ = k_hex[b & 15];
    }
    *p++ = '"';
  }
  /// A key is one of the code's literals (dotted names: nothing to escape).
  void attribute(std::string_view key, const attribute_value& value) {
    raw("{\"key\":\"");
    raw(key);
    *p++ = '"';
    if (const auto* text = std::get_if<std::string>(&value)) {
      raw(",\"value\":{\"stringValue\":");
      str(*text);
    } else {
      raw(",\"value\":{\"intValue\":\"");  // OTLP/JSON: 64-bit integers as decimal strings
      integer(std::get<std::int64_t>(value));
      *p++ = '"';
    }
    raw("}}");
  }
};

/// The most bytes `s` can take as JSON: its strings fully escaped, and the fixed text.
std::size_t worst_case(const span& s) {
  std::size_t n = 320 + 6 * s.name.size();
  for (const auto& a : s.attributes) {
    n += 64 + 6 * a.key.size();
    if (const auto* text = std::get_if<std::string>(&a.value)) n += 6 * text->size();
  }
  return n;
}

/// Appends `s` as OTLP/JSON to `out`.
void append_span(std::string& out, const span& s) {
  const std::size_t at = out.size();
  out.resize(at + worst_case(s));
  writer w{out.data() + at};
  w.raw("{\"traceId\":");
  w.hex(s.trace);
  w.raw(",\"spanId\":");
  w.hex(s.id);
  if (s.parent) {
    w.raw(",\"parentSpanId\":");
    w.hex(*s.parent);
  }
  w.raw(",\"name\":");
  w.str(s.name);
  w.raw(",\"kind\":");
  w.integer(s.kind);
  w.raw(",\"startTimeUnixNano\":\"");
  w.integer(s.start_ns);
  w.raw("\",\"endTimeUnixNano\":\"");
  w.integer(s.end_ns);
  w.raw("\",\"attributes\":[");
  for (std::size_t k = 0; k < s.attributes.size(); ++k) {
    if (k > 0) *w.p++ = ',';
    w.attribute(s.attributes[k].key, s.attributes[k].value);
  }
  w.raw(s.error ? "],\"status\":{\"code\":2}}" : "],\"status\":{}}");
  out.resize(static_cast<std::size_t>(w.p - out.data()));
}

}  // namespace

std::string encode_json(const std::vector<span>& spans, std::string_view service, std::string_view version) {
  span resource;  // the resource's attributes, written as a span's are
  resource.attributes = {{"service.name", std::string(service)}, {"service.version", std::string(version)}};
  std::string out;
  out.reserve(512 + spans.size() * 640);
  out.resize(worst_case(resource) + 6 * version.size());
  writer w{out.data()};
  w.raw("{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
  w.attribute(resource.attributes[0].key, resource.attributes[0].value);
  *w.p++ = ',';
  w.attribute(resource.attributes[1].key, resource.attributes[1].value);
  w.raw("]},\"scopeSpans\":[{\"scope\":{\"name\":\"smockron\",\"version\":");
  w.str(version);
  w.raw("},\"spans\":[");
  out.resize(static_cast<std::size_t>(w.p - out.data()));
  for (std::size_t i = 0; i < spans.size(); ++i) {
    if (i > 0) out += ',';
    append_span(out, spans[i]);
  }
  out += "]}]}]}";
  return out;
}

std::string identifier_hash(std::string_view identifier) {
  const std::uint64_t h = stable_hash(identifier);
  std::array<std::uint8_t, 8> bytes{};
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(h >> (56 - 8 * i));
  return hex(bytes);
}

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
}

bool exporter::sampled(const std::optional<context>& parent) {
  if (parent) return parent->sampled;  // the caller decided for its whole trace
  if (opt_.sample >= 1.0) return true;
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng()) < opt_.sample;
}

void exporter::submit(span s) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    if (queue_.size() >= opt_.max_queued) {
      dropped_.inc();
      return;
    }
    queue_.push_back(std::move(s));
    wake = queue_.size() == opt_.max_batch;
  }
  if (wake) cv_.notify_one();
}

void exporter::run() {
  std::vector<span> batch;
  std::optional<std::chrono::steady_clock::time_point> stopped;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (!stop_) cv_.wait_for(lock, opt_.interval, [&] { return stop_ || queue_.size() >= opt_.max_batch; });
      if (stop_ && !stopped) stopped = std::chrono::steady_clock::now();
      // Stopping: what is left goes in batches for one timeout at most, the rest is counted as failed.
      if (stopped && (queue_.empty() || std::chrono::steady_clock::now() - *stopped > opt_.timeout)) {
        failed_.inc(queue_.size());
        queue_.clear();
        return;
      }
      const std::size_t n = std::min(queue_.size(), opt_.max_batch);
      batch.assign(std::make_move_iterator(queue_.begin()),
                   std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    if (batch.empty()) continue;
    if (post(encode_json(batch, opt_.service, version_string))) exported_.inc(batch.size());
    else failed_.inc(batch.size());
    batch.clear();
  }
}

// One POST on a connection of its own, bounded by opt_.timeout from the
// connect to the status line; true for a 2xx answer.
bool exporter::post(const std::string& body) {
  const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
  const auto left_ms = [&] {
    return static_cast<int>(std::max<std::int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count()));
  };
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(opt_.to.host.c_str(), std::to_string(opt_.to.port).c_str(), &hints, &found) != 0 || !found) {
    return false;
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  // Each address in turn ("localhost" may be ::1 first and the collector on 127.0.0.1 only).
  int fd = -1;
  for (const addrinfo* a = found; a && fd < 0 && left_ms() > 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!ok && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      ok = ::poll(&p, 1, left_ms()) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    if (!ok) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) return false;
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } guard{fd};
  const auto wait = [&](short events) {
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, left_ms()) == 1 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
  };
  const std::string host = opt_.to.host.find(':') != std::string::npos ? "[" + opt_.to.host + "]" : opt_.to.host;
  const std::string out = "POST " + opt_.to.path + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(opt_.to.port) +
                          "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\nConnection: close\r\n\r\n" + body;
  for (std::size_t sent = 0; sent < out.size();) {
    const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<std::size_t>(n);
    else if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    else if (!wait(POLLOUT)) return false;
  }
  // The status line is all that is read: "HTTP/1.1 200 ...".
  std::string in;
  char chunk[512];
  while (in.find("\r\n") == std::string::npos && in.size() < 4096) {
    if (!wait(POLLIN)) return false;
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return false;
    }
    in.append(chunk, static_cast<std::size_t>(n));
  }
  return in.size() >= 12 && in.starts_with("HTTP/1.") && in[9] == '2';
}

}  // namespace smockron::tracing
