// Route matching and header rewriting.
#include <gtest/gtest.h>

#include <boost/beast/http/fields.hpp>

#include "proxy/rewrite.hpp"
#include "proxy/routes.hpp"

using namespace smockron;
using namespace smockron::proxy;
namespace http = boost::beast::http;

namespace {
config::proxy_config table_config() {
  auto r = config::load_string(R"(
[proxy.upstreams.a]
servers = ["127.0.0.1:1"]
[proxy.upstreams.b]
servers = ["127.0.0.1:2"]
[[proxy.routes]]
host = "api.example.com"
path = "/v1/"
domain = "v1"
upstream = "a"
[[proxy.routes]]
host = "*.example.com"
path = "/"
domain = "wild"
upstream = "b"
[[proxy.routes]]
path = "/public/"
domain = "v1"
upstream = "b"
)", "t");
  return *r.cfg->proxy;
}
}  // namespace

TEST(Routes, FirstMatchWinsByHostAndPathPrefix) {
  const route_table t(table_config());
  ASSERT_EQ(t.domains(), (std::vector<std::string>{"v1", "wild"}));
  const route* r = t.match("api.example.com", "/v1/users");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->domain, "v1");
  EXPECT_EQ(r->upstream_index, 0u);
  EXPECT_EQ(t.match("API.Example.COM:8080", "/v1/x")->domain, "v1");  // case and port ignored
  EXPECT_EQ(t.match("api.example.com", "/v2/")->domain, "wild");        // falls to the wildcard
  EXPECT_EQ(t.match("a.b.example.com", "/")->domain, "wild");
  EXPECT_EQ(t.match("example.com", "/public/x")->domain, "v1");        // "*.example.com" needs a label
  EXPECT_EQ(t.match("example.com", "/public/x")->upstream_index, 1u);
  EXPECT_FALSE(t.match("example.com", "/private"));
  EXPECT_FALSE(t.match("other.org", "/v1/"));
  EXPECT_FALSE(t.match("evil-example.com", "/"));
}

TEST(Routes, NormalizeHost) {
  EXPECT_EQ(normalize_host("Example.COM:8080"), "example.com");
  EXPECT_EQ(normalize_host("[::1]:80"), "[::1]");
  EXPECT_EQ(normalize_host("host"), "host");
  EXPECT_EQ(normalize_host(""), "");
}

TEST(Rewrite, RemovesHopByHopAndAddsForwardedHeaders) {
  http::fields f;
  f.set(http::field::host, "api.example.com");
  f.insert(http::field::connection, "keep-alive, X-Secret-Hop");
  f.insert(http::field::connection, "Foo");
  f.set("X-Secret-Hop", "1");
  f.set("Foo", "2");
  f.set(http::field::keep_alive, "timeout=5");
  f.set(http::field::te, "trailers");
  f.set(http::field::trailer, "X-Checksum");
  f.set(http::field::upgrade, "h2c");
  f.set(http::field::proxy_authorization, "Basic xyz");
  f.set("Proxy-Connection", "keep-alive");
  f.insert("X-Forwarded-For", "10.0.0.1");
  f.insert("X-Forwarded-For", "10.0.0.2");
  f.set("X-Keep", "yes");
  rewrite_request(f, {"192.0.2.7", "http", false});
  for (auto gone : {"Connection", "X-Secret-Hop", "Foo", "Keep-Alive", "TE", "Trailer", "Upgrade", "Proxy-Authorization",
                    "Proxy-Connection"}) {
    EXPECT_EQ(f.count(gone), 0u) << gone;
  }
  EXPECT_EQ(f["X-Forwarded-For"], "10.0.0.1, 10.0.0.2, 192.0.2.7");
  EXPECT_EQ(f.count("X-Forwarded-For"), 1u);
  EXPECT_EQ(f["X-Forwarded-Proto"], "http");
  EXPECT_EQ(f["X-Forwarded-Host"], "api.example.com");
  EXPECT_EQ(f[http::field::host], "api.example.com");
  EXPECT_EQ(f["X-Keep"], "yes");
}

TEST(Rewrite, TunnelKeepsUpgrade) {
  http::fields f;
  f.set(http::field::connection, "Upgrade");
  f.set(http::field::upgrade, "websocket");
  rewrite_request(f, {"127.0.0.1", "http", true});
  EXPECT_EQ(f[http::field::upgrade], "websocket");
  EXPECT_EQ(f[http::field::connection], "upgrade");
  EXPECT_EQ(f["X-Forwarded-For"], "127.0.0.1");
}

TEST(Rewrite, ResponseLosesHopByHop) {
  http::fields f;
  f.set(http::field::connection, "close, X-Internal");
  f.set("X-Internal", "1");
  f.set(http::field::keep_alive, "timeout=5");
  f.set(http::field::content_type, "text/plain");
  rewrite_response(f, false);
  EXPECT_EQ(f.count(http::field::connection), 0u);
  EXPECT_EQ(f.count("X-Internal"), 0u);
  EXPECT_EQ(f.count(http::field::keep_alive), 0u);
  EXPECT_EQ(f[http::field::content_type], "text/plain");
}
