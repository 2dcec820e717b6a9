// Start-up steps common to both daemons: command line, configuration
// (file or embedded defaults), --check, --version and the log level.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shared/config/config.hpp"
#include "shared/daemon/cli.hpp"

namespace smockron::daemon {

struct startup {
  cli::options options;
  config::config cfg;
};

/// Handles --help/--version/--check and loading. Returns the loaded config to
/// run with, or nothing with `exit_code` set (0 for --version/--check success).
/// `section` ("master" or "proxy") must be present; `verify` (optional) checks
/// what the schema cannot, such as the files the daemon will load, so that
/// --check finds it too: empty when fine, else why not.
std::optional<startup> prepare(int argc, char** argv, const std::string& program,
                               const std::vector<std::string>& extra_flags, const std::string& extra_help,
                               const std::string& section, std::string (*verify)(const config::config&),
                               int& exit_code);

/// `--healthcheck`: GET /livez on the admin endpoint `admin` (0.0.0.0 and ::
/// mean the local host); 0 if it answers 200 within 2 s, else 1 (and why, on stderr).
int healthcheck(const host_port& admin);

/// Reloads the file given on the command line (or the embedded defaults) and
/// logs every error; nothing on failure.
std::optional<config::config> reload(const cli::options& options, const std::string& component);

}  // namespace smockron::daemon
