// Common daemon start-up: CLI, config load, --check, logging level.
#include "smockron/daemon.hpp"

#include <iostream>

#include "smockron/embedded_config.hpp"
#include "smockron/log.hpp"
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

std::optional<config::config> reload(const cli::options& options, const std::string& component) {
  auto loaded = load(options);
  auto logger = log::get(component);
  for (const auto& e : loaded.errors) logger->error("reload rejected: {}", config::format(e));
  return std::move(loaded.cfg);
}

}  // namespace smockron::daemon
