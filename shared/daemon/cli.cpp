// Command-line parsing for both daemons.
#include "shared/daemon/cli.hpp"

#include <algorithm>
#include <string_view>

namespace smockron::cli {

std::optional<options> parse(int argc, char** argv, const std::vector<std::string>& extra_flags, std::string& error) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&](std::string& out) {
      const auto eq = arg.find('=');
      if (eq != std::string_view::npos) {
        out = std::string(arg.substr(eq + 1));
        return true;
      }
      if (i + 1 >= argc) {
        error = std::string(arg) + " needs a value";
        return false;
      }
      out = argv[++i];
      return true;
    };
    if (arg == "--config" || arg.starts_with("--config=")) {
      if (!value(o.config_path)) return std::nullopt;
    } else if (arg == "--log-level" || arg.starts_with("--log-level=")) {
      if (!value(o.log_level)) return std::nullopt;
    } else if (arg == "--check") {
      o.check = true;
    } else if (arg == "--version") {
      o.version = true;
    } else if (arg == "--help" || arg == "-h") {
      o.help = true;
    } else if (std::find(extra_flags.begin(), extra_flags.end(), arg) != extra_flags.end()) {
      o.extra.emplace_back(arg);
    } else {
      error = "unknown argument \"" + std::string(arg) + "\"";
      return std::nullopt;
    }
  }
  return o;
}

std::string usage(const std::string& program, const std::string& extra_help) {
  return "usage: " + program +
         " [--config PATH] [--check] [--log-level LEVEL] [--version]\n"
         "  --config PATH      TOML configuration (default: embedded defaults)\n"
         "  --check            validate the configuration, print every error, exit non-zero if any\n"
         "  --log-level LEVEL  trace, debug, info, warn, error, critical, off\n"
         "  --version          print the version and exit\n" +
         extra_help;
}

}  // namespace smockron::cli
