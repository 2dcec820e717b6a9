// Tests for client identification: every identifier source, source order,
// X-Forwarded-For trust, hashing of secrets and over-long values, and JWT
// verification (HS256, RS256, ES256 with keys generated here).
#include "proxy/identify/identify.hpp"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace smockron::proxy {
namespace {

// A header list that owns its text (the proxy's lists are views into its buffer).
struct headers : http1::header_list {
  std::deque<std::string> text;
  void insert(std::string name, std::string value) {
    text.push_back(std::move(name));
    const std::string& n = text.back();
    text.push_back(std::move(value));
    header_list::insert(n, text.back());
  }
};

using src = config::identifier_source;
using kind = config::identifier_source::kind;

ip_address ip(std::string_view text) {
  auto a = parse_ip(text);
  EXPECT_TRUE(a.has_value()) << text;
  return a.value_or(ip_address{});
}

std::vector<cidr> cidrs(std::initializer_list<std::string_view> list) {
  std::vector<cidr> out;
  for (auto t : list) {
    auto c = parse_cidr(t);
    EXPECT_TRUE(c.has_value()) << t;
    if (c) out.push_back(*c);
  }
  return out;
}

std::vector<src> sources(std::initializer_list<std::string_view> list) {
  std::vector<src> out;
  for (auto t : list) {
    auto s = config::parse_identifier_source(t);
    EXPECT_TRUE(s.has_value()) << t;
    if (s) out.push_back(*s);
  }
  return out;
}

// The identity's value, "<none>", or "<ambiguous>" (a source found several values).
std::string id_of(const std::vector<src>& s, const headers& h, std::string_view target = "/",
                  const ip_address& peer = ip("203.0.113.9"), const identify_context& ctx = {}) {
  const auto r = identify(s, h, target, peer, ctx);
  if (r.ambiguous != nullptr) return "<ambiguous>";
  return r.who ? r.who->value : "<none>";
}

std::string client(const headers& h, std::string_view peer, const std::vector<cidr>& trusted) {
  return format_ip(client_address(h, ip(peer), trusted));
}

// ------------------------------------------------------------------ helpers

TEST(HashSecret, IsSha256PrefixInLowercaseHex) {
  // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223 b00361a3...
  EXPECT_EQ(hash_secret("abc"), "sha256:ba7816bf8f01cfea414140de5dae2223");
  EXPECT_EQ(hash_secret("abc"), hash_secret("abc"));
  EXPECT_NE(hash_secret("abc"), hash_secret("abd"));
  EXPECT_EQ(hash_secret("").size(), 7u + 32u);
}

TEST(FormatIp, V4MappedAsDottedQuadV6PerInetNtop) {
  EXPECT_EQ(format_ip(ip("192.0.2.1")), "192.0.2.1");
  EXPECT_EQ(format_ip(ip("::ffff:192.0.2.1")), "192.0.2.1");
  EXPECT_EQ(format_ip(ip("2001:DB8:0:0:0:0:0:1")), "2001:db8::1");
  EXPECT_EQ(format_ip(ip("::1")), "::1");
  EXPECT_EQ(format_ip(ip("::")), "::");
}

// ------------------------------------------------------------ ip / X-F-F

TEST(ClientAddress, PeerWithoutHeader) {
  headers h;
  EXPECT_EQ(client(h, "198.51.100.7", cidrs({"10.0.0.0/8"})), "198.51.100.7");
  EXPECT_EQ(client(h, "10.1.1.1", cidrs({"10.0.0.0/8"})), "10.1.1.1");
}

TEST(ClientAddress, HeaderFromUntrustedPeerIsIgnored) {
  headers h;
  h.insert("X-Forwarded-For", "1.2.3.4");
  // No trusted proxies at all, and a peer outside the trusted set.
  EXPECT_EQ(client(h, "198.51.100.7", {}), "198.51.100.7");
  EXPECT_EQ(client(h, "198.51.100.7", cidrs({"10.0.0.0/8"})), "198.51.100.7");
  // The same through identify(): a spoofing client keeps its own identity.
  const auto trusted = cidrs({"10.0.0.0/8"});
  identify_context ctx;
  ctx.trusted_proxies = &trusted;
  EXPECT_EQ(id_of(sources({"ip"}), h, "/", ip("198.51.100.7"), ctx), "198.51.100.7");
  EXPECT_EQ(id_of(sources({"ip"}), h, "/", ip("198.51.100.7")), "198.51.100.7");
}

TEST(ClientAddress, TrustedPeerTakesRightMostUntrusted) {
  headers h;
  // The client put "6.6.6.6" there itself; our edge appended the real one.
  h.insert("X-Forwarded-For", "6.6.6.6, 192.0.2.50, 10.0.0.2");
  EXPECT_EQ(client(h, "10.0.0.1", cidrs({"10.0.0.0/8"})), "192.0.2.50");
}

TEST(ClientAddress, SeveralHeaderLinesAreOneListInOrder) {
  headers h;
  h.insert("X-Forwarded-For", "6.6.6.6, 192.0.2.50");
  h.insert("Host", "example.com");
  h.insert("x-forwarded-for", "172.16.0.5,10.0.0.3");
  h.insert("X-FORWARDED-FOR", " 10.0.0.2 ");
  const auto trusted = cidrs({"10.0.0.0/8", "172.16.0.0/12"});
  EXPECT_EQ(client(h, "10.0.0.1", trusted), "192.0.2.50");
  // With only 10/8 trusted, 172.16.0.5 is the first untrusted hop.
  EXPECT_EQ(client(h, "10.0.0.1", cidrs({"10.0.0.0/8"})), "172.16.0.5");
}

TEST(ClientAddress, AllTrustedUsesLeftMost) {
  headers h;
  h.insert("X-Forwarded-For", "10.9.9.9, 10.0.0.3");
  h.insert("X-Forwarded-For", "10.0.0.2");
  EXPECT_EQ(client(h, "10.0.0.1", cidrs({"10.0.0.0/8"})), "10.9.9.9");
}

TEST(ClientAddress, GarbageStopsAtLastTrustedHop) {
  const auto trusted = cidrs({"10.0.0.0/8"});
  {
    headers h;
    h.insert("X-Forwarded-For", "192.0.2.50, not-an-ip, 10.0.0.2");
    EXPECT_EQ(client(h, "10.0.0.1", trusted), "10.0.0.2");
  }
  {
    headers h;  // garbage right next to the peer
    h.insert("X-Forwarded-For", "192.0.2.50, unknown");
    EXPECT_EQ(client(h, "10.0.0.1", trusted), "10.0.0.1");
  }
  {
    headers h;  // an address with a port is not an address
    h.insert("X-Forwarded-For", "192.0.2.50:4711");
    EXPECT_EQ(client(h, "10.0.0.1", trusted), "10.0.0.1");
    headers h6;
    h6.insert("X-Forwarded-For", "[2001:db8::1]:443, 10.0.0.2");
    EXPECT_EQ(client(h6, "10.0.0.1", trusted), "10.0.0.2");
  }
  {
    headers h;  // garbage beyond the first untrusted hop is never reached
    h.insert("X-Forwarded-For", "garbage, 192.0.2.50, 10.0.0.2");
    EXPECT_EQ(client(h, "10.0.0.1", trusted), "192.0.2.50");
  }
  {
    headers h;  // empty list elements are skipped, not garbage
    h.insert("X-Forwarded-For", "192.0.2.50,, 10.0.0.2,");
    h.insert("X-Forwarded-For", "");
    EXPECT_EQ(client(h, "10.0.0.1", trusted), "192.0.2.50");
  }
}

TEST(ClientAddress, Ipv6PeersAndHops) {
  const auto trusted = cidrs({"2001:db8:ffff::/48", "::1"});
  headers h;
  h.insert("X-Forwarded-For", "2001:db8:1::abcd, 2001:db8:ffff::2");
  EXPECT_EQ(client(h, "2001:db8:ffff::1", trusted), "2001:db8:1::abcd");
  EXPECT_EQ(client(h, "::1", trusted), "2001:db8:1::abcd");
  EXPECT_EQ(client(h, "2001:db8:2::1", trusted), "2001:db8:2::1");  // untrusted v6 peer
  headers mapped;
  mapped.insert("X-Forwarded-For", "::ffff:192.0.2.77");
  EXPECT_EQ(client(mapped, "::1", trusted), "192.0.2.77");
  // An IPv4 trusted range also covers the mapped form of a v4 peer.
  EXPECT_EQ(client(mapped, "::ffff:10.0.0.1", cidrs({"10.0.0.0/8"})), "192.0.2.77");
}

// RFC 7239's own examples (sections 4 and 7.1) and the edge cases of its grammar.
TEST(Forwarded, ForParameterOfAnElement) {
  EXPECT_EQ(forwarded_for("for=192.0.2.60;proto=http;by=203.0.113.43"), "192.0.2.60");
  EXPECT_EQ(forwarded_for("For=\"[2001:db8:cafe::17]:4711\""), "\"[2001:db8:cafe::17]:4711\"");
  EXPECT_EQ(forwarded_for("proto=https; for=198.51.100.17 ;by=x"), "198.51.100.17");
  EXPECT_EQ(forwarded_for("by=\"a;for=1.2.3.4\";for=192.0.2.1"), "192.0.2.1") << "';' inside quotes";
  EXPECT_EQ(forwarded_for("proto=https"), std::nullopt);
  EXPECT_EQ(forwarded_for(";;for=192.0.2.1;"), "192.0.2.1") << "empty pairs are allowed";
  EXPECT_EQ(forwarded_for("for=192.0.2.1;for=192.0.2.2"), std::nullopt) << "a parameter at most once";
  EXPECT_EQ(forwarded_for("for"), std::nullopt);
  EXPECT_EQ(forwarded_for(" for= "), std::nullopt) << "an empty value (found by fuzz_forwarded)";
  EXPECT_EQ(forwarded_for("for=\"192.0.2.1"), std::nullopt) << "unterminated quote";
}

TEST(Forwarded, NodeAddresses) {
  auto addr = [](std::string_view v) {
    const auto a = forwarded_node_address(v);
    return a ? format_ip(*a) : std::string("<none>");
  };
  EXPECT_EQ(addr("192.0.2.43"), "192.0.2.43");
  EXPECT_EQ(addr("\"192.0.2.43:47011\""), "192.0.2.43");
  EXPECT_EQ(addr("\"[2001:db8:cafe::17]\""), "2001:db8:cafe::17");
  EXPECT_EQ(addr("\"[2001:db8:cafe::17]:4711\""), "2001:db8:cafe::17");
  EXPECT_EQ(addr("unknown"), "<none>");
  EXPECT_EQ(addr("_hidden"), "<none>");
  EXPECT_EQ(addr("\"_SEVKISEK\""), "<none>");
  EXPECT_EQ(addr("2001:db8::1"), "<none>") << "IPv6 must be bracketed";
  EXPECT_EQ(addr("\"[2001:db8::1\""), "<none>");
  EXPECT_EQ(addr("\"[2001:db8::1]x\""), "<none>");
  EXPECT_EQ(addr("\"192.0.2.1\\\"\""), "<none>");
  EXPECT_EQ(addr(""), "<none>");
}

TEST(ClientAddress, ForwardedChainFromTrustedProxies) {
  const auto trusted = cidrs({"10.0.0.0/8"});
  const auto via_forwarded = [&](const headers& h, std::string_view peer) {
    return format_ip(client_address(h, ip(peer), trusted, real_ip_header::forwarded));
  };
  headers h;
  h.insert("Forwarded", "for=6.6.6.6, for=192.0.2.50;proto=https");
  h.insert("Forwarded", "for=\"10.0.0.2:8080\";by=10.0.0.1");
  EXPECT_EQ(via_forwarded(h, "10.0.0.1"), "192.0.2.50");
  EXPECT_EQ(via_forwarded(h, "203.0.113.9"), "203.0.113.9") << "an untrusted peer is who it is";
  // Only the configured header is believed: a client adds the other one itself.
  h.insert("X-Forwarded-For", "7.7.7.7");
  EXPECT_EQ(via_forwarded(h, "10.0.0.1"), "192.0.2.50");
  EXPECT_EQ(client(h, "10.0.0.1", trusted), "7.7.7.7") << "X-Forwarded-For mode ignores Forwarded";
  headers v6;
  v6.insert("Forwarded", "for=\"[2001:db8:cafe::17]:4711\"");
  EXPECT_EQ(via_forwarded(v6, "10.0.0.1"), "2001:db8:cafe::17");
  // An element that names no address ends the walk at the last trusted hop.
  for (const auto* value : {"for=192.0.2.50, for=unknown", "for=192.0.2.50, for=_proxy2", "for=192.0.2.50, proto=http",
                            "for=192.0.2.50, for=\"10.0.0.3"}) {
    headers g;
    g.insert("Forwarded", value);
    EXPECT_EQ(via_forwarded(g, "10.0.0.1"), "10.0.0.1") << value;
  }
}

// ------------------------------------------------------ header / cookie / query

TEST(Identify, HeaderCaseInsensitiveTrimmed) {
  headers h;
  h.insert("x-api-key", "  key-one, with a comma \t");
  const auto s = sources({"header:X-Api-Key"});
  EXPECT_EQ(id_of(s, h), "key-one, with a comma") << "a comma inside one field line is part of the value";
  auto r = identify(s, h, "/", ip("203.0.113.9"), {}).who;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source, &s[0]);
}

