// OpenTelemetry spans: W3C traceparent parsing, the OTLP/JSON encoding, and
// the exporter against a collector on loopback (a batch POSTed, a refusal
// counted, a full queue dropping and counting). The daemons' spans against a
// collector that checks the OTLP schema: integration/test_traces.py.
#include "shared/daemon/tracing.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/loopback.hpp"

using namespace smockron;

TEST(Tracing, TraceparentAsW3CSpecifiesIt) {
  const auto c = tracing::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->trace[0], 0x4b);
  EXPECT_EQ(c->trace[15], 0x36);
  EXPECT_EQ(c->parent[7], 0xb7);
  EXPECT_TRUE(c->sampled);
  EXPECT_FALSE(tracing::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")->sampled);
  // A later version: its first four fields are read, what follows a '-' ignored.
  EXPECT_TRUE(tracing::parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-ever"));
  for (const char* bad : {
           "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  // no flags
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // version 00 has no more
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // version ff is invalid
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // all-zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // all-zero parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // separator
           "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09x",  // no '-' after flags
       }) {
    EXPECT_FALSE(tracing::parse_traceparent(bad)) << bad;
  }
}

TEST(Tracing, OtlpJsonHasHexIdsStringIntegersAndNumericEnums) {
  tracing::span s;
  s.trace = tracing::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")->trace;
  s.id = {1, 2, 3, 4, 5, 6, 7, 8};
  s.parent = tracing::span_id{0, 0, 0, 0, 0, 0, 0, 9};
  s.name = "smockron.hold";
  s.start_ns = 1'700'000'000'000'000'000;
  s.end_ns = 1'700'000'000'250'000'000;
  s.add("smockron.domain", "api");
  s.add("smockron.held_ms", 250);
  s.add_hash("smockron.identifier_hash", 0x0123456789abcdefULL);
  s.error = true;
  const auto doc = nlohmann::json::parse(tracing::encode_json({&s, 1}, "smockron-proxy", "1.2.3"));
  const auto& rs = doc["resourceSpans"][0];
  EXPECT_EQ(rs["resource"]["attributes"][0]["key"], "service.name");
  EXPECT_EQ(rs["resource"]["attributes"][0]["value"]["stringValue"], "smockron-proxy");
  EXPECT_EQ(rs["scopeSpans"][0]["scope"]["name"], "smockron");
  const auto& j = rs["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(j["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(j["spanId"], "0102030405060708");
  EXPECT_EQ(j["parentSpanId"], "0000000000000009");
  EXPECT_EQ(j["kind"], 1);
  EXPECT_EQ(j["startTimeUnixNano"], "1700000000000000000");
  EXPECT_EQ(j["endTimeUnixNano"], "1700000000250000000");
  EXPECT_EQ(j["attributes"][0]["value"]["stringValue"], "api");
  EXPECT_EQ(j["attributes"][1]["value"]["intValue"], "250");
  EXPECT_EQ(j["attributes"][2]["value"]["stringValue"], "0123456789abcdef");
  EXPECT_EQ(j["status"]["code"], 2);
  s.parent.reset();
  s.error = false;
  const auto root =
      nlohmann::json::parse(tracing::encode_json({&s, 1}, "m", "v"))["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_FALSE(root.contains("parentSpanId"));
  EXPECT_FALSE(root.contains("status")) << "unset: its default";
  EXPECT_NE(tracing::identifier_hash("alice"), tracing::identifier_hash("bob"));
  // A point in time: its end is its start.
  s.end_ns = s.start_ns;
  EXPECT_EQ(nlohmann::json::parse(tracing::encode_json(
                {&s, 1}, "m", "v"))["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["endTimeUnixNano"],
            "1700000000000000000");
}

TEST(Tracing, ASpanKeepsWhatFitsOfItsTextsAndCutsBetweenCharacters) {
  tracing::span s;
  s.add("a", std::string(tracing::span::text_capacity - 3, 'x'));
  s.add("b", "\xc3\xa9\xc3\xa9");  // two 2-byte characters; room for 3 bytes: the first only
  s.add("c", "late");              // 1 byte left: "l"
  s.add("d", "later");             // none left: empty
  for (int i = 0; i < 10; ++i) s.add("n", i);
  ASSERT_EQ(s.attributes().size(), tracing::span::max_attributes) << "more are ignored";
  EXPECT_EQ(s.text(s.attributes()[0]).size(), tracing::span::text_capacity - 3);
  EXPECT_EQ(s.text(s.attributes()[1]), "\xc3\xa9");
  EXPECT_EQ(s.text(s.attributes()[2]), "l");
  EXPECT_EQ(s.text(s.attributes()[3]), "");
  const tracing::span copy = s;  // a copy's texts are its own
  EXPECT_EQ(copy.text(copy.attributes()[1]), "\xc3\xa9");
  const auto doc = nlohmann::json::parse(tracing::encode_json({&copy, 1}, "m", "v"));
  EXPECT_EQ(doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].size(), tracing::span::max_attributes);
}

namespace {

/// A collector on loopback answering every POST with `status`; counts what it
/// took and on how many connections. `close_each`: it answers "Connection:
/// close" and closes; `keep_alive`: it reads the next POST on the same
/// connection; `close_silently`: it answers as if it kept the connection,
/// then closes it (a collector whose idle timeout has passed).
class fake_collector {
public:
  enum class mode { close_each, keep_alive, close_silently };
  explicit fake_collector(int status, mode m = mode::close_each) : status_(status), mode_(m) {
    fd_ = test_support::bind_loopback(port_);
    if (fd_ < 0) std::abort();
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) != 1) continue;
        const int c = ::accept(fd_, nullptr, nullptr);
        ++connections_;
        while (serve_one(c) && mode_ == mode::keep_alive) {}
        ::close(c);
      }
    });
  }
  ~fake_collector() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::uint16_t port() const { return port_; }
  int posts() const { return posts_; }
  int connections() const { return connections_; }
  std::vector<std::string> bodies_;  // read after posts() says they are there

