// Path normalization: a table of inputs and results, RFC 3986's
// remove_dot_segments examples, what is refused, and segment-boundary
// prefixes.
#include <gtest/gtest.h>

#include "proxy/codec/path.hpp"

using namespace smockron::proxy;

namespace {

std::string norm(std::string_view p, path::options o = {}) {
  std::string_view why;
  auto out = path::normalize(p, o, why);
  return why.empty() ? out : "!" + std::string(why);
}

TEST(Path, Table) {
  const std::pair<std::string_view, std::string_view> table[] = {
      {"/", "/"},
      {"/api/a", "/api/a"},
      {"/%61pi/a", "/api/a"},  // unreserved escapes decoded
      {"/%7euser/%2D%2e%5F", "/~user/-._"},
      {"//api/a", "/api/a"},  // slashes merged
      {"/api///a//", "/api/a/"},
      {"/api/./a", "/api/a"},
      {"/api/../admin", "/admin"},
      {"/api/%2e%2e/admin", "/admin"},  // encoded dots are dots
      {"/api/.%2E/admin", "/admin"},
      {"/../../etc", "/etc"},  // never above the root
      {"/a/..", "/"},
      {"/a/.", "/a/"},
      {"/a//../b", "/b"},    // merged first, as nginx
      {"/a%20b", "/a%20b"},  // reserved and other escapes stay, upper-cased
      {"/a%3fb%3Fc", "/a%3Fb%3Fc"},
      {"/caf%c3%a9", "/caf%C3%A9"},
      {"/.hidden", "/.hidden"},
      {"/a..b/c.", "/a..b/c."},
      {"/%2", "!invalid percent-encoding in path"},
      {"/%zz", "!invalid percent-encoding in path"},
      {"/a%", "!invalid percent-encoding in path"},
      {"/a%00b", "!encoded NUL in path"},
      {"/a\\b", "!backslash in path"},
      {"/api%2Fadmin", "!encoded slash or backslash in path"},
      {"/api%5cadmin", "!encoded slash or backslash in path"},
  };
  for (const auto& [in, want] : table) EXPECT_EQ(norm(in), want) << in;
}

TEST(Path, Rfc3986RemoveDotSegmentsExamples) {
  // RFC 3986 5.2.4 and 5.4.2 (the abnormal examples, on absolute paths).
  EXPECT_EQ(norm("/a/b/c/./../../g"), "/a/g");
  EXPECT_EQ(norm("/b/c/../../../g"), "/g");
  EXPECT_EQ(norm("/b/c/./g"), "/b/c/g");
  EXPECT_EQ(norm("/b/c/g/."), "/b/c/g/");
  EXPECT_EQ(norm("/b/c/g/.."), "/b/c/");
  EXPECT_EQ(norm("/b/c/g/../h"), "/b/c/h");
  EXPECT_EQ(norm("/b/c/./g/."), "/b/c/g/");
}

TEST(Path, OptionsChangeWhatHappens) {
  path::options keep;
  keep.slashes = path::escaped_slash::keep;
  EXPECT_EQ(norm("/api%2fadmin", keep), "/api%2Fadmin");
  path::options unescape;
  unescape.slashes = path::escaped_slash::unescape;
  EXPECT_EQ(norm("/api%2F..%2Fadmin", unescape), "/admin") << "decoded separators take part in dot removal";
  // Found by fuzz_path: %5C decoded to a backslash gave a path the normalizer
  // itself refuses (not idempotent); it is a separator like %2F.
  EXPECT_EQ(norm("/a%5cb", unescape), "/a/b");
  EXPECT_EQ(norm(norm("/%41pi/%2e%2e/a%2Fb%5c", unescape), unescape), "/a/b/");
  path::options no_merge;
  no_merge.merge_slashes = false;
  EXPECT_EQ(norm("//api//a", no_merge), "//api//a");
  EXPECT_TRUE(path::already_normal("//api", no_merge));
}

TEST(Path, AlreadyNormalIsExact) {
  for (std::string_view p : {"/", "/api/a", "/a.b/c..d", "/.well-known/x"}) {
    EXPECT_TRUE(path::already_normal(p, {})) << p;
  }
  for (std::string_view p : {"//a", "/a/./b", "/a/../b", "/a/.", "/a/..", "/%61", "/a\\b"}) {
    EXPECT_FALSE(path::already_normal(p, {})) << p;
  }
}

TEST(Path, PrefixesMatchOnSegmentBoundaries) {
  EXPECT_TRUE(path::under("/api", "/api"));
  EXPECT_TRUE(path::under("/api/x", "/api"));
  EXPECT_FALSE(path::under("/apiary", "/api"));
  EXPECT_TRUE(path::under("/api/x", "/api/"));
  EXPECT_FALSE(path::under("/api", "/api/"));
  EXPECT_TRUE(path::under("/anything", "/"));
  EXPECT_TRUE(path::under("/x", ""));
}

// What Tomcat, Jetty and Spring serve for a path with segment parameters:
// routes match this form, so ";x" cannot carry a request past a route.
TEST(Path, SegmentParametersAreStrippedForRouting) {
  const std::pair<std::string_view, std::string_view> table[] = {
      {"/api;x/a", "/api/a"},
      {"/api;jsessionid=1/a;v=2", "/api/a"},
      {"/api;", "/api"},
      {"/;x", "/"},
      {"/a/;x/b", "/a//b"},  // merged by normalization when merge_slashes is on
      {"/api/..;/admin", "/api/../admin"},
      {"/a%3Bb/c", "/a%3Bb/c"},  // an encoded ';' is data
      {"/plain/path", "/plain/path"},
  };
  for (const auto& [in, out] : table) EXPECT_EQ(path::strip_parameters(in), out) << in;
  std::string_view why;
  EXPECT_EQ(path::normalize(path::strip_parameters("/api/..;/admin"), {}, why), "/admin");
  // Where the gate and a backend that keeps parameters would disagree:
  for (std::string_view p : {"/api/..;/admin", "/api/.;x/../admin", "/a/%2e%2E;v=1/b", "/..;", "/a/.%2e;/b"}) {
    EXPECT_TRUE(path::hides_dot_segment(p)) << p;
  }
  for (std::string_view p : {"/api;x/a", "/a/...;x", "/a/..x;y", "/a/../b", "/a;/b", "/%2e%2e%2e;x"}) {
    EXPECT_FALSE(path::hides_dot_segment(p)) << p;
  }
  EXPECT_TRUE(path::under(path::normalize(path::strip_parameters("/api;x/a"), {}, why), "/api"));
}

}  // namespace
