// host:port and CIDR parsing.
#include "shared/base/net.hpp"

#include <gtest/gtest.h>

using namespace smockron;

TEST(Net, ParseIpRefusesAnEmbeddedNul) {
  EXPECT_TRUE(parse_ip("192.0.2.1"));
  EXPECT_FALSE(parse_ip(std::string_view("192.0.2.1\0junk", 14)));
  EXPECT_FALSE(parse_ip(std::string_view("2001:db8::1\0", 12)));
}

TEST(Net, HostPort) {
  EXPECT_EQ(parse_host_port("127.0.0.1:8080"), (host_port{"127.0.0.1", 8080}));
  EXPECT_EQ(parse_host_port("[::1]:80"), (host_port{"::1", 80}));
  EXPECT_EQ(parse_host_port("backend.local:0"), (host_port{"backend.local", 0}));
  EXPECT_EQ((host_port{"::1", 80}).to_string(), "[::1]:80");
  for (auto bad : {"127.0.0.1", ":80", "h:", "h:65536", "h:8o", "::1:80", "[::1]80", "[::1"}) {
    EXPECT_FALSE(parse_host_port(bad)) << bad;
  }
}

TEST(Net, Cidr) {
  auto c = parse_cidr("10.0.0.0/8");
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->contains(*parse_ip("10.200.3.4")));
  EXPECT_FALSE(c->contains(*parse_ip("11.0.0.1")));
  EXPECT_FALSE(c->contains(*parse_ip("::1")));
  auto one = parse_cidr("192.168.1.7");
  ASSERT_TRUE(one);
  EXPECT_TRUE(one->contains(*parse_ip("192.168.1.7")));
  EXPECT_FALSE(one->contains(*parse_ip("192.168.1.8")));
  auto v6 = parse_cidr("fd00::/8");
  ASSERT_TRUE(v6);
  EXPECT_TRUE(v6->contains(*parse_ip("fd12::5")));
  EXPECT_FALSE(v6->contains(*parse_ip("fe80::1")));
  auto all = parse_cidr("0.0.0.0/0");
  ASSERT_TRUE(all);
  EXPECT_TRUE(all->contains(*parse_ip("8.8.8.8")));
  auto odd = parse_cidr("10.1.128.0/17");
  ASSERT_TRUE(odd);
  EXPECT_TRUE(odd->contains(*parse_ip("10.1.200.1")));
  EXPECT_FALSE(odd->contains(*parse_ip("10.1.100.1")));
  for (auto bad : {"10.0.0.0/33", "10.0.0/8", "::/129", "x/8", "10.0.0.0/", "10.0.0.0/-1", ""}) {
    EXPECT_FALSE(parse_cidr(bad)) << bad;
  }
}

TEST(Net, RedisUrl) {
  auto u = parse_redis_url("redis://127.0.0.1:6380/2");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->address, (host_port{"127.0.0.1", 6380}));
  EXPECT_EQ(u->db, 2);
  EXPECT_EQ(u->password, "");
  u = parse_redis_url("redis://redis");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->address, (host_port{"redis", 6379}));
  EXPECT_EQ(u->db, 0);
  u = parse_redis_url("redis://:s3cret@redis:6379/0");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->password, "s3cret");
  EXPECT_EQ(u->address, (host_port{"redis", 6379}));
  u = parse_redis_url("redis://user:pw@[::1]:7000/");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->password, "pw");
  EXPECT_EQ(u->address, (host_port{"::1", 7000}));
  u = parse_redis_url("redis://[::1]");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->address, (host_port{"::1", 6379}));
  for (const char* bad : {"127.0.0.1:6379", "redis://", "redis://host:port", "redis://host:6379/x",
                          "redis://host:6379/-1", "redis://host:99999", "redis://:pw@/0"}) {
    EXPECT_FALSE(parse_redis_url(bad)) << bad;
  }
}