private:
  /// Reads one POST (its head, then Content-Length bytes of body) and answers it; false at the connection's end.
  bool serve_one(int c) {
    std::string in;
    char chunk[4096];
    for (;;) {
      const ssize_t n = ::read(c, chunk, sizeof chunk);
      if (n <= 0) return false;
      in.append(chunk, static_cast<std::size_t>(n));
      const auto end = in.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      const auto cl = in.find("Content-Length: ");
      const std::size_t len = cl == std::string::npos ? 0 : std::stoul(in.substr(cl + 16));
      if (in.size() >= end + 4 + len) {
        bodies_.push_back(in.substr(end + 4, len));
        break;
      }
    }
    ++posts_;  // before the answer: a POST the exporter saw answered is counted
    const std::string answer = "HTTP/1.1 " + std::to_string(status_) + " X\r\nContent-Length: 2\r\n" +
                               (mode_ == mode::close_each ? "Connection: close\r\n" : "") + "\r\n{}";
    return ::write(c, answer.data(), answer.size()) == static_cast<ssize_t>(answer.size());
  }

  int fd_ = -1, status_;
  mode mode_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> posts_{0}, connections_{0};
  std::thread thread_;
};

double value(const metrics::registry& reg, const std::string& line) {
  const std::string text = reg.render();
  const auto at = text.find(line + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size() + 1));
}

tracing::span some_span(std::string_view name) {
  tracing::span s;
  s.trace = tracing::exporter::new_trace_id();
  s.id = tracing::exporter::new_span_id();
  s.name = name;
  return s;
}

