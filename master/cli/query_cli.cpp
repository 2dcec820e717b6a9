// smockron-query: asks a master's UDP query endpoint one question, as
// scripts and non-HTTP applications do (the UDP rate limiter's protocol).
//
//   smockron-query [--server HOST:PORT] [--timeout MS] over_limit DOMAIN IDENTIFIER
//   smockron-query [--server HOST:PORT] [--timeout MS] get_stats DOMAIN IDENTIFIER
//   smockron-query [--server HOST:PORT] [--timeout MS] get_size
//   smockron-query [--admin HOST:PORT] [--timeout MS] top [DOMAIN] [N]
//   smockron-query keygen PATH
//
// `top` asks the master's admin endpoint (GET /top, HTTP) who is limited now
// and prints a table: per domain, the N identifiers limited most in the last
// minute (default 10).
//
// `keygen` writes a CURVE keypair for the links between daemons: PATH.key
// (the secret key, mode 0600) and PATH.pub (the public key), each in
// ZeroMQ's Z85 form on one line. It refuses to overwrite either.
//
// Prints the answer (without its request ID). Exit status: 0 answered (for
// over_limit: not over the limit), 1 over_limit answered "Y", 2 no answer in
// time (a client may then go on as if "N": fail-open), 64 usage.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "master/core/query.hpp"
#include "shared/base/net.hpp"
#include "shared/protocol/zmtp_curve.hpp"
#include "smockron/version.hpp"

namespace {

constexpr const char* k_usage =
    "usage: smockron-query [--server HOST:PORT] [--timeout MS] over_limit DOMAIN IDENTIFIER\n"
    "       smockron-query [--server HOST:PORT] [--timeout MS] get_stats DOMAIN IDENTIFIER\n"
    "       smockron-query [--server HOST:PORT] [--timeout MS] get_size\n"
    "       smockron-query [--admin HOST:PORT] [--timeout MS] top [DOMAIN] [N]\n"
    "       smockron-query keygen PATH    (writes PATH.key, mode 0600, and PATH.pub: a CURVE keypair)\n"
    "  --server HOST:PORT  the master's [master] query endpoint (default 127.0.0.1:10006)\n"
    "  --admin HOST:PORT   the master's admin endpoint, for top (default 127.0.0.1:9105)\n"
    "  --timeout MS        how long to wait for the answer (default 100)\n"
    "  --version           print the version and exit\n"
    "exit status: 0 answered (over_limit: N), 1 over_limit answered Y, 2 no answer in time\n"
    "             (top: no answer, or not 200), 64 usage\n";

int usage(const std::string& why) {
  if (!why.empty()) std::cerr << "smockron-query: " << why << "\n";
  std::cerr << k_usage;
  return 64;
}

// keygen PATH: a CURVE keypair in PATH.key (secret, 0600) and PATH.pub.
int keygen(const std::string& path) {
  const auto kp = smockron::zmtp::curve::generate();
  const auto write = [](const std::string& file, const std::string& text, mode_t mode) {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
      std::cerr << "smockron-query: cannot create " << file << ": " << std::strerror(errno) << "\n";
      return false;
    }
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!ok) std::cerr << "smockron-query: cannot write " << file << "\n";
    return ok;
  };
  const std::string pub = smockron::zmtp::curve::z85_encode(kp.public_key);
  if (!write(path + ".key",
             "# smockron CURVE secret key (public key " + pub + ")\n" +
                 smockron::zmtp::curve::z85_encode(kp.secret_key) + "\n",
             0600))
    return 1;
  if (!write(path + ".pub", pub + "\n", 0644)) return 1;
  std::cout << pub << "\n";
  return 0;
}

// GET `target` from host:port over HTTP/1.0 within `timeout_ms`: the status
// and the body, or nothing (no answer in time, not HTTP).
std::optional<std::pair<int, std::string>> http_get(const smockron::host_port& at, const std::string& target,
                                                    int timeout_ms) {
  const auto ip = smockron::parse_ip(at.host);
  if (!ip) return std::nullopt;
  sockaddr_storage addr{};
  socklen_t len = 0;
  // Addresses are kept as IPv6; an IPv4 one is v4-mapped (::ffff:a.b.c.d).
  const bool v4 = std::all_of(ip->bytes.begin(), ip->bytes.begin() + 10, [](std::uint8_t b) { return b == 0; }) &&
                  ip->bytes[10] == 0xff && ip->bytes[11] == 0xff;
  if (!v4) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(at.port);
    std::memcpy(&a6->sin6_addr, ip->bytes.data(), 16);
    len = sizeof(sockaddr_in6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(at.port);
    std::memcpy(&a4->sin_addr, ip->bytes.data() + 12, 4);
    len = sizeof(sockaddr_in);
  }
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) {
    const std::string req = "GET " + target + " HTTP/1.0\r\nHost: " + at.to_string() + "\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[16384];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0 && out.size() < (16u << 20);) out.append(buf, n);
    }
  }
  ::close(fd);
  const auto head_end = out.find("\r\n\r\n");
  if (!out.starts_with("HTTP/1.") || head_end == std::string::npos || out.size() < 12) return std::nullopt;
  return std::pair(std::atoi(out.c_str() + 9), out.substr(head_end + 4));
}

