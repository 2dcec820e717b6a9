// TOML configuration loading (toml++): the file, each daemon's table read
// (config_master.cpp, config_proxy.cpp) and every error reported at once.
// Exceptions stay inside: callers get a load_result.
#include <toml++/toml.h>

#include <sys/stat.h>

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

namespace {
bool on_this_host(const std::string& endpoint) {
  if (const auto d = parse_dns_endpoint(endpoint)) return d->name == "localhost";
  const auto e = parse_stream_endpoint(endpoint);
  if (!e || e->type == stream_endpoint::kind::ipc) return true;
  const std::string& h = e->address.host;
  return h == "localhost" || h == "::1" || h.starts_with("127.");
}
}  // namespace

std::vector<std::string> warnings(const config& c) {
  std::vector<std::string> out;
  const auto check = [&](const std::string& key, const std::string& endpoint, bool keys) {
    if (keys || on_this_host(endpoint)) return;
    out.push_back(key + " " + endpoint +
                  " is not loopback or IPC and the links have no CURVE keys: anyone who reaches it can read and "
                  "forge accounting and control (plaintext is for a private network only; see curve_secret_key)");
  };
  // A secret key others can read is a key others may hold.
  const auto private_file = [&](const std::string& key, const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      out.push_back(key + " " + path + " is readable by its group or others (chmod 600 it)");
    }
  };
  if (c.master) {
    check("[master] accounting", c.master->accounting, c.master->curve != nullptr);
    check("[master] control", c.master->control, c.master->curve != nullptr);
    for (const auto& f : c.master->curve_secret_key) private_file("[master] curve_secret_key", f);
  }
  if (c.proxy) {
    for (const auto& e : c.proxy->accounting) check("[proxy] accounting", e, !c.proxy->curve.empty());
    for (const auto& e : c.proxy->control) check("[proxy] control", e, !c.proxy->curve.empty());
    if (!c.proxy->curve_secret_key.empty()) private_file("[proxy] curve_secret_key", c.proxy->curve_secret_key);
  }
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