// Backends disagree about which of several values counts (the first, the
// last, all joined): the gate refuses instead of choosing one.
TEST(Identify, SeveralValuesOfOneSourceAreAmbiguous) {
  headers two;
  two.insert("X-Api-Key", "random");
  two.insert("x-api-key", "k1");
  EXPECT_EQ(id_of(sources({"header:X-Api-Key", "ip"}), two), "<ambiguous>") << "no fall-back past it";
  headers same;
  same.insert("X-Api-Key", "k1");
  same.insert("X-Api-Key", "k1");
  EXPECT_EQ(id_of(sources({"header:X-Api-Key"}), same), "<ambiguous>") << "two lines even when equal";
  headers one;
  one.insert("X-Api-Key", "k1");
  EXPECT_EQ(id_of(sources({"query:key"}), one, "/?key=a&key=k1"), "<ambiguous>");
  EXPECT_EQ(id_of(sources({"query:key"}), one, "/?key=a&k%65y=k1"), "<ambiguous>") << "decoded names compare";
  EXPECT_EQ(id_of(sources({"query:key"}), one, "/?key&key=k1"), "<ambiguous>");
  EXPECT_EQ(id_of(sources({"query:key"}), one, "/?key=k1&keys=a&akey=b"), "k1");
  headers cookies;
  cookies.insert("Cookie", "sid=a; theme=dark");
  cookies.insert("Cookie", "sid=k1");
  EXPECT_EQ(id_of(sources({"cookie:sid"}), cookies), "<ambiguous>");
  EXPECT_EQ(id_of(sources({"cookie:theme"}), cookies), "dark");
  headers one_line;
  one_line.insert("Cookie", "sid=a; sid=k1");
  EXPECT_EQ(id_of(sources({"cookie:sid"}), one_line), "<ambiguous>");
  headers auth;
  auth.insert("Authorization", "Bearer random");
  auth.insert("Authorization", "Bearer k1");
  EXPECT_EQ(id_of(sources({"token", "ip"}), auth), "<ambiguous>");
  headers mixed;
  mixed.insert("Authorization", "Basic dXNlcjpwYXNz");
  mixed.insert("Authorization", "Bearer k1");
  EXPECT_EQ(id_of(sources({"token"}), mixed), "<ambiguous>") << "whatever the schemes";
  // A source that already yielded one value ends the search: later ones are not read.
  EXPECT_EQ(id_of(sources({"header:X-Api-Key", "query:key"}), one, "/?key=a&key=b"), "k1");
  // The source that found several is named.
  const auto s = sources({"header:X-Other", "header:X-Api-Key"});
  EXPECT_EQ(identify(s, two, "/", ip("203.0.113.9"), {}).ambiguous, &s[1]);
}

