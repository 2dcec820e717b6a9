// How a state and an override set through the API are kept in Redis: their
// keys and values (docs/architecture.md, "Redis store"). Pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "master/core/rules.hpp"

namespace smockron::master {

inline constexpr std::string_view k_store_prefix = "smockron:";
/// An override set through the API: `smockron-override:<domain>\0<identifier>`, its TOML rules, no expiry.
inline constexpr std::string_view k_override_prefix = "smockron-override:";
std::string override_key(std::string_view domain, std::string_view identifier);

std::string store_key(std::string_view domain, std::string_view identifier);
/// Splits a key made by store_key(); false if `key` is not one.
bool split_store_key(std::string_view key, std::string_view& domain, std::string_view& identifier);
/// A state as Redis keeps it: `tier` names the tier its uses were judged by
/// (empty: the domain's rules, or the identifier's override).
struct stored_state {
  rules::algorithm algo = rules::algorithm::sliding_log;
  rules::state st;
  std::string tier;
};
std::string encode_state(rules::algorithm algo, const rules::state& s, std::string_view tier = {});
std::optional<stored_state> decode_state(std::string_view value);

}  // namespace smockron::master
