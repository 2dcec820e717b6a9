// Common daemon start-up: CLI, config load, --check, logging level.
#include "shared/daemon/daemon.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <iostream>

#include "shared/base/log.hpp"
#include "smockron/embedded_config.hpp"
#include "smockron/version.hpp"

namespace smockron::daemon {
namespace {
config::load_result load(const cli::options& o) {
  return o.config_path.empty() ? config::load_string(embedded_config, "<embedded defaults>")
                               : config::load_file(o.config_path);
}
}  // namespace

std::optional<startup> prepare(int argc, char** argv, const std::string& program,
                               const std::vector<std::string>& extra_flags, const std::string& extra_help,
                               const std::string& section, std::string (*verify)(const config::config&),
                               int& exit_code) {
  std::string error;
  auto options = cli::parse(argc, argv, extra_flags, error);
  if (!options) {
    std::cerr << program << ": " << error << "\n" << cli::usage(program, extra_help);
    exit_code = 2;
    return std::nullopt;
  }
  if (options->help) {
    std::cout << cli::usage(program, extra_help);
    exit_code = 0;
    return std::nullopt;
  }
  if (options->version) {
    std::cout << program << " " << version_string << "\n";
    exit_code = 0;
    return std::nullopt;
  }
  auto loaded = load(*options);
  if (loaded.cfg && !(section == "master" ? loaded.cfg->master.has_value() : loaded.cfg->proxy.has_value())) {
    loaded.errors.push_back(
        {loaded.cfg->source, 0, 0, section, "missing: this daemon reads the [" + section + "] table"});
    loaded.cfg.reset();
  }
  if (loaded.cfg && verify != nullptr) {
    if (auto why = verify(*loaded.cfg); !why.empty()) {
      loaded.errors.push_back({loaded.cfg->source, 0, 0, section, std::move(why)});
      loaded.cfg.reset();
    }
  }
  for (const auto& e : loaded.errors) std::cerr << config::format(e) << "\n";
  if (!loaded.cfg) {
    std::cerr << program << ": " << loaded.errors.size() << " configuration error(s)\n";
    exit_code = 1;
    return std::nullopt;
  }
  for (const auto& w : config::warnings(*loaded.cfg)) {
    if (w.starts_with("[" + section + "]")) std::cerr << loaded.cfg->source << ": warning: " << w << "\n";
  }
  if (options->check) {
    std::cout << loaded.cfg->source << ": configuration OK\n";
    exit_code = 0;
    return std::nullopt;
  }
  std::string level = options->log_level;
  if (level.empty()) {
    level = section == "master" ? loaded.cfg->master->log_level : loaded.cfg->proxy->log_level;
  }
  if (level.empty()) level = "info";
  auto parsed = log::parse_level(level);
  if (!parsed) {
    std::cerr << program << ": unknown log level \"" << level << "\"\n";
    exit_code = 2;
    return std::nullopt;
  }
  log::set_level(*parsed);
  return startup{std::move(*options), std::move(*loaded.cfg)};
}

int healthcheck(const host_port& admin) {
  std::string host = admin.host;
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(admin.port);
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(admin.port);
    len = sizeof *v6;
  } else {
    std::cerr << "healthcheck: admin address " << admin.to_string() << " is not an IP address\n";
    return 1;
  }
  const int fd = ::socket(ss.ss_family, SOCK_STREAM, 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    std::cerr << "healthcheck: cannot connect to " << admin.to_string() << "\n";
    ::close(fd);
    return 1;
  }
  const std::string req = "GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  char buf[64] = {};
  const bool ok = ::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()) &&
                  ::read(fd, buf, sizeof buf - 1) > 12 && std::string_view(buf).substr(9, 3) == "200";
  ::close(fd);
  std::cerr << "healthcheck: " << (ok ? "ok" : "unhealthy") << "\n";
  return ok ? 0 : 1;
}

std::optional<config::config> reload(const cli::options& options, const std::string& component) {
  auto loaded = load(options);
  auto logger = log::get(component);
  for (const auto& e : loaded.errors) logger->error("reload rejected: {}", config::format(e));
  return std::move(loaded.cfg);
}

}  // namespace smockron::daemon