TEST(RedactQuery, HashedParametersAreWrittenAsTheirHash) {
  const std::vector<std::string> names{"api_key", "token"};
  EXPECT_EQ(redact_query("/p?a=1&api_key=s3cret&b=2", names), "/p?a=1&api_key=" + hash_secret("s3cret") + "&b=2");
  EXPECT_EQ(redact_query("/p?api%5Fkey=s%33cret", names), "/p?api%5Fkey=" + hash_secret("s3cret"))
      << "the value the gate hashed: decoded";
  EXPECT_EQ(redact_query("/p?token=a&api_key=b&token=c", names),
            "/p?token=" + hash_secret("a") + "&api_key=" + hash_secret("b") + "&token=" + hash_secret("c"));
  EXPECT_EQ(redact_query("/p?api_keys=x&api_key=&api_key", names), "/p?api_keys=x&api_key=&api_key");
  EXPECT_EQ(redact_query("/p/api_key=x", names), "/p/api_key=x") << "no query";
  EXPECT_EQ(redact_query("/p?api_key=x", {}), "/p?api_key=x");
  EXPECT_EQ(redact_query("/p?a=1#&api_key=s3cret", names), "/p?a=1#&api_key=" + hash_secret("s3cret"))
      << "a fragment sent anyway is written redacted too";
  EXPECT_EQ(redact_query("/p#api_key=s3cret", names), "/p#api_key=" + hash_secret("s3cret"));
  const std::vector<std::string> twice{"api_key", "api_key"};
  EXPECT_EQ(redact_query("/p?api_key=s3cret", twice), "/p?api_key=" + hash_secret("s3cret"));
}

TEST(Identify, EmptyOrMissingHeaderFallsBack) {
  headers h;
  h.insert("X-Api-Key", "   ");
  EXPECT_EQ(id_of(sources({"header:X-Api-Key", "header:X-Other", "ip"}), h), "203.0.113.9");
  EXPECT_EQ(id_of(sources({"header:X-Api-Key"}), h), "<none>");
}

TEST(Identify, Cookie) {
  headers h;
  h.insert("Cookie", "sessionid=long; Session=upper;theme=dark ;  session = abc ");
  h.insert("Cookie", "late=1");
  EXPECT_EQ(id_of(sources({"cookie:session"}), h), "abc");
  EXPECT_EQ(id_of(sources({"cookie:Session"}), h), "upper");
  EXPECT_EQ(id_of(sources({"cookie:theme"}), h), "dark");
  EXPECT_EQ(id_of(sources({"cookie:late"}), h), "1");  // second Cookie line
  EXPECT_EQ(id_of(sources({"cookie:sess"}), h), "<none>");
  EXPECT_EQ(id_of(sources({"cookie:missing", "ip"}), h), "203.0.113.9");
}

TEST(Identify, CookieEdgeCases) {
  headers h;
  h.insert("Cookie", "flag; empty=; quoted=\"q v\"; eq=a=b;;");
  EXPECT_EQ(id_of(sources({"cookie:flag"}), h), "<none>");  // no '=' : not a pair
  EXPECT_EQ(id_of(sources({"cookie:empty", "header:Cookie"}), h), "flag; empty=; quoted=\"q v\"; eq=a=b;;");
  EXPECT_EQ(id_of(sources({"cookie:quoted"}), h), "q v");
  EXPECT_EQ(id_of(sources({"cookie:eq"}), h), "a=b");
  headers none;
  EXPECT_EQ(id_of(sources({"cookie:a"}), none), "<none>");
}

TEST(Identify, Query) {
  headers h;
  const auto s = sources({"query:key"});
  EXPECT_EQ(id_of(s, h, "/p?a=1&key=abc"), "abc");
  EXPECT_EQ(id_of(s, h, "/p?keys=no&key=yes"), "yes");
  EXPECT_EQ(id_of(s, h, "/p?Key=no&key=yes"), "yes");
  EXPECT_EQ(id_of(s, h, "/p?key=a%20b%2Fc%3d"), "a b/c=");
  EXPECT_EQ(id_of(s, h, "/p?key=a+b"), "a b");
  EXPECT_EQ(id_of(s, h, "/p?k%65y=encoded-name"), "encoded-name");
  EXPECT_EQ(id_of(s, h, "/p?key=bad%zz%4"), "bad%zz%4");  // malformed escapes kept
  EXPECT_EQ(id_of(s, h, "/p?key=v#frag"), "v");
  EXPECT_EQ(id_of(s, h, "/p?key=x=y"), "x=y");
}

