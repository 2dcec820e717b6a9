// The Redis Cluster client: slots as Redis computes them, the hash tag that
// keeps an identifier's keys in one slot, and the redirections (MOVED, ASK,
// TRYAGAIN, a node gone) against fake nodes on loopback that speak RESP and
// answer what each test scripts. A real cluster (3 primaries, 3 replicas, a
// failover under load): integration/test_redis_cluster.py.
#include "master/store/redis_cluster.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "master/store/reservation_record.hpp"
#include "master/store/state_record.hpp"
#include "tests/support/loopback.hpp"

using namespace smockron;
using namespace smockron::master;
using namespace std::string_literals;

TEST(RedisCluster, SlotsAreRedisOwn) {
  EXPECT_EQ(key_slot("123456789"), 0x31C3 % 16384);  // CRC16/XMODEM's check value
  EXPECT_EQ(key_slot("foo"), 12182);
  EXPECT_EQ(key_slot("somekey"), 11058);
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
  EXPECT_EQ(key_slot("foo{}{bar}"), key_slot("foo{}{bar}")) << "an empty tag: the whole key";
  EXPECT_NE(key_slot("foo{}{bar}"), key_slot("bar"));
  EXPECT_EQ(key_slot("foo{{bar}}zap"), key_slot("{bar")) << "the first '{' to the next '}'";
}

TEST(RedisCluster, AnIdentifiersKeysShareOneSlotAndReadBackAsWritten) {
  const std::string id("user}{x\0y", 9);  // braces and a NUL inside: still one slot, still read back
  const std::string keys[] = {store_key("api", id), override_key("api", id), reservation_key("host:1", "api", id, 7)};
  const std::uint16_t slot = key_slot(cluster_key(keys[0]));
  for (const auto& k : keys) {
    const std::string tagged = cluster_key(k);
    EXPECT_NE(tagged, k);
    EXPECT_EQ(key_slot(tagged), slot) << tagged;
    EXPECT_EQ(plain_key(tagged), k);
  }
  EXPECT_EQ(cluster_key(store_key("api", "a")), "smockron:{api\0a}"s);
  EXPECT_NE(key_slot(cluster_key(store_key("api", "a"))), key_slot(cluster_key(store_key("api", "b"))));
  EXPECT_EQ(cluster_key("other"), "other");
  EXPECT_EQ(plain_key("smockron:api\0a"s), "smockron:api\0a"s) << "an untagged key stays as it is";
}

