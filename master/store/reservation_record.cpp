// Reservation records (see reservation_record.hpp).
#include "master/store/reservation_record.hpp"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <string>

namespace smockron::master {
namespace {

// A whole decimal field up to `sep` (or the end); advances `s` past it.
template <class T>
bool field(std::string_view& s, char sep, T& out, int base = 10) {
  const auto end = s.find(sep);
  const std::string_view f = s.substr(0, end);
  if (f.empty()) return false;
  const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), out, base);
  if (ec != std::errc{} || p != f.data() + f.size()) return false;
  s.remove_prefix(end == std::string_view::npos ? s.size() : end + 1);
  return true;
}

}  // namespace

std::string reservation_owner(std::string_view accounting_endpoint) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string owner = std::string(host) + " " + std::string(accounting_endpoint);
  std::erase(owner, '\0');
  return owner;
}

std::string reservation_prefix(std::string_view owner) {
  std::string p(k_reservation_prefix);
  p += owner;
  p += '\0';
  return p;
}

std::string reservation_key(std::string_view owner, std::string_view domain, std::string_view identifier,
                            std::uint64_t tag) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(tag));
  std::string k = reservation_prefix(owner);
  k.reserve(k.size() + domain.size() + identifier.size() + 18);
  k += domain;
  k += '\0';
  k += identifier;
  k += '\0';
  k.append(hex, 16);
  return k;
}

std::string encode_reservation(const reservation_record& r) {
  return std::to_string(r.at_ms) + "," + std::to_string(r.units) + "," + std::to_string(r.opened_us);
}

std::optional<reservation_record> decode_reservation(std::string_view key, std::string_view value) {
  if (!key.starts_with(k_reservation_prefix)) return std::nullopt;
  key.remove_prefix(k_reservation_prefix.size());
  const auto owner_end = key.find('\0');
  if (owner_end == std::string_view::npos) return std::nullopt;
  const std::string_view owner = key.substr(0, owner_end);
  key.remove_prefix(owner_end + 1);
  const auto first = key.find('\0');
  const auto last = key.rfind('\0');
  // The identifier may hold \0 itself; the domain cannot, and the tag is the last 16 characters.
  if (first == std::string_view::npos || last == first || key.size() - last - 1 != 16) return std::nullopt;
  reservation_record r;
  r.owner = std::string(owner);
  r.domain = std::string(key.substr(0, first));
  r.identifier = std::string(key.substr(first + 1, last - first - 1));
  std::string_view tag = key.substr(last + 1);
  if (r.domain.empty() || !field(tag, '\0', r.tag, 16)) return std::nullopt;
  if (!field(value, ',', r.at_ms) || !field(value, ',', r.units) || !field(value, ',', r.opened_us) || !value.empty() ||
      r.units <= 0) {
    return std::nullopt;
  }
  return r;
}

}  // namespace smockron::master