TEST(Identify, QueryEdgeCasesFallBack) {
  headers h;
  const auto s = sources({"query:key", "ip"});
  EXPECT_EQ(id_of(s, h, "/p"), "203.0.113.9");
  EXPECT_EQ(id_of(s, h, "/p?"), "203.0.113.9");
  EXPECT_EQ(id_of(s, h, "/p?key"), "203.0.113.9");
  EXPECT_EQ(id_of(s, h, "/p?key="), "203.0.113.9");
  EXPECT_EQ(id_of(s, h, "/p?other=1&&"), "203.0.113.9");
  EXPECT_EQ(id_of(s, h, "/p#?key=frag"), "203.0.113.9");
}

// ---------------------------------------------------------------- token

TEST(Identify, TokenIsHashedNeverRaw) {
  const std::string token = "s3cr3t-T0ken.value";
  headers h;
  h.insert("Authorization", "bEaReR   " + token + " ");
  const auto r = identify(sources({"token"}), h, "/", ip("203.0.113.9"), {}).who;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->value, hash_secret(token));
  EXPECT_EQ(r->value.find(token), std::string::npos);
  EXPECT_EQ(r->value.rfind("sha256:", 0), 0u);
}

TEST(Identify, AnySourceMarkedHashYieldsAHash) {
  headers h;
  h.insert("X-API-Key", "live_k3y");
  h.insert("Cookie", "sid=sess10n");
  h.insert("Authorization", "Bearer t0ken");
  auto hashed = [](std::string_view text, bool hash) {
    auto s = *config::parse_identifier_source(text);
    s.hash = hash;
    return std::vector<src>{s};
  };
  EXPECT_EQ(id_of(hashed("header:X-API-Key", true), h), hash_secret("live_k3y"));
  EXPECT_EQ(id_of(hashed("cookie:sid", true), h), hash_secret("sess10n"));
  EXPECT_EQ(id_of(hashed("query:k", true), h, "/?k=q"), hash_secret("q"));
  EXPECT_EQ(id_of(hashed("header:X-API-Key", false), h), "live_k3y");
  EXPECT_EQ(id_of(hashed("token", false), h), "t0ken") << "the operator's choice";
  // An absent value stays absent rather than becoming the hash of nothing.
  EXPECT_EQ(id_of(std::vector<src>{hashed("header:X-Other", true)[0], *config::parse_identifier_source("ip")}, h),
            "203.0.113.9");
}

TEST(Identify, TokenRequiresBearerScheme) {
  const auto s = sources({"token", "ip"});
  headers basic;
  basic.insert("Authorization", "Basic dXNlcjpwYXNz");
  EXPECT_EQ(id_of(s, basic), "203.0.113.9");
  headers empty;
  empty.insert("Authorization", "Bearer   ");
  EXPECT_EQ(id_of(s, empty), "203.0.113.9");
  headers glued;
  glued.insert("Authorization", "Bearerabc");
  EXPECT_EQ(id_of(s, glued), "203.0.113.9");
  headers none;
  EXPECT_EQ(id_of(s, none), "203.0.113.9");
}

// ------------------------------------------------------ order / long values

TEST(Identify, FirstSourceThatYieldsWins) {
  const auto s = sources({"header:X-Api-Key", "cookie:session", "query:key", "ip"});
  headers h;
  EXPECT_EQ(id_of(s, h, "/"), "203.0.113.9");
  EXPECT_EQ(id_of(s, h, "/?key=q"), "q");
  h.insert("Cookie", "session=c");
  EXPECT_EQ(id_of(s, h, "/?key=q"), "c");
  h.insert("X-Api-Key", "k");
  auto r = identify(s, h, "/?key=q", ip("203.0.113.9"), {}).who;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->value, "k");
  EXPECT_EQ(r->source, &s[0]);
  // identity::source points into the caller's list, which must outlive it.
  const auto fallback = sources({"cookie:nope", "ip"});
  r = identify(fallback, h, "/", ip("203.0.113.9"), {}).who;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source, &fallback[1]);
}

TEST(Identify, NothingYieldsNoIdentity) {
  headers h;
  EXPECT_FALSE(
      identify(sources({"header:A", "cookie:b", "query:c", "token", "jwt:sub"}), h, "/", ip("192.0.2.1"), {}).who);
  EXPECT_FALSE(identify({}, h, "/", ip("192.0.2.1"), {}).who);
}

TEST(Identify, OverLongValueIsHashed) {
  const std::string exact(1024, 'a');
  const std::string over(1025, 'a');
  headers h;
  h.insert("X-Exact", exact);
  h.insert("X-Over", over);
  EXPECT_EQ(id_of(sources({"header:X-Exact"}), h), exact);
  EXPECT_EQ(id_of(sources({"header:X-Over"}), h), hash_secret(over));
  EXPECT_EQ(id_of(sources({"query:k"}), h, "/?k=" + over), hash_secret(over));
}

// ------------------------------------------------------------------- JWT

std::string b64url(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  while (!out.empty() && out.back() == '=') out.pop_back();
  for (auto& c : out) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  return out;
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), mac, &len);
  return std::string(reinterpret_cast<char*>(mac), len);
}

std::string digest_sign(EVP_PKEY* key, std::string_view data) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EXPECT_EQ(EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key), 1);
  std::size_t len = 0;
  EXPECT_EQ(EVP_DigestSign(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(data.data()), data.size()), 1);
  std::string sig(len, '\0');
  EXPECT_EQ(EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                           reinterpret_cast<const unsigned char*>(data.data()), data.size()),
            1);
  sig.resize(len);
  EVP_MD_CTX_free(ctx);
  return sig;
}