namespace {

/// A Redis node on loopback that answers each command with what `answer`
/// returns (a RESP reply), and records every command it received.
class fake_node {
public:
  using handler = std::function<std::string(const std::vector<std::string>&)>;
  explicit fake_node(handler h) : answer_(std::move(h)) {
    fd_ = test_support::bind_loopback(port_);
    if (fd_ < 0) std::abort();
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_node() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::uint16_t port() const { return port_; }
  host_port at() const { return {"127.0.0.1", port_}; }
  std::vector<std::vector<std::string>> received() {
    std::lock_guard lock(mutex_);
    return received_;
  }
  void set(handler h) {
    std::lock_guard lock(mutex_);
    answer_ = std::move(h);
  }

private:
  void serve() {
    std::vector<int> clients;
    std::vector<std::string> buffers;
    while (!stop_) {
      std::vector<pollfd> fds{{fd_, POLLIN, 0}};
      for (int c : clients) fds.push_back({c, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        clients.push_back(::accept(fd_, nullptr, nullptr));
        buffers.emplace_back();
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char chunk[4096];
        const ssize_t n = ::read(fds[i].fd, chunk, sizeof chunk);
        if (n <= 0) continue;
        std::string& in = buffers[i - 1];
        in.append(chunk, static_cast<std::size_t>(n));
        std::vector<std::string> cmd;
        while (parse(in, cmd)) {
          std::string reply;
          {
            std::lock_guard lock(mutex_);
            received_.push_back(cmd);
            reply = answer_(cmd);
          }
          if (::write(fds[i].fd, reply.data(), reply.size()) < 0) break;
        }
      }
    }
    for (int c : clients) ::close(c);
  }
  // One "*N\r\n$len\r\narg\r\n..." off the front of `in`; false until it is whole.
  static bool parse(std::string& in, std::vector<std::string>& out) {
    out.clear();
    std::size_t at = 0;
    const auto line = [&](std::size_t& v) {
      const auto end = in.find("\r\n", at);
      if (end == std::string::npos) return false;
      v = std::stoul(in.substr(at + 1, end - at - 1));
      at = end + 2;
      return true;
    };
    std::size_t n = 0;
    if (in.empty() || in[0] != '*' || !line(n)) return false;
    for (std::size_t k = 0; k < n; ++k) {
      std::size_t len = 0;
      if (at >= in.size() || !line(len) || in.size() < at + len + 2) return false;
      out.push_back(in.substr(at, len));
      at += len + 2;
    }
    in.erase(0, at);
    return true;
  }

  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  handler answer_;
  std::vector<std::vector<std::string>> received_;
  std::thread thread_;
};

std::string slots_reply(const std::vector<std::tuple<int, int, std::uint16_t>>& ranges) {
  std::string r = "*" + std::to_string(ranges.size()) + "\r\n";
  for (const auto& [from, to, port] : ranges) {
    r += "*3\r\n:" + std::to_string(from) + "\r\n:" + std::to_string(to) +
         "\r\n*3\r\n$9\r\n127.0.0.1\r\n:" + std::to_string(port) + "\r\n$2\r\nid\r\n";
  }
  return r;
}

// Two primaries: A serves slots 0-8191, B 8192-16383 (as both say), each taking any SET.
struct two_nodes {
  std::unique_ptr<fake_node> a, b;
  two_nodes() {
    const auto node = [this](const std::vector<std::string>& c) -> std::string {
      if (c[0] == "CLUSTER") return slots_reply({{0, 8191, a->port()}, {8192, 16383, b->port()}});
      return "+OK\r\n";
    };
    a = std::make_unique<fake_node>(node);
    b = std::make_unique<fake_node>(node);
  }
};

std::vector<std::vector<std::string>> commands_named(fake_node& n, const std::string& name) {
  std::vector<std::vector<std::string>> out;
  for (auto& c : n.received()) {
    if (c[0] == name) out.push_back(c);
  }
  return out;
}

// A key on each side of slot 8192.
const std::string k_low = "{b}", k_high = "{a}";  // slots 3300 and 15495

}  // namespace

TEST(RedisCluster, EachCommandGoesToThePrimaryOfItsSlotPipelinedPerNode) {
  ASSERT_LT(key_slot(k_low), 8192);
  ASSERT_GE(key_slot(k_high), 8192);
  two_nodes n;
  redis_cluster c({.seeds = {n.a->at()}, .password = {}, .timeout = std::chrono::milliseconds(2000)});
  ASSERT_TRUE(c.refresh()) << c.error();
  EXPECT_EQ(c.primaries(), 2u);
  EXPECT_EQ(c.uncovered(), 0u);
  EXPECT_TRUE(c.ping());
  const auto out = c.run({{"SET", k_low, "1"}, {"SET", k_high, "2"}, {"SET", k_low, "3"}});
  EXPECT_TRUE(out.complete);
  EXPECT_EQ(out.ok, 3u);
  EXPECT_EQ(commands_named(*n.a, "SET"),
            (std::vector<std::vector<std::string>>{{"SET", k_low, "1"}, {"SET", k_low, "3"}}));
  EXPECT_EQ(commands_named(*n.b, "SET"), (std::vector<std::vector<std::string>>{{"SET", k_high, "2"}}));
}

TEST(RedisCluster, MovedUpdatesTheMapAndAskIsFollowedOnceWithAsking) {
  two_nodes n;
  redis_cluster c({.seeds = {n.a->at()}, .password = {}, .timeout = std::chrono::milliseconds(2000)});
  ASSERT_TRUE(c.refresh());
  const auto slot = std::to_string(key_slot(k_low));
  // The slot moved to B: A says MOVED, and its CLUSTER SLOTS (asked again after a MOVED) now says B.
  n.a->set([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "CLUSTER") return slots_reply({{0, 16383, n.b->port()}});
    return "-MOVED " + slot + " 127.0.0.1:" + std::to_string(n.b->port()) + "\r\n";
  });
  auto out = c.run({{"SET", k_low, "x"}});
  EXPECT_TRUE(out.complete);
  EXPECT_EQ(out.ok, 1u);
  EXPECT_EQ(c.redirects(), 1u);
  EXPECT_EQ(commands_named(*n.b, "SET").size(), 1u);
  out = c.run({{"SET", k_low, "y"}});
  EXPECT_EQ(c.redirects(), 1u) << "the map was updated: straight to B";

