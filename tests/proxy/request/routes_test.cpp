// Route matching and header rewriting.
#include <gtest/gtest.h>

#include "proxy/request/routes.hpp"

using namespace smockron;
using namespace smockron::proxy;

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
)",
                               "t");
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
  EXPECT_EQ(t.match("api.example.com", "/v2/")->domain, "wild");      // falls to the wildcard
  EXPECT_EQ(t.match("a.b.example.com", "/")->domain, "wild");
  EXPECT_EQ(t.match("A.B.Example.COM:443", "/")->domain, "wild");  // suffix: case and port ignored too
  EXPECT_EQ(t.match("example.com", "/public/x")->domain, "v1");    // "*.example.com" needs a label
  EXPECT_EQ(t.match("example.com", "/public/x")->upstream_index, 1u);
  EXPECT_FALSE(t.match("example.com", "/private"));
  EXPECT_FALSE(t.match("other.org", "/v1/"));
  EXPECT_FALSE(t.match("evil-example.com", "/"));
  // A fully qualified name's trailing dot is the same host (as nginx's server_name matches it).
  EXPECT_EQ(t.match("api.example.com.", "/v1/x")->domain, "v1");
  EXPECT_EQ(t.match("API.example.COM.:80", "/v1/x")->domain, "v1");
  EXPECT_EQ(t.match("a.b.example.com.", "/")->domain, "wild");
  EXPECT_FALSE(t.match("api.example.com..", "/v1/x"));  // one dot only
}

TEST(Routes, NormalizeHost) {
  EXPECT_EQ(normalize_host("Example.COM:8080"), "example.com");
  EXPECT_EQ(normalize_host("[::1]:80"), "[::1]");
  EXPECT_EQ(normalize_host("host"), "host");
  EXPECT_EQ(normalize_host(""), "");
  EXPECT_EQ(normalize_host("Example.COM.:80"), "example.com");
}
