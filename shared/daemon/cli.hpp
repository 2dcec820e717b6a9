// Command line shared by both daemons: --config, --check, --version, --log-level.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace smockron::cli {

struct options {
  std::string config_path;  ///< empty = embedded defaults
  bool check = false;
  bool version = false;
  bool help = false;
  std::string log_level;           ///< empty = from config, else "info"
  std::vector<std::string> extra;  ///< daemon-specific flags (e.g. --healthcheck)
};

/// Parses argv; returns an error message on bad usage. `extra_flags` are
/// accepted and passed through in options::extra.
std::optional<options> parse(int argc, char** argv, const std::vector<std::string>& extra_flags, std::string& error);

/// Usage text for `program`.
std::string usage(const std::string& program, const std::string& extra_help = "");

}  // namespace smockron::cli