TEST(Net, RedisSentinelUrl) {
  auto u = parse_redis_url("redis-sentinel://127.0.0.1:26379,10.0.0.2:26380,[::1]/smockron/3");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->sentinels, (std::vector<host_port>{{"127.0.0.1", 26379}, {"10.0.0.2", 26380}, {"::1", 26379}}));
  EXPECT_EQ(u->primary_name, "smockron");
  EXPECT_EQ(u->db, 3);
  u = parse_redis_url("redis-sentinel://:s3cret@sentinel/main");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->sentinels, (std::vector<host_port>{{"sentinel", 26379}}));
  EXPECT_EQ(u->primary_name, "main");
  EXPECT_EQ(u->password, "s3cret");
  EXPECT_EQ(u->db, 0);
  EXPECT_TRUE(parse_redis_url("redis://127.0.0.1:6379")->sentinels.empty());
  for (const char* bad : {"redis-sentinel://h:26379", "redis-sentinel://h:26379/", "redis-sentinel://h:26379/m/",
                          "redis-sentinel://h:26379/m/x", "redis-sentinel://h:26379,/m", "redis-sentinel://,h/m",
                          "redis-sentinel://h:99999/m", "redis-sentinel:///m", "sentinel://h/m"}) {
    EXPECT_FALSE(parse_redis_url(bad)) << bad;
  }
}

TEST(DnsEndpoint, NamesOfMastersParseAndEverythingElseIsRefused) {
  const auto a = parse_dns_endpoint("dns+tcp://smockron-master.default.svc.cluster.local.:10004");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->type, dns_endpoint::kind::address);
  EXPECT_EQ(a->name, "smockron-master.default.svc.cluster.local");
  EXPECT_EQ(a->port, 10004);
  const auto s = parse_dns_endpoint("srv+tcp://_accounting._tcp.smockron-master");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->type, dns_endpoint::kind::srv);
  EXPECT_EQ(s->name, "_accounting._tcp.smockron-master");
  for (const char* bad :
       {"dns+tcp://name", "dns+tcp://name:0", "dns+tcp://:10004", "dns+tcp://a..b:1", "dns+tcp://a b:1", "srv+tcp://",
        "srv+tcp://x:1", "srv+udp://x", "tcp://x:1", "dns+tcp://[::1]:1", "srv+tcp://."}) {
    EXPECT_FALSE(parse_dns_endpoint(bad)) << bad;
  }
  EXPECT_FALSE(parse_dns_endpoint("srv+tcp://" + std::string(64, 'a') + ".test")) << "a label of 64 bytes";
  EXPECT_FALSE(parse_dns_endpoint("srv+tcp://" + std::string(254, 'a'))) << "a name of 254 bytes";
  EXPECT_EQ(tcp_endpoint("10.0.0.7", 10004), "tcp://10.0.0.7:10004");
  EXPECT_EQ(tcp_endpoint("fd00::7", 10004), "tcp://[fd00::7]:10004");
}

TEST(Net, RedisClusterUrl) {
  auto u = parse_redis_url("redis-cluster://:pw@10.0.0.1:7000,10.0.0.2,[::1]:7002");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->cluster, (std::vector<host_port>{{"10.0.0.1", 7000}, {"10.0.0.2", 6379}, {"::1", 7002}}));
  EXPECT_EQ(u->password, "pw");
  EXPECT_TRUE(u->sentinels.empty());
  EXPECT_TRUE(parse_redis_url("redis://127.0.0.1:6379")->cluster.empty());
  for (const char* bad : {"redis-cluster://", "redis-cluster://h:7000/1", "redis-cluster://h:7000/",
                          "redis-cluster://h:x", "redis-cluster://h:7000,"}) {
    EXPECT_FALSE(parse_redis_url(bad)) << bad;
  }
}

TEST(Net, HttpUrl) {
  EXPECT_EQ(parse_http_url("http://collector:4318/v1/traces", "/x"), (http_url{"collector", 4318, "/v1/traces"}));
  EXPECT_EQ(parse_http_url("http://127.0.0.1", "/v1/traces"), (http_url{"127.0.0.1", 80, "/v1/traces"}));
  EXPECT_EQ(parse_http_url("http://[::1]:4318", "/v1/traces"), (http_url{"::1", 4318, "/v1/traces"}));
  for (const char* bad :
       {"https://c:4318", "http://", "http://:4318", "http://c:", "http://c:0", "http://c:70000", "http://c:43x",
        "http://u@c:1", "http://[::1:1", "http://[::1]x", "http://c/a b", "http://c/a\r\nX: y"}) {
    EXPECT_FALSE(parse_http_url(bad, "/")) << bad;
  }
}