// DER ECDSA-Sig-Value -> JWS R || S.
std::string der_to_raw(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
  EXPECT_NE(sig, nullptr);
  const BIGNUM* r = nullptr;
  const BIGNUM* s = nullptr;
  ECDSA_SIG_get0(sig, &r, &s);
  std::string raw(64, '\0');
  BN_bn2binpad(r, reinterpret_cast<unsigned char*>(raw.data()), 32);
  BN_bn2binpad(s, reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
  ECDSA_SIG_free(sig);
  return raw;
}

std::string write_public_pem(EVP_PKEY* key, const std::string& name) {
  const auto path =
      (std::filesystem::temp_directory_path() / ("smockron-identify-" + std::to_string(getpid()) + "-" + name + ".pem"))
          .string();
  BIO* bio = BIO_new_file(path.c_str(), "w");
  EXPECT_NE(bio, nullptr);
  EXPECT_EQ(PEM_write_bio_PUBKEY(bio, key), 1);
  BIO_free(bio);
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

constexpr std::int64_t now = 1'700'000'000;
const std::string secret = "hs256-test-secret";

std::string payload_with(const std::string& extra = "") {
  return R"({"sub":"alice","uid":42,"big":18446744073709551615,"neg":-7,"admin":true,"f":1.5,"obj":{},"empty":"")" +
         extra + "}";
}

std::string sign_hs256(const std::string& payload, const std::string& key = secret,
                       const std::string& header = R"({"alg":"HS256","typ":"JWT"})") {
  const auto input = b64url(header) + "." + b64url(payload);
  return input + "." + b64url(hmac_sha256(key, input));
}

class Jwt : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    rsa_ = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<std::size_t>(2048));
    ec_ = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
    ec384_ = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-384");
    ASSERT_NE(rsa_, nullptr);
    ASSERT_NE(ec_, nullptr);
    ASSERT_NE(ec384_, nullptr);
    rsa_pem_ = write_public_pem(rsa_, "rsa");
    ec_pem_ = write_public_pem(ec_, "ec");
    ec384_pem_ = write_public_pem(ec384_, "ec384");
  }
  static void TearDownTestSuite() {
    EVP_PKEY_free(rsa_);
    EVP_PKEY_free(ec_);
    EVP_PKEY_free(ec384_);
    std::filesystem::remove(rsa_pem_);
    std::filesystem::remove(ec_pem_);
    std::filesystem::remove(ec384_pem_);
  }

  static std::unique_ptr<jwt_verifier> make(const std::string& hs_secret, const std::string& key_file = "") {
    config::jwt_config cfg;
    cfg.hs256_secret = hs_secret;
    cfg.public_key_file = key_file;
    std::string error;
    auto v = jwt_verifier::create(cfg, error);
    EXPECT_TRUE(v) << error;
    return v;
  }

  static std::string sign_rs256(const std::string& payload) {
    const auto input = b64url(R"({"alg":"RS256","typ":"JWT"})") + "." + b64url(payload);
    return input + "." + b64url(digest_sign(rsa_, input));
  }
  static std::string sign_es256(const std::string& payload, EVP_PKEY* key = ec_) {
    const auto input = b64url(R"({"alg":"ES256","typ":"JWT"})") + "." + b64url(payload);
    return input + "." + b64url(der_to_raw(digest_sign(key, input)));
  }

  static inline EVP_PKEY* rsa_ = nullptr;
  static inline EVP_PKEY* ec_ = nullptr;
  static inline EVP_PKEY* ec384_ = nullptr;
  static inline std::string rsa_pem_;
  static inline std::string ec_pem_;
  static inline std::string ec384_pem_;
};

// Flips one bit of the signature's first character (still valid base64url).
std::string tamper_signature(std::string token) {
  const auto dot = token.rfind('.');
  char& c = token[dot + 1];
  c = c == 'A' ? 'B' : 'A';
  return token;
}

// Swaps the payload for another one, keeping header and signature.
std::string swap_payload(const std::string& token, const std::string& payload) {
  const auto d1 = token.find('.');
  const auto d2 = token.rfind('.');
  return token.substr(0, d1 + 1) + b64url(payload) + token.substr(d2);
}

TEST_F(Jwt, Hs256Valid) {
  const auto v = make(secret);
  const auto t = sign_hs256(payload_with());
  EXPECT_EQ(v->claim(t, "sub", now), "alice");
  EXPECT_EQ(v->claim(t, "uid", now), "42");
}

TEST_F(Jwt, ClaimTypes) {
  const auto v = make(secret);
  const auto t = sign_hs256(payload_with());
  EXPECT_EQ(v->claim(t, "big", now), "18446744073709551615");
  EXPECT_EQ(v->claim(t, "neg", now), "-7");
  EXPECT_EQ(v->claim(t, "admin", now), std::nullopt);
  EXPECT_EQ(v->claim(t, "f", now), std::nullopt);
  EXPECT_EQ(v->claim(t, "obj", now), std::nullopt);
  EXPECT_EQ(v->claim(t, "missing", now), std::nullopt);
  EXPECT_EQ(v->claim(t, "empty", now), "");  // identify() then moves on
}