/// An exporter's options for a collector on loopback `port`: nothing leaves
/// before the queue holds a batch or the exporter stops (tests change the rest).
tracing::exporter::options to_collector(std::uint16_t port) {
  return {.to = {"127.0.0.1", port, "/v1/traces"},
          .service = "smockron-test",
          .sample = 1.0,
          .max_queued = 100,
          .interval = std::chrono::milliseconds(60'000),
          .max_batch = 512,
          .timeout = std::chrono::milliseconds(2000)};
}

bool until(const std::function<bool()>& f) {
  for (int i = 0; i < 500 && !f(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return f();
}

}  // namespace

TEST(Tracing, TheExporterPostsBatchesAndCountsWhatBecameOfEverySpan) {
  fake_collector collector(200);
  metrics::registry reg;
  {
    auto o = to_collector(collector.port());
    o.interval = std::chrono::milliseconds(20);
    tracing::exporter e(o, reg, "smockron_test");
    e.submit(some_span("a"));
    e.submit(some_span("b"));
    ASSERT_TRUE(until([&] { return value(reg, "smockron_test_trace_spans_total{result=\"exported\"}") == 2; }))
        << reg.render();
  }
  ASSERT_GE(collector.posts(), 1);
  const auto doc = nlohmann::json::parse(collector.bodies_.at(0));
  EXPECT_EQ(doc["resourceSpans"][0]["scopeSpans"][0]["spans"].size(), 2u);
}

TEST(Tracing, MoreSpansThanABatchLeaveInSeveralPosts) {
  fake_collector collector(200);
  metrics::registry reg;
  {
    auto o = to_collector(collector.port());
    o.max_batch = 2;
    tracing::exporter e(o, reg, "smockron_test");
    for (int i = 0; i < 5; ++i) e.submit(some_span("x"));
  }  // stopping sends the 5 queued, 2 a batch (the exporter may have taken the first 2 already)
  EXPECT_EQ(value(reg, "smockron_test_trace_spans_total{result=\"exported\"}"), 5);
  ASSERT_EQ(collector.posts(), 3);
  std::size_t spans = 0;
  for (const auto& body : collector.bodies_) {
    const auto n = nlohmann::json::parse(body)["resourceSpans"][0]["scopeSpans"][0]["spans"].size();
    EXPECT_LE(n, 2u);
    spans += n;
  }
  EXPECT_EQ(spans, 5u);
}

TEST(Tracing, OneConnectionCarriesTheBatchesWhileTheCollectorKeepsIt) {
  for (const auto m : {fake_collector::mode::keep_alive, fake_collector::mode::close_silently}) {
    fake_collector collector(200, m);
    metrics::registry reg;
    {
      auto o = to_collector(collector.port());
      o.max_queued = 512;
      tracing::exporter e(o, reg, "smockron_test");
      // One batch at a time: the next is submitted once the last was answered.
      for (int i = 1; i <= 3; ++i) {
        for (int k = 0; k < 512; ++k) e.submit(some_span("x"));
        ASSERT_TRUE(until([&] {
          return value(reg, "smockron_test_trace_spans_total{result=\"exported\"}") == 512 * i;
        })) << reg.render();
      }
    }
    EXPECT_EQ(collector.posts(), 3);
    if (m == fake_collector::mode::keep_alive) EXPECT_EQ(collector.connections(), 1);
    else EXPECT_EQ(collector.connections(), 3) << "a connection the collector closed is not used again";
    EXPECT_EQ(value(reg, "smockron_test_trace_spans_total{result=\"failed\"}"), 0);
  }
}

TEST(Tracing, ARefusingCollectorAndAFullQueueCostSpansOnly) {
  fake_collector refusing(503);
  metrics::registry reg;
  {
    auto o = to_collector(refusing.port());
    o.max_queued = 3;  // nothing leaves before stopping: 2 of 5 dropped
    tracing::exporter e(o, reg, "smockron_test");
    for (int i = 0; i < 5; ++i) e.submit(some_span("x"));
    EXPECT_EQ(value(reg, "smockron_test_trace_spans_total{result=\"dropped\"}"), 2);
    EXPECT_FALSE(e.sampled(tracing::context{{1}, {1}, false})) << "the caller's flag decides";
    EXPECT_TRUE(e.sampled(tracing::context{{1}, {1}, true}));
    EXPECT_TRUE(e.sampled(std::nullopt)) << "sample 1.0";
  }  // stopping sends the 3 queued: refused
  EXPECT_EQ(value(reg, "smockron_test_trace_spans_total{result=\"failed\"}"), 3);
  EXPECT_EQ(value(reg, "smockron_test_trace_spans_total{result=\"exported\"}"), 0);
}

TEST(Tracing, StoppingSendsWhatIsQueuedAndAnUnreachableCollectorCountsItFailed) {
  metrics::registry reg;
  {
    // A port nothing listens on (bound, never listened to: connects are refused).
    std::uint16_t port = 0;
    const int fd = test_support::bind_loopback(port, false);
    ASSERT_GE(fd, 0);
    auto o = to_collector(port);
    o.sample = 0.0;
    o.timeout = std::chrono::milliseconds(500);
    tracing::exporter e(o, reg, "smockron_test");
    EXPECT_FALSE(e.sampled(std::nullopt)) << "sample 0";
    e.submit(some_span("late"));
    ::close(fd);
  }  // the destructor tries it once
  EXPECT_EQ(value(reg, "smockron_test_trace_spans_total{result=\"failed\"}"), 1);
}

TEST(Tracing, StringsAreEscapedIntoValidJson) {
  tracing::span s;
  s.trace = tracing::exporter::new_trace_id();
  s.id = tracing::exporter::new_span_id();
  s.name = "smockron.test";
  s.add("k", "caf\xc3\xa9\t");
  s.add("q", "a \"quoted\" \\ text\n\x01");
  const auto doc = nlohmann::json::parse(tracing::encode_json({&s, 1}, "svc\"", "1"));
  const auto& j = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(j["name"], "smockron.test");
  EXPECT_EQ(j["attributes"][0]["key"], "k");
  EXPECT_EQ(j["attributes"][0]["value"]["stringValue"], "caf\xc3\xa9\t");
  EXPECT_EQ(j["attributes"][1]["value"]["stringValue"], "a \"quoted\" \\ text\n\x01");
  EXPECT_EQ(doc["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"], "svc\"");
}

TEST(Tracing, EveryTextWithACharacterToEscapeAtAnyPlaceIsEscaped) {
  // The check for what needs escaping reads eight bytes at a time: every
  // length and place, against nlohmann::json reading what was written.
  for (std::size_t n = 1; n <= 40; ++n) {
    for (std::size_t at = 0; at < n; ++at) {
      for (const char c : {'"', '\\', '\x00', '\x1f', '\x7f', '\x80', ' ', '\xff'}) {
        std::string text(n, 'a');
        text[at] = c;
        if (static_cast<unsigned char>(c) >= 0x80) text = text.substr(0, at) + "\xc3\xa9" + text.substr(at + 1);
        tracing::span s;
        s.name = "smockron.test";
        s.add("k", text);
        s.add_literal("l", "literal");
        const auto j = nlohmann::json::parse(
            tracing::encode_json({&s, 1}, "m", "v"))["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        ASSERT_EQ(j["attributes"][0]["value"]["stringValue"], text) << n << " " << at << " " << int(c);
        ASSERT_EQ(j["attributes"][1]["value"]["stringValue"], "literal");
      }
    }
  }
}

TEST(Tracing, LongKeysAndLiteralsFitTheirSpan) {
  // Room for a span's JSON is made from its keys and literals: long ones included.
  static const std::string long_key(300, 'k'), long_literal(5000, 'v');
  tracing::span s;
  s.name = "smockron.test";
  for (std::size_t i = 0; i < tracing::span::max_attributes; ++i) s.add_literal(long_key, long_literal);
  const auto j =
      nlohmann::json::parse(tracing::encode_json({&s, 1}, "m", "v"))["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  ASSERT_EQ(j["attributes"].size(), tracing::span::max_attributes);
  EXPECT_EQ(j["attributes"][7]["key"], long_key);
  EXPECT_EQ(j["attributes"][7]["value"]["stringValue"], long_literal);
}

TEST(Tracing, AnAnswerKeepsTheConnectionOnlyWhenContentLengthAloneFramesIt) {
  const auto head = [](const std::string& fields) {
    return tracing::read_answer_head("HTTP/1.1 200 OK\r\n" + fields + "\r\n");
  };
  EXPECT_TRUE(head("Content-Length: 2\r\n").ok);
  EXPECT_EQ(head("Content-Length: 2\r\n").length, 2u);
  EXPECT_EQ(head("content-length:\t0 \r\n").length, 0u) << "any case, blanks around the value";
  EXPECT_FALSE(head("Content-Length: 2\r\nConnection: Close\r\n").length);
  EXPECT_FALSE(head("Transfer-Encoding: chunked\r\n").length);
  EXPECT_FALSE(head("").length) << "no length: the body ends with the connection";
  EXPECT_FALSE(head("Content-Length: 2\r\nContent-Length: 2\r\n").length) << "repeated";
  EXPECT_FALSE(head("Content-Length: 2x\r\n").length);
  EXPECT_FALSE(head("Content-Length: -1\r\n").length);
  EXPECT_FALSE(tracing::read_answer_head("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n").length);
  EXPECT_FALSE(tracing::read_answer_head("HTTP/1.1 503 X\r\nContent-Length: 2\r\n\r\n").ok);
  EXPECT_FALSE(tracing::read_answer_head("HTTP/1.1").ok);
  EXPECT_FALSE(tracing::read_answer_head("").ok);
}
