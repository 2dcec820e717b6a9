// Redis records of states and overrides (see state_record.hpp).
#include "master/store/state_record.hpp"

#include <charconv>
#include <vector>

#include "shared/protocol/wire.hpp"

namespace smockron::master {

std::string store_key(std::string_view domain, std::string_view identifier) {
  std::string k;
  k.reserve(k_store_prefix.size() + domain.size() + 1 + identifier.size());
  k += k_store_prefix;
  k += domain;
  k += '\0';
  k += identifier;
  return k;
}

bool split_store_key(std::string_view key, std::string_view& domain, std::string_view& identifier) {
  if (!key.starts_with(k_store_prefix)) return false;
  key.remove_prefix(k_store_prefix.size());
  const auto nul = key.find('\0');
  if (nul == std::string_view::npos || nul == 0) return false;
  domain = key.substr(0, nul);
  identifier = key.substr(nul + 1);
  return true;
}

namespace {
constexpr std::string_view k_log_tag = "sliding-log:";
constexpr std::string_view k_gcra_tag = "gcra:";

void append_numbers(std::string& out, const std::vector<std::int64_t>& v) {
  char buf[24];
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    const auto r = std::to_chars(buf, buf + sizeof buf, v[i]);
    out.append(buf, r.ptr);
  }
}

// Comma-separated non-negative numbers; false if malformed.
bool parse_numbers(std::string_view v, std::vector<std::int64_t>& out) {
  while (!v.empty()) {
    std::int64_t t = 0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), t);
    if (r.ec != std::errc() || t < 0) return false;
    out.push_back(t);
    v.remove_prefix(static_cast<std::size_t>(r.ptr - v.data()));
    if (v.empty()) break;
    if (v.front() != ',' || v.size() == 1) return false;
    v.remove_prefix(1);
  }
  return true;
}
}  // namespace

std::string encode_state(rules::algorithm algo, const rules::state& s, std::string_view tier) {
  std::string out(algo == rules::algorithm::gcra ? k_gcra_tag : k_log_tag);
  append_numbers(out, s.times);
  if (!s.aux.empty()) {
    out += ';';
    append_numbers(out, s.aux);
  }
  if (!tier.empty()) {
    out += '|';
    out += tier;
  }
  return out;
}

std::optional<stored_state> decode_state(std::string_view v) {
  std::string_view tier;
  if (const auto bar = v.find('|'); bar != std::string_view::npos) {
    tier = v.substr(bar + 1);
    if (!wire::valid_tier_name(tier)) return std::nullopt;
    v = v.substr(0, bar);
  }
  rules::algorithm algo;
  if (v.starts_with(k_log_tag)) {
    algo = rules::algorithm::sliding_log;
    v.remove_prefix(k_log_tag.size());
  } else if (v.starts_with(k_gcra_tag)) {
    algo = rules::algorithm::gcra;
    v.remove_prefix(k_gcra_tag.size());
  } else {
    return std::nullopt;
  }
  rules::state s;
  const std::size_t semi = v.find(';');
  if (!parse_numbers(v.substr(0, semi), s.times)) return std::nullopt;
  if (semi != std::string_view::npos) {
    if (semi + 1 == v.size() || !parse_numbers(v.substr(semi + 1), s.aux)) return std::nullopt;
  }
  if (algo == rules::algorithm::sliding_log && !std::is_sorted(s.times.begin(), s.times.end())) return std::nullopt;
  return stored_state{algo, std::move(s), std::string(tier)};
}

std::string override_key(std::string_view domain, std::string_view identifier) {
  std::string k(k_override_prefix);
  k.append(domain).push_back('\0');
  k.append(identifier);
  return k;
}

}  // namespace smockron::master
