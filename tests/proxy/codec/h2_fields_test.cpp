// HTTP/2 field sections: requests as the request path sees them (RFC 9113
// 8.2-8.3), responses translated from HTTP/1.1, and the gRPC parts.
#include "proxy/codec/h2_fields.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace smockron::proxy::h2 {
namespace {

using pairs = std::vector<std::pair<std::string_view, std::string_view>>;

// Adds `fields` and finishes; returns the error (empty: none).
std::string build(request_fields& rf, const pairs& fields, bool end_stream, http1::request_head& out) {
  for (const auto& [n, v] : fields) rf.add(n, v);
  return std::string(rf.finish(end_stream, out));
}

const pairs k_get = {
    {":method", "GET"}, {":scheme", "https"}, {":authority", "api.example.com"}, {":path", "/v1/x?a=1"}};

TEST(H2RequestFields, BecomesTheHeadAnHttp1RequestWouldHave) {
  request_fields rf(16384);
  http1::request_head h;
  for (const auto& [n, v] : k_get) rf.add(n, v);
  rf.add("x-api-key", "k1");
  rf.add("accept", "*/*");
  ASSERT_EQ(rf.finish(true, h), "");
  EXPECT_EQ(h.method, "GET");
  EXPECT_EQ(h.target, "/v1/x?a=1");
  EXPECT_EQ(h.host, "api.example.com");
  EXPECT_TRUE(h.has_host);
  EXPECT_EQ(h.body, http1::framing::none);
  EXPECT_EQ(h.headers.first("Host"), "api.example.com");  // first, from :authority
  EXPECT_EQ(h.headers.first("X-API-Key"), "k1");
  EXPECT_EQ(h.headers.size(), 3u);
}

TEST(H2RequestFields, CookieCrumbsAreJoinedIntoOneField) {
  // RFC 9113 8.2.3: an HTTP/1.1 server (and the cookie: identifier source) sees one Cookie line.
  request_fields rf(16384);
  http1::request_head h;
  ASSERT_EQ(build(rf, {{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {"cookie", "a=1"}, {"cookie", "b=2"}},
                  true, h),
            "");
  EXPECT_EQ(h.headers.count("cookie"), 1u);
  EXPECT_EQ(h.headers.first("cookie"), "a=1; b=2");
}

TEST(H2RequestFields, BodyFraming) {
  {
    request_fields rf(16384);
    http1::request_head h;
    ASSERT_EQ(build(rf, {{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {"content-length", "12"}}, false, h),
              "");
    EXPECT_EQ(h.body, http1::framing::length);
    EXPECT_EQ(h.content_length, 12u);
  }
  {
    // No length and a body to come: chunked to an HTTP/1.1 server.
    request_fields rf(16384);
    http1::request_head h;
    ASSERT_EQ(build(rf, {{":method", "POST"}, {":scheme", "http"}, {":path", "/"}}, false, h), "");
    EXPECT_EQ(h.body, http1::framing::chunked);
    EXPECT_EQ(h.headers.first("transfer-encoding"), "chunked");
  }
  {
    request_fields rf(16384);
    http1::request_head h;
    EXPECT_EQ(build(rf, {{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {"content-length", "5"}}, true, h),
              "content-length with no body");
  }
  {
    request_fields rf(16384);
    http1::request_head h;
    EXPECT_EQ(build(rf, {{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {"content-length", "1x"}}, false, h),
              "invalid content-length");
  }
}

TEST(H2RequestFields, MalformedRequestsAreRefused) {
  const std::pair<pairs, std::string_view> cases[] = {
      {{{":scheme", "http"}, {":path", "/"}}, "missing :method"},
      {{{":method", "GET"}, {":path", "/"}}, "missing :scheme"},
      {{{":method", "GET"}, {":scheme", "http"}}, "missing :path"},
      {{{":method", "GET"}, {":scheme", "http"}, {":path", "x"}}, "invalid :path"},
      {{{":method", "CONNECT"}, {":authority", "a:443"}}, "CONNECT is not supported"},
      {{{":method", "GET"}, {":method", "POST"}}, "repeated pseudo-header"},
      {{{":method", "GET"}, {":protocol", "websocket"}}, "unknown pseudo-header"},
      {{{"accept", "*/*"}, {":method", "GET"}}, "pseudo-header after a regular field"},
      {{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {"connection", "close"}}, "connection-specific field"},
      {{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {"transfer-encoding", "chunked"}},
       "connection-specific field"},
      {{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {"te", "gzip"}}, "te other than trailers"},
      {{{":method", "GET"}, {":scheme", "http"}, {":authority", "a.example"}, {":path", "/"}, {"host", "b.example"}},
       "host differs from :authority"},
      // RFC 9113 8.3.1: no userinfo; a host no server would read as one.
      {{{":method", "GET"}, {":scheme", "http"}, {":authority", "user@limited.example"}, {":path", "/"}},
       "invalid :authority"},
      {{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {"host", "a b"}}, "invalid :authority"},
      {{{":method", "POST"}, {":scheme", "http"}, {":path", "/"}, {"content-length", "1"}, {"content-length", "1"}},
       "repeated content-length"},
      // Found by fuzz_h2_fields: "coOkie" slipped past the cookie join as a second cookie field.
      {{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {"cookie", "a=1"}, {"coOkie", "b=2"}},
       "upper-case field name"},
  };
  for (const auto& [fields, why] : cases) {
    request_fields rf(16384);
    http1::request_head h;
    EXPECT_EQ(build(rf, fields, true, h), why);
  }
}

TEST(H2RequestFields, HostStandsInForAMissingAuthorityAndTeTrailersPasses) {
  request_fields rf(16384);
  http1::request_head h;
  ASSERT_EQ(
      build(rf, {{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {"host", "a.example"}, {"te", "trailers"}},
            true, h),
      "");
  EXPECT_EQ(h.host, "a.example");
  EXPECT_EQ(h.headers.count("host"), 1u);
}

TEST(H2RequestFields, TheSectionIsBoundedAsSettingsMaxHeaderListSizeCountsIt) {
  // 32 bytes per field beside name and value: 3 fields of 1+1 bytes make 102.
  request_fields rf(101);
  EXPECT_TRUE(rf.add(":method", ""));  // 7 + 32
  EXPECT_TRUE(rf.add("a", "b"));       // 34: 73
  EXPECT_FALSE(rf.add("c", "d"));      // 107 > 101
  EXPECT_TRUE(rf.too_large());
  EXPECT_FALSE(rf.add("e", "f"));  // once over, the rest is ignored
}

TEST(H2RequestFields, GrpcPartsAreFound) {
  request_fields rf(16384);
  http1::request_head h;
  ASSERT_EQ(build(rf,
                  {{":method", "POST"},
                   {":scheme", "http"},
                   {":path", "/pkg.Svc/Call"},
                   {"content-type", "application/grpc+proto"},
                   {"grpc-timeout", "250m"},
                   {"te", "trailers"}},
                  false, h),
            "");
  EXPECT_TRUE(grpc::is_grpc(rf.content_type()));
  EXPECT_EQ(grpc::parse_timeout(rf.grpc_timeout()), std::chrono::milliseconds(250));
}

TEST(H2ResponseFields, Http1HeadBecomesLowerCaseFieldsWithoutHopByHop) {
  const std::string raw =
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: "
      "timeout=5\r\nTransfer-Encoding: chunked\r\nX-Tokens: 7\r\n\r\n";
  http1::response_head res;
  ASSERT_EQ(http1::parse_response(raw, 65536, false, res).status, http1::parse_status::complete);
  std::string arena;
  std::vector<field> out;
  response_fields(res, "RateLimit: \"api\";r=0;t=1\r\n", false, arena, out);
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& f : out) got.emplace_back(f.name, f.value);
  const std::vector<std::pair<std::string, std::string>> want = {
      {":status", "200"}, {"content-type", "text/plain"}, {"x-tokens", "7"}, {"ratelimit", "\"api\";r=0;t=1"}};
  EXPECT_EQ(got, want);
}

TEST(H2ResponseFields, ContentLengthOnlyWhenTheBodyKeepsItsLength) {
  const std::string raw = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
  http1::response_head res;
  ASSERT_EQ(http1::parse_response(raw, 65536, false, res).status, http1::parse_status::complete);
  std::string arena;
  std::vector<field> out;
  response_fields(res, "", true, arena, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].name, "content-length");
  response_fields(res, "", false, arena, out);
  EXPECT_EQ(out.size(), 1u);
}

TEST(H2UpstreamFields, PseudoHeadersFirstHopByHopDroppedForwardedAdded) {
  request_fields rf(16384);
  http1::request_head h;
  ASSERT_EQ(build(rf,
                  {{":method", "POST"},
                   {":scheme", "http"},
                   {":authority", "a.example"},
                   {":path", "/s/M"},
                   {"te", "trailers"},
                   {"x-forwarded-for", "10.0.0.1"},
                   {"x-forwarded-proto", "https"},
                   {"content-type", "application/grpc"}},
                  false, h),
            "");
  http1::forward_info info;
  info.peer_ip = "192.0.2.7";
  std::string arena;
  std::vector<field> out;
  upstream_request_fields(h, info, "http", arena, out);
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& f : out) got.emplace_back(f.name, f.value);
  const std::vector<std::pair<std::string, std::string>> want = {{":method", "POST"},
                                                                 {":scheme", "http"},
                                                                 {":authority", "a.example"},
                                                                 {":path", "/s/M"},
                                                                 {"te", "trailers"},
                                                                 {"content-type", "application/grpc"},
                                                                 {"x-forwarded-for", "10.0.0.1, 192.0.2.7"},
                                                                 {"x-forwarded-proto", "http"},
                                                                 {"x-forwarded-host", "a.example"}};
  EXPECT_EQ(got, want);  // the synthetic transfer-encoding of an HTTP/1.1 hop is not an HTTP/2 field
}

TEST(Grpc, ContentTypes) {
  EXPECT_TRUE(grpc::is_grpc("application/grpc"));
  EXPECT_TRUE(grpc::is_grpc("application/grpc+proto"));
  EXPECT_TRUE(grpc::is_grpc("Application/GRPC;charset=utf-8"));
  EXPECT_FALSE(grpc::is_grpc("application/grpc-web"));
  EXPECT_FALSE(grpc::is_grpc("application/json"));
  EXPECT_FALSE(grpc::is_grpc(""));
}

TEST(Grpc, Timeouts) {
  using namespace std::chrono;
  EXPECT_EQ(grpc::parse_timeout("1H"), hours(1));
  EXPECT_EQ(grpc::parse_timeout("2M"), minutes(2));
  EXPECT_EQ(grpc::parse_timeout("3S"), seconds(3));
  EXPECT_EQ(grpc::parse_timeout("99999999m"), milliseconds(99999999));
  EXPECT_EQ(grpc::parse_timeout("5u"), microseconds(5));
  EXPECT_EQ(grpc::parse_timeout("1500n"), microseconds(2));    // rounded up: never shorter than asked
  EXPECT_EQ(grpc::parse_timeout("100000000m"), std::nullopt);  // 9 digits: over the spec's 8
  EXPECT_EQ(grpc::parse_timeout("m"), std::nullopt);
  EXPECT_EQ(grpc::parse_timeout("10x"), std::nullopt);
  EXPECT_EQ(grpc::parse_timeout("-1S"), std::nullopt);
  EXPECT_EQ(grpc::parse_timeout(""), std::nullopt);
}

TEST(Grpc, StatusForHttpFollowsTheSpecsMapping) {
  EXPECT_EQ(grpc::status_for_http(400), 13u);
  EXPECT_EQ(grpc::status_for_http(401), 16u);
  EXPECT_EQ(grpc::status_for_http(403), 7u);
  EXPECT_EQ(grpc::status_for_http(404), 12u);
  EXPECT_EQ(grpc::status_for_http(429), 14u);
  EXPECT_EQ(grpc::status_for_http(502), 14u);
  EXPECT_EQ(grpc::status_for_http(503), 14u);
  EXPECT_EQ(grpc::status_for_http(504), 14u);
  EXPECT_EQ(grpc::status_for_http(413), 2u);
}

TEST(Grpc, RefusalIsTrailersOnly) {
  std::string arena;
  std::vector<field> out;
  grpc::refusal_fields(8, "rate limit exceeded, 100%", 1500, "RateLimit: \"api\";r=0;t=2\r\n", arena, out);
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& f : out) got.emplace_back(f.name, f.value);
  const std::vector<std::pair<std::string, std::string>> want = {{":status", "200"},
                                                                 {"content-type", "application/grpc"},
                                                                 {"grpc-status", "8"},
                                                                 {"grpc-message", "rate limit exceeded, 100%25"},
                                                                 {"grpc-retry-pushback-ms", "1500"},
                                                                 {"ratelimit", "\"api\";r=0;t=2"}};
  EXPECT_EQ(got, want);
  grpc::refusal_fields(14, "x", -1, "", arena, out);
  EXPECT_EQ(out.size(), 4u);  // no pushback when there is no time to give
}

TEST(Grpc, MessageIsPercentEncoded) {
  EXPECT_EQ(grpc::encode_message("a b"), "a b");
  EXPECT_EQ(grpc::encode_message("\n\x7f\xc3\xa9%"), "%0A%7F%C3%A9%25");
}

}  // namespace
}  // namespace smockron::proxy::h2