  // Migrating: B says ASK A for this one key; A takes it after ASKING, and the map still says B.
  n.a->set([](const std::vector<std::string>&) -> std::string { return "+OK\r\n"; });
  n.b->set([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "CLUSTER") return slots_reply({{0, 16383, n.b->port()}});
    if (cmd[1] == "asked")
      return "-ASK " + std::to_string(key_slot("asked")) + " 127.0.0.1:" + std::to_string(n.a->port()) + "\r\n";
    return "+OK\r\n";
  });
  out = c.run({{"SET", "asked", "z"}, {"SET", k_low, "w"}});
  EXPECT_TRUE(out.complete);
  EXPECT_EQ(out.ok, 2u);
  const auto at_a = n.a->received();
  ASSERT_GE(at_a.size(), 2u);
  EXPECT_EQ(at_a[at_a.size() - 2], std::vector<std::string>{"ASKING"});
  EXPECT_EQ(at_a.back(), (std::vector<std::string>{"SET", "asked", "z"}));
  c.run({{"SET", "asked", "again"}});
  EXPECT_EQ(n.b->received().back(), (std::vector<std::string>{"SET", "asked", "again"}))
      << "an ASK is for one command: the slot is still B's";
}

TEST(RedisCluster, AFailoverUnderWayIsRetriedAndANodeGoneLeavesTheBatchIncomplete) {
  two_nodes n;
  redis_cluster c({.seeds = {n.a->at()}, .password = {}, .timeout = std::chrono::milliseconds(2000)});
  ASSERT_TRUE(c.refresh());
  int tries = 0;
  n.b->set([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "CLUSTER") return slots_reply({{0, 8191, n.a->port()}, {8192, 16383, n.b->port()}});
    return ++tries == 1 ? "-TRYAGAIN Multiple keys request during rehashing of slot\r\n" : "+OK\r\n";
  });
  auto out = c.run({{"SET", k_high, "1"}});
  EXPECT_TRUE(out.complete);
  EXPECT_EQ(tries, 2);
  // Another error is the command's own: counted, not retried.
  n.b->set([](const std::vector<std::string>& cmd) -> std::string {
    return cmd[0] == "CLUSTER" ? std::string("-ERR no\r\n") : std::string("-WRONGTYPE Operation against a key\r\n");
  });
  out = c.run({{"SET", k_high, "1"}, {"SET", k_low, "2"}});
  EXPECT_TRUE(out.complete);
  EXPECT_EQ(out.refused, 1u);
  EXPECT_EQ(out.ok, 1u);
  // B gone: its commands are not done (the store sends the batch again later); A's are.
  const auto a_port = n.a->port(), b_port = n.b->port();  // A still names B (no failover yet)
  n.a->set([a_port, b_port](const std::vector<std::string>& cmd) -> std::string {
    return cmd[0] == "CLUSTER" ? slots_reply({{0, 8191, a_port}, {8192, 16383, b_port}}) : "+OK\r\n";
  });
  n.b.reset();
  out = c.run({{"SET", k_high, "1"}, {"SET", k_low, "2"}});
  EXPECT_FALSE(out.complete);
  EXPECT_EQ(out.ok, 1u);
  EXPECT_FALSE(c.ping());
  EXPECT_NE(c.error().find("127.0.0.1"), std::string::npos) << c.error();
}

TEST(RedisCluster, ScanReadsEveryPrimaryAndEachValueFromThePrimaryOfItsSlot) {
  two_nodes n;
  const auto scan_reply = [](const std::vector<std::string>& keys) {
    std::string r = "*2\r\n$1\r\n0\r\n*" + std::to_string(keys.size()) + "\r\n";
    for (const auto& k : keys) r += "$" + std::to_string(k.size()) + "\r\n" + k + "\r\n";
    return r;
  };
  n.a->set([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "CLUSTER") return slots_reply({{0, 8191, n.a->port()}, {8192, 16383, n.b->port()}});
    if (cmd[0] == "SCAN") return scan_reply({k_low, "gone"});
    return "$2\r\nv1\r\n";
  });
  n.b->set([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "SCAN") return scan_reply({k_high});
    // "gone" is in B's slots: A's SCAN named it (it was migrating), its GET goes to B, where it expired.
    if (cmd[0] == "GET" && cmd[1] == "gone") return "$-1\r\n";
    return "$2\r\nv2\r\n";
  });
  redis_cluster c({.seeds = {n.a->at()}, .password = {}, .timeout = std::chrono::milliseconds(2000)});
  ASSERT_TRUE(c.refresh());
  std::vector<std::pair<std::string, std::string>> seen;
  ASSERT_TRUE(c.scan("*", [&](std::string_view k, std::string_view v) {
    seen.emplace_back(k, v);
    return true;
  }));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, std::string>>{{k_high, "v2"}, {k_low, "v1"}}));
  for (const auto& cmd : n.a->received()) EXPECT_NE(cmd[0], "MGET") << "MGET would refuse keys of several slots";
  EXPECT_EQ(commands_named(*n.b, "GET").size(), 2u) << "{a} and gone, from B";
}