TEST_F(Jwt, Hs256BadSignature) {
  const auto v = make(secret);
  const auto t = sign_hs256(payload_with());
  EXPECT_EQ(v->claim(tamper_signature(t), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(swap_payload(t, R"({"sub":"mallory"})"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_hs256(payload_with(), "other-secret"), "sub", now), std::nullopt);
  // Truncated signature, empty signature.
  EXPECT_EQ(v->claim(t.substr(0, t.size() - 4), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(t.substr(0, t.rfind('.') + 1), "sub", now), std::nullopt);
}

TEST_F(Jwt, ExpiryAndNotBeforeWithLeeway) {
  const auto v = make(secret);  // default leeway 30 s
  auto at = [&](const std::string& extra) { return v->claim(sign_hs256(payload_with(extra)), "sub", now); };
  EXPECT_EQ(at(",\"exp\":" + std::to_string(now + 3600)), "alice");
  EXPECT_EQ(at(",\"exp\":" + std::to_string(now - 3600)), std::nullopt);  // expired
  EXPECT_EQ(at(",\"exp\":" + std::to_string(now - 10)), "alice");         // within leeway
  EXPECT_EQ(at(",\"exp\":" + std::to_string(now - 30)), std::nullopt);    // exp must be > now - leeway
  EXPECT_EQ(at(",\"exp\":" + std::to_string(now - 29)), "alice");
  EXPECT_EQ(at(",\"exp\":1700000000.5"), "alice");                        // NumericDate may be fractional
  EXPECT_EQ(at(",\"nbf\":" + std::to_string(now + 3600)), std::nullopt);  // not yet valid
  EXPECT_EQ(at(",\"nbf\":" + std::to_string(now + 30)), "alice");         // within leeway
  EXPECT_EQ(at(",\"nbf\":" + std::to_string(now + 31)), std::nullopt);
  EXPECT_EQ(at(",\"nbf\":" + std::to_string(now - 5)), "alice");
  EXPECT_EQ(at(",\"exp\":\"tomorrow\""), std::nullopt);  // not a number
  EXPECT_EQ(at(",\"nbf\":null"), std::nullopt);

  config::jwt_config cfg;
  cfg.hs256_secret = secret;
  cfg.leeway = std::chrono::seconds(0);
  std::string error;
  const auto strict = jwt_verifier::create(cfg, error);
  ASSERT_TRUE(strict) << error;
  EXPECT_EQ(strict->claim(sign_hs256(payload_with(",\"exp\":" + std::to_string(now - 10))), "sub", now), std::nullopt);
  EXPECT_EQ(strict->claim(sign_hs256(payload_with(",\"exp\":" + std::to_string(now + 1))), "sub", now), "alice");
}

TEST_F(Jwt, AlgNoneRejected) {
  const auto v = make(secret);
  const auto unsigned_token = b64url(R"({"alg":"none"})") + "." + b64url(payload_with()) + ".";
  EXPECT_EQ(v->claim(unsigned_token, "sub", now), std::nullopt);
  // Also when something sits in the signature slot.
  EXPECT_EQ(v->claim(unsigned_token + "AAAA", "sub", now), std::nullopt);
  // And with a key configured.
  EXPECT_EQ(make("", rsa_pem_)->claim(unsigned_token, "sub", now), std::nullopt);
}

TEST_F(Jwt, AlgMismatchRejected) {
  // The classic confusion attack: HS256 "signed" with the RSA public key text.
  const auto rsa_verifier = make("", rsa_pem_);
  const auto pem = read_file(rsa_pem_);
  ASSERT_FALSE(pem.empty());
  EXPECT_EQ(rsa_verifier->claim(sign_hs256(payload_with(), pem), "sub", now), std::nullopt);
  EXPECT_EQ(rsa_verifier->claim(sign_hs256(payload_with()), "sub", now), std::nullopt);
  // ES256 token, RSA key configured; RS256 token, EC key configured.
  EXPECT_EQ(rsa_verifier->claim(sign_es256(payload_with()), "sub", now), std::nullopt);
  EXPECT_EQ(make("", ec_pem_)->claim(sign_rs256(payload_with()), "sub", now), std::nullopt);
  // RS256 token, only an HMAC secret configured.
  EXPECT_EQ(make(secret)->claim(sign_rs256(payload_with()), "sub", now), std::nullopt);
  // A valid HS256 signature under a header claiming another alg.
  EXPECT_EQ(make(secret)->claim(sign_hs256(payload_with(), secret, R"({"alg":"HS512"})"), "sub", now), std::nullopt);
  EXPECT_EQ(make(secret)->claim(sign_hs256(payload_with(), secret, R"({"alg":"hs256"})"), "sub", now), std::nullopt);
}

TEST_F(Jwt, SecretAndKeyBothAccepted) {
  const auto v = make(secret, rsa_pem_);
  EXPECT_EQ(v->claim(sign_hs256(payload_with()), "sub", now), "alice");
  EXPECT_EQ(v->claim(sign_rs256(payload_with()), "sub", now), "alice");
  EXPECT_EQ(v->claim(sign_es256(payload_with()), "sub", now), std::nullopt);
}

TEST_F(Jwt, MalformedHeaderOrEncoding) {
  const auto v = make(secret);
  const auto good = sign_hs256(payload_with());
  EXPECT_EQ(v->claim(good, "sub", now), "alice");
  // Invalid base64url characters (standard alphabet, padding, whitespace).
  const auto d1 = good.find('.');
  EXPECT_EQ(v->claim("eyJ+" + good.substr(4), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(good.substr(0, d1) + "=" + good.substr(d1), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(" " + good, "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(good + "*", "sub", now), std::nullopt);
  // Impossible length (4n+1 characters).
  EXPECT_EQ(v->claim("A." + good.substr(d1 + 1), "sub", now), std::nullopt);
  // Header without alg, header not an object, header not JSON.
  EXPECT_EQ(v->claim(sign_hs256(payload_with(), secret, R"({"typ":"JWT"})"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_hs256(payload_with(), secret, R"(["HS256"])"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_hs256(payload_with(), secret, R"({"alg":"HS256")"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_hs256(payload_with(), secret, R"({"alg":7})"), "sub", now), std::nullopt);
  // Payload not a JSON object, even when correctly signed.
  EXPECT_EQ(v->claim(sign_hs256("[1,2]"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_hs256("not json"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_hs256("{\"sub\":\"\xff\"}"), "sub", now), std::nullopt);  // invalid UTF-8
  // Critical extensions are not supported.
  EXPECT_EQ(v->claim(sign_hs256(payload_with(), secret, R"({"alg":"HS256","crit":["b64"],"b64":false})"), "sub", now),
            std::nullopt);
}

TEST_F(Jwt, WrongSegmentCount) {
  const auto v = make(secret);
  const auto good = sign_hs256(payload_with());
  const auto d2 = good.rfind('.');
  EXPECT_EQ(v->claim(good.substr(0, d2), "sub", now), std::nullopt);  // two segments
  EXPECT_EQ(v->claim(good + ".AAAA", "sub", now), std::nullopt);      // four
  EXPECT_EQ(v->claim("", "sub", now), std::nullopt);
  EXPECT_EQ(v->claim("..", "sub", now), std::nullopt);
  EXPECT_EQ(v->claim("opaque-token", "sub", now), std::nullopt);
}

TEST_F(Jwt, Rs256ValidAndTampered) {
  const auto v = make("", rsa_pem_);
  const auto t = sign_rs256(payload_with(",\"exp\":" + std::to_string(now + 60)));
  EXPECT_EQ(v->claim(t, "sub", now), "alice");
  EXPECT_EQ(v->claim(tamper_signature(t), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(swap_payload(t, R"({"sub":"mallory"})"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(t, "sub", now + 3600), std::nullopt);  // expired later
}

TEST_F(Jwt, Es256ValidAndTampered) {
  const auto v = make("", ec_pem_);
  const auto t = sign_es256(payload_with());
  EXPECT_EQ(v->claim(t, "sub", now), "alice");
  EXPECT_EQ(v->claim(t, "uid", now), "42");
  EXPECT_EQ(v->claim(tamper_signature(t), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(swap_payload(t, R"({"sub":"mallory"})"), "sub", now), std::nullopt);
  // A DER signature where JWS wants R || S.
  const auto input = t.substr(0, t.rfind('.'));
  EXPECT_EQ(v->claim(input + "." + b64url(digest_sign(ec_, input)), "sub", now), std::nullopt);
  // Signed by another key.
  EVP_PKEY* other = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(v->claim(sign_es256(payload_with(), other), "sub", now), std::nullopt);
  EVP_PKEY_free(other);
}

TEST_F(Jwt, CreateRejectsUnusableKeys) {
  std::string error;
  config::jwt_config cfg;
  cfg.public_key_file = "/nonexistent/smockron/key.pem";
  EXPECT_EQ(jwt_verifier::create(cfg, error), nullptr);
  EXPECT_NE(error.find("/nonexistent/smockron/key.pem"), std::string::npos) << error;

  const auto garbage =
      (std::filesystem::temp_directory_path() / ("smockron-identify-" + std::to_string(getpid()) + "-garbage.pem"))
          .string();
  std::ofstream(garbage) << "-----BEGIN PUBLIC KEY-----\nnot base64!\n-----END PUBLIC KEY-----\n";
  error.clear();
  cfg.public_key_file = garbage;
  EXPECT_EQ(jwt_verifier::create(cfg, error), nullptr);
  EXPECT_FALSE(error.empty());
  std::filesystem::remove(garbage);

  error.clear();
  cfg.public_key_file = ec384_pem_;  // ES256 needs P-256
  EXPECT_EQ(jwt_verifier::create(cfg, error), nullptr);
  EXPECT_NE(error.find("P-256"), std::string::npos) << error;
}

// The JWK (RFC 7517) of a public key: RSA as n/e, EC P-256 as x/y.
std::string jwk_of(EVP_PKEY* key, const std::string& kid) {
  std::string out = "{\"kid\":\"" + kid + "\",";
  if (EVP_PKEY_is_a(key, "RSA")) {
    BIGNUM* n = nullptr;
    BIGNUM* e = nullptr;
    EXPECT_EQ(EVP_PKEY_get_bn_param(key, "n", &n), 1);
    EXPECT_EQ(EVP_PKEY_get_bn_param(key, "e", &e), 1);
    auto bytes = [](const BIGNUM* bn) {
      std::string b(static_cast<std::size_t>(BN_num_bytes(bn)), '\0');
      BN_bn2bin(bn, reinterpret_cast<unsigned char*>(b.data()));
      return b;
    };
    out += "\"kty\":\"RSA\",\"n\":\"" + b64url(bytes(n)) + "\",\"e\":\"" + b64url(bytes(e)) + "\"}";
    BN_free(n);
    BN_free(e);
  } else {
    unsigned char pub[65];
    std::size_t len = 0;
    EXPECT_EQ(EVP_PKEY_get_octet_string_param(key, "pub", pub, sizeof pub, &len), 1);
    EXPECT_EQ(len, 65u);
    const std::string point(reinterpret_cast<char*>(pub), len);
    out += "\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"" + b64url(point.substr(1, 32)) + "\",\"y\":\"" +
           b64url(point.substr(33, 32)) + "\"}";
  }
  return out;
}

std::string sign_with(EVP_PKEY* key, const std::string& header, const std::string& payload) {
  const auto input = b64url(header) + "." + b64url(payload);
  const auto sig = digest_sign(key, input);
  return input + "." + b64url(EVP_PKEY_is_a(key, "EC") ? der_to_raw(sig) : sig);
}

class Jwks : public Jwt {
protected:
  void TearDown() override { std::filesystem::remove(path_); }

  std::unique_ptr<jwt_verifier> make_jwks(const std::string& keys, std::string* error_out = nullptr) {
    std::ofstream(path_) << "{\"keys\":[" << keys << "]}";
    config::jwt_config cfg;
    cfg.jwks_file = path_;
    std::string error;
    auto v = jwt_verifier::create(cfg, error);
    if (error_out != nullptr) *error_out = error;
    return v;
  }

  std::string path_ =
      (std::filesystem::temp_directory_path() / ("smockron-identify-" + std::to_string(getpid()) + ".jwks")).string();
};

TEST_F(Jwks, KeysAreChosenByKid) {
  EVP_PKEY* rsa2 = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<std::size_t>(2048));
  ASSERT_NE(rsa2, nullptr);
  const auto v = make_jwks(jwk_of(rsa_, "r1") + "," + jwk_of(rsa2, "r2") + "," + jwk_of(ec_, "e1") +
                           R"(,{"kid":"h1","kty":"oct","k":")" + b64url(secret) + "\"}");
  ASSERT_TRUE(v);
  const auto p = payload_with();
  EXPECT_EQ(v->claim(sign_with(rsa_, R"({"alg":"RS256","kid":"r1"})", p), "sub", now), "alice");
  EXPECT_EQ(v->claim(sign_with(rsa2, R"({"alg":"RS256","kid":"r2"})", p), "sub", now), "alice");
  EXPECT_EQ(v->claim(sign_with(ec_, R"({"alg":"ES256","kid":"e1"})", p), "sub", now), "alice");
  EXPECT_EQ(v->claim(sign_hs256(p, secret, R"({"alg":"HS256","kid":"h1"})"), "sub", now), "alice");
  // Without kid, any key of the token's algorithm may have signed it.
  EXPECT_EQ(v->claim(sign_with(rsa2, R"({"alg":"RS256"})", p), "sub", now), "alice");
  // A kid names one key: another key's signature under it, an unknown kid, a kid that is not a string.
  EXPECT_EQ(v->claim(sign_with(rsa2, R"({"alg":"RS256","kid":"r1"})", p), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_with(rsa_, R"({"alg":"RS256","kid":"r9"})", p), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_with(rsa_, R"({"alg":"RS256","kid":1})", p), "sub", now), std::nullopt);
  // The key pins the algorithm: an RS256 key's kid on an ES256 or HS256 token.
  EXPECT_EQ(v->claim(sign_with(ec_, R"({"alg":"ES256","kid":"r1"})", p), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_hs256(p, secret, R"({"alg":"HS256","kid":"r1"})"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(b64url(R"({"alg":"none","kid":"h1"})") + "." + b64url(p) + ".", "sub", now), std::nullopt);
  EVP_PKEY_free(rsa2);
}

TEST_F(Jwks, KeysForOtherUsesAreSkipped) {
  // An identity provider's set holds encryption keys and other algorithms beside its signing keys.
  const auto v = make_jwks(R"({"kid":"enc","kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"},)"
                           R"({"kid":"ps","kty":"RSA","alg":"PS256","n":"AQAB","e":"AQAB"},)"
                           R"({"kid":"p384","kty":"EC","crv":"P-384","x":"AA","y":"AA"},)"
                           R"({"kid":"okp","kty":"OKP","crv":"Ed25519","x":"AA"},)" +
                           jwk_of(ec_, "e1"));
  ASSERT_TRUE(v);
  EXPECT_EQ(v->claim(sign_with(ec_, R"({"alg":"ES256","kid":"e1"})", payload_with()), "sub", now), "alice");
}

TEST_F(Jwks, UnusableSetsAreErrors) {
  std::string error;
  EXPECT_EQ(make_jwks(R"({"kid":"enc","kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"})", &error), nullptr);
  EXPECT_NE(error.find("no RS256, ES256 or HS256 signing key"), std::string::npos) << error;
  EXPECT_EQ(make_jwks(R"({"kid":"bad","kty":"RSA","n":"not base64!","e":"AQAB"})", &error), nullptr);
  EXPECT_NE(error.find("key \"bad\""), std::string::npos) << error;
  EXPECT_EQ(make_jwks(R"({"kid":"short","kty":"EC","crv":"P-256","x":"AAAA","y":"AAAA"})", &error), nullptr);
  EXPECT_NE(error.find("32-byte"), std::string::npos) << error;
  // 32 bytes each, but not a point on the curve.
  const std::string zeros = b64url(std::string(32, '\0'));
  EXPECT_EQ(make_jwks(R"({"kid":"off","kty":"EC","crv":"P-256","x":")" + zeros + R"(","y":")" + zeros + "\"}", &error),
            nullptr);
  EXPECT_NE(error.find("not a valid public key"), std::string::npos) << error;
  EXPECT_EQ(make_jwks(R"({"kid":"h","kty":"oct"})", &error), nullptr);
  EXPECT_EQ(make_jwks("7", &error), nullptr);

  std::ofstream(path_) << "not json";
  config::jwt_config cfg;
  cfg.jwks_file = path_;
  EXPECT_EQ(jwt_verifier::create(cfg, error), nullptr);
  EXPECT_NE(error.find("\"keys\" array"), std::string::npos) << error;
  cfg.jwks_file = "/nonexistent/smockron.jwks";
  EXPECT_EQ(jwt_verifier::create(cfg, error), nullptr);
  EXPECT_NE(error.find("/nonexistent/smockron.jwks"), std::string::npos) << error;
}

TEST_F(Jwt, IssuerAndAudience) {
  config::jwt_config cfg;
  cfg.hs256_secret = secret;
  cfg.issuer = "https://idp.example";
  cfg.audience = "orders";
  std::string error;
  const auto v = jwt_verifier::create(cfg, error);
  ASSERT_TRUE(v) << error;
  auto with = [&](const std::string& extra) { return v->claim(sign_hs256(payload_with(extra)), "sub", now); };
  EXPECT_EQ(with(R"(,"iss":"https://idp.example","aud":"orders")"), "alice");
  EXPECT_EQ(with(R"(,"iss":"https://idp.example","aud":["billing","orders"])"), "alice");
  EXPECT_EQ(with(R"(,"iss":"https://idp.example","aud":"billing")"), std::nullopt) << "meant for another service";
  EXPECT_EQ(with(R"(,"iss":"https://idp.example","aud":["billing"])"), std::nullopt);
  EXPECT_EQ(with(R"(,"iss":"https://idp.example")"), std::nullopt) << "no aud";
  EXPECT_EQ(with(R"(,"iss":"https://evil.example","aud":"orders")"), std::nullopt) << "another issuer";
  EXPECT_EQ(with(R"(,"aud":"orders")"), std::nullopt) << "no iss";
  EXPECT_EQ(with(R"(,"iss":["https://idp.example"],"aud":"orders")"), std::nullopt);
  EXPECT_EQ(with(R"(,"iss":"https://idp.example","aud":7)"), std::nullopt);
  // Unset, neither is checked.
  EXPECT_EQ(make(secret)->claim(sign_hs256(payload_with(R"(,"iss":"anyone","aud":"anything")")), "sub", now), "alice");
}

TEST(IpIdentifier, Ipv6ClientsAreGroupedByPrefix) {
  // One IPv6 client commonly owns a /64: the addresses in it are one identifier.
  EXPECT_EQ(ip_identifier(ip("2001:db8:1:2:aaaa::1"), 64), "2001:db8:1:2::/64");
  EXPECT_EQ(ip_identifier(ip("2001:db8:1:2:ffff:1:2:3"), 64), "2001:db8:1:2::/64");
  EXPECT_EQ(ip_identifier(ip("2001:db8:1:2:aaaa::1"), 48), "2001:db8:1::/48");
  EXPECT_EQ(ip_identifier(ip("2001:db8:1:2:aaaa::1"), 60), "2001:db8:1::/60");
  EXPECT_EQ(ip_identifier(ip("2001:db8:1:2:aaaa::1"), 128), "2001:db8:1:2:aaaa::1");
  EXPECT_EQ(ip_identifier(ip("192.0.2.7"), 64), "192.0.2.7") << "IPv4 (and v4-mapped) as is";
  EXPECT_EQ(ip_identifier(ip("::ffff:192.0.2.7"), 64), "192.0.2.7");
  EXPECT_EQ(ip_identifier(ip("::1"), 64), "::/64");
}

TEST_F(Jwt, WithoutAKeyNoClaimIsBelieved) {
  // Claims read unverified would give every request with a fresh `sub` a fresh
  // budget; the configuration refuses a jwt: source without a key as well.
  const auto v = make("");
  const auto unsigned_token = b64url(R"({"alg":"none"})") + "." + b64url(payload_with()) + ".";
  EXPECT_EQ(v->claim(unsigned_token, "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_hs256(payload_with(), "whatever"), "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_rs256(payload_with()), "sub", now), std::nullopt);
}

TEST_F(Jwt, AlgNoneNeverVerifies) {
  const auto v = make(secret);
  const auto unsigned_token = b64url(R"({"alg":"none"})") + "." + b64url(payload_with()) + ".";
  EXPECT_EQ(v->claim(unsigned_token, "sub", now), std::nullopt);
  EXPECT_EQ(v->claim(sign_rs256(payload_with()), "sub", now), std::nullopt) << "an HS256 secret never verifies RS256";
}

TEST_F(Jwt, ThroughIdentify) {
  const auto v = make(secret);
  const auto s = sources({"jwt:sub", "token", "ip"});
  identify_context ctx;
  ctx.now_s = now;

  headers good;
  good.insert("Authorization", "Bearer " + sign_hs256(payload_with()));
  // No verifier in the context: jwt:* yields nothing, the next source hashes the token.
  auto r = identify(s, good, "/", ip("192.0.2.1"), ctx).who;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source->type, kind::token);
  EXPECT_EQ(r->value.rfind("sha256:", 0), 0u);

  ctx.jwt = v.get();
  r = identify(s, good, "/", ip("192.0.2.1"), ctx).who;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->value, "alice");
  EXPECT_EQ(r->source->type, kind::jwt);
  EXPECT_EQ(id_of(sources({"jwt:uid"}), good, "/", ip("192.0.2.1"), ctx), "42");
  EXPECT_EQ(id_of(sources({"jwt:empty", "ip"}), good, "/", ip("192.0.2.1"), ctx), "192.0.2.1");
  EXPECT_EQ(id_of(sources({"jwt:admin", "ip"}), good, "/", ip("192.0.2.1"), ctx), "192.0.2.1");

  headers bad;
  bad.insert("Authorization", "Bearer " + tamper_signature(sign_hs256(payload_with())));
  r = identify(s, bad, "/", ip("192.0.2.1"), ctx).who;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source->type, kind::token);

  headers expired;
  expired.insert("Authorization", "Bearer " + sign_hs256(payload_with(",\"exp\":" + std::to_string(now - 3600))));
  EXPECT_EQ(id_of(sources({"jwt:sub", "ip"}), expired, "/", ip("192.0.2.1"), ctx), "192.0.2.1");

  // An over-long claim is hashed like any other value.
  const std::string long_sub(2000, 'x');
  headers long_claim;
  long_claim.insert("Authorization", "Bearer " + sign_hs256(R"({"sub":")" + long_sub + "\"}"));
  EXPECT_EQ(id_of(sources({"jwt:sub"}), long_claim, "/", ip("192.0.2.1"), ctx), hash_secret(long_sub));
}

}  // namespace
}  // namespace smockron::proxy