// `top`: GET /top and the table.
int top(const smockron::host_port& admin, const std::vector<std::string>& words, int timeout_ms) {
  std::string target = "/top?n=10";
  if (words.size() >= 3) target = "/top?n=" + words[2];
  if (words.size() >= 2) {
    std::string domain;
    for (const unsigned char c : words[1]) {
      static constexpr char k_hex[] = "0123456789ABCDEF";
      if (std::isalnum(c) || c == '-' || c == '_' || c == '.') domain.push_back(static_cast<char>(c));
      else domain.append({'%', k_hex[c >> 4], k_hex[c & 15]});
    }
    target += "&domain=" + domain;
  }
  const auto got = http_get(admin, target, timeout_ms);
  if (!got) {
    std::cerr << "smockron-query: no answer from " << admin.to_string() << " within " << timeout_ms << " ms\n";
    return 2;
  }
  if (got->first != 200) {
    std::cerr << "smockron-query: " << admin.to_string() << " answered " << got->first << ": " << got->second;
    return 2;
  }
  const auto doc = nlohmann::json::parse(got->second, nullptr, false);
  if (doc.is_discarded() || !doc.contains("domains")) {
    std::cerr << "smockron-query: not a /top answer\n";
    return 2;
  }
  const std::int64_t now_ms = doc.value("now_ms", std::int64_t{0});
  std::cout << "who is limited now (last " << doc.value("window_s", 60) << " s)\n";
  std::printf("%-16s %-40s %9s %9s %9s %s\n", "DOMAIN", "IDENTIFIER", "LIMITED", "USES", "REFUSALS", "THROTTLED");
  for (const auto& d : doc["domains"]) {
    for (const auto& t : d["top"]) {
      std::string throttled = "-";
      if (t.value("throttled", false)) {
        const double s = static_cast<double>(t.value("throttled_until_ms", now_ms) - now_ms) / 1000.0;
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1fs more", s);
        throttled = buf;
      }
      std::printf("%-16s %-40s %9llu %9llu %9llu %s\n", d.value("domain", "").c_str(),
                  t.value("identifier", "").c_str(), static_cast<unsigned long long>(t.value("limited", 0ULL)),
                  static_cast<unsigned long long>(t.value("uses", 0ULL)),
                  static_cast<unsigned long long>(t.value("refusals", 0ULL)), throttled.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  smockron::host_port server{"127.0.0.1", 10006};
  smockron::host_port admin{"127.0.0.1", 9105};
  int timeout_ms = 100;
  bool timeout_given = false;
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << k_usage;
      return 0;
    }
    if (a == "--version") {
      std::cout << "smockron-query " << smockron::version_string << "\n";
      return 0;
    }
    if ((a == "--server" || a == "--timeout" || a == "--admin") && i + 1 >= argc) {
      return usage(std::string(a) + " needs a value");
    }
    if (a == "--server" || a == "--admin") {
      const auto hp = smockron::parse_host_port(argv[++i]);
      if (!hp || !smockron::parse_ip(hp->host))
        return usage(std::string(a) + ": expected IP:PORT, got \"" + std::string(argv[i]) + "\"");
      (a == "--server" ? server : admin) = *hp;
    } else if (a == "--timeout") {
      timeout_given = true;
      try {
        timeout_ms = std::stoi(argv[++i]);
      } catch (const std::exception&) {
        timeout_ms = -1;
      }
      if (timeout_ms < 1) return usage("--timeout: expected milliseconds, got \"" + std::string(argv[i]) + "\"");
    } else if (a.starts_with("--")) {
      return usage("unknown option " + std::string(a));
    } else {
      words.emplace_back(a);
    }
  }
  if (!words.empty() && words[0] == "keygen") {
    if (words.size() != 2 || words[1].empty())
      return usage("keygen: PATH is needed (PATH.key and PATH.pub are written)");
    return keygen(words[1]);
  }
  if (!words.empty() && words[0] == "top") {
    if (words.size() > 3) return usage("");
    if (words.size() == 3 && (words[2].empty() || words[2].find_first_not_of("0123456789") != std::string::npos)) {
      return usage("top: N is a number of identifiers, got \"" + words[2] + "\"");
    }
    return top(admin, words, timeout_given ? timeout_ms : 2000);
  }
  const bool keyed = !words.empty() && (words[0] == "over_limit" || words[0] == "get_stats");
  if (words.empty() || (keyed && words.size() != 3) || (!keyed && (words[0] != "get_size" || words.size() != 1))) {
    return usage("");
  }
  std::string request = words[0];
  for (std::size_t i = 1; i < words.size(); ++i) request += " " + words[i];
  // The request as the master will parse it: refuse here what it would ignore.
  if (!smockron::query::parse(request).req) return usage("not a request the master answers: \"" + request + "\"");
  try {
    smockron::query::client c(server);
    const auto answer = c.ask(request, timeout_ms);
    if (!answer) {
      std::cerr << "smockron-query: no answer from " << server.to_string() << " within " << timeout_ms << " ms\n";
      return 2;
    }
    std::cout << *answer << "\n";
    return words[0] == "over_limit" && answer->starts_with("ok Y") ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "smockron-query: " << e.what() << "\n";
    return 2;
  }
}
