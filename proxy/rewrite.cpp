// Hop-by-hop removal and X-Forwarded-* headers.
#include "proxy/rewrite.hpp"

#include <boost/beast/http/field.hpp>

#include <string>
#include <vector>

namespace smockron::proxy {
namespace http = boost::beast::http;

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

// Removes hop-by-hop headers; with `tunnel`, Upgrade survives and Connection becomes "upgrade".
void strip_hop_by_hop(http::fields& f, bool tunnel) {
  std::vector<std::string> listed;
  for (auto it = f.find(http::field::connection); it != f.end() && it->name() == http::field::connection; ++it) {
    std::string_view v = it->value();
    while (!v.empty()) {
      const auto comma = v.find(',');
      const auto token = trim(v.substr(0, comma));
      if (!token.empty()) listed.emplace_back(token);
      v = comma == std::string_view::npos ? std::string_view{} : v.substr(comma + 1);
    }
  }
  for (const auto& name : listed) {
    if (tunnel && iequals(name, "upgrade")) continue;
    f.erase(name);
  }
  f.erase(http::field::connection);
  f.erase(http::field::keep_alive);
  f.erase(http::field::te);
  f.erase(http::field::trailer);
  f.erase(http::field::proxy_connection);
  f.erase(http::field::proxy_authenticate);
  f.erase(http::field::proxy_authorization);
  if (tunnel) {
    f.set(http::field::connection, "upgrade");
  } else {
    f.erase(http::field::upgrade);
  }
}

}  // namespace

void rewrite_request(http::fields& f, const forward_info& info) {
  strip_hop_by_hop(f, info.tunnel);
  // Append this hop to any existing chain (several header lines fold into one).
  std::string xff;
  for (auto it = f.find("X-Forwarded-For"); it != f.end() && iequals(it->name_string(), "X-Forwarded-For"); ++it) {
    if (!xff.empty()) xff += ", ";
    xff += it->value();
  }
  if (!xff.empty()) xff += ", ";
  xff += info.client_ip;
  f.set("X-Forwarded-For", xff);
  f.set("X-Forwarded-Proto", info.proto);
  if (auto host = f.find(http::field::host); host != f.end()) f.set("X-Forwarded-Host", host->value());
}

void rewrite_response(http::fields& f, bool tunnel) { strip_hop_by_hop(f, tunnel); }

}  // namespace smockron::proxy
