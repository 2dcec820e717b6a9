// smockron-query: asks a master's UDP query endpoint one question, as
// scripts and non-HTTP applications do (the UDP rate limiter's protocol).
//
//   smockron-query [--server HOST:PORT] [--timeout MS] over_limit DOMAIN IDENTIFIER
//   smockron-query [--server HOST:PORT] [--timeout MS] get_stats DOMAIN IDENTIFIER
//   smockron-query [--server HOST:PORT] [--timeout MS] get_size
//
// Prints the answer (without its request ID). Exit status: 0 answered (for
// over_limit: not over the limit), 1 over_limit answered "Y", 2 no answer in
// time (a client may then go on as if "N": fail-open), 64 usage.
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "master/query.hpp"
#include "shared/base/net.hpp"
#include "smockron/version.hpp"

namespace {

constexpr const char* k_usage =
    "usage: smockron-query [--server HOST:PORT] [--timeout MS] over_limit DOMAIN IDENTIFIER\n"
    "       smockron-query [--server HOST:PORT] [--timeout MS] get_stats DOMAIN IDENTIFIER\n"
    "       smockron-query [--server HOST:PORT] [--timeout MS] get_size\n"
    "  --server HOST:PORT  the master's [master] query endpoint (default 127.0.0.1:10006)\n"
    "  --timeout MS        how long to wait for the answer (default 100)\n"
    "  --version           print the version and exit\n"
    "exit status: 0 answered (over_limit: N), 1 over_limit answered Y, 2 no answer in time, 64 usage\n";

int usage(const std::string& why) {
  if (!why.empty()) std::cerr << "smockron-query: " << why << "\n";
  std::cerr << k_usage;
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  smockron::host_port server{"127.0.0.1", 10006};
  int timeout_ms = 100;
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
    if ((a == "--server" || a == "--timeout") && i + 1 >= argc) return usage(std::string(a) + " needs a value");
    if (a == "--server") {
      const auto hp = smockron::parse_host_port(argv[++i]);
      if (!hp || !smockron::parse_ip(hp->host))
        return usage("--server: expected IP:PORT, got \"" + std::string(argv[i]) + "\"");
      server = *hp;
    } else if (a == "--timeout") {
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
