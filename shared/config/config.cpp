// TOML configuration loading (toml++): the file, each daemon's table read
// (config_master.cpp, config_proxy.cpp) and every error reported at once.
// Exceptions stay inside: callers get a load_result.
#include <toml++/toml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "shared/config/config.hpp"
#include "shared/config/config_reader.hpp"
#include "shared/protocol/wire.hpp"

namespace smockron::config {

using detail::read_master;
using detail::read_proxy;
using detail::reader;
using detail::sink;

// Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, a false positive)
// on ":" + std::to_string(...) here.
std::string format(const error& e) {
  std::string out = e.file;
  if (e.line > 0) out.append(":").append(std::to_string(e.line)).append(":").append(std::to_string(e.column));
  out.append(": ");
  if (!e.key.empty()) out.append(e.key).append(": ");
  out.append(e.message);
  return out;
}

load_result load_string(std::string_view text, const std::string& source_name) {
  load_result out;
  sink s(source_name);
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    s.add(e.source(), "", std::string(e.description()));
    out.errors = std::move(s.errors());
    return out;
  }
  config c;
  c.source = source_name;
  {
    reader r(root, "", s);
    if (auto* m = r.typed<toml::table>("master", "a table")) c.master = read_master(*m, s);
    if (auto* p = r.typed<toml::table>("proxy", "a table")) c.proxy = read_proxy(*p, s);
  }
  out.errors = std::move(s.errors());
  std::stable_sort(out.errors.begin(), out.errors.end(), [](const error& a, const error& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  if (out.errors.empty()) out.cfg = std::move(c);
  return out;
}

load_result load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    load_result out;
    out.errors.push_back({path, 0, 0, "", "cannot open file"});
    return out;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  return load_string(buf.str(), path);
}

}  // namespace smockron::config
