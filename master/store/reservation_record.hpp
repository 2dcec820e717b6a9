// A reservation the gatekeepers hold open, as the Redis store keeps it
// (store = "redis"), so that a restarted master knows which uses are still
// charged at an estimate and gives them back if no correction comes.
//
// Layout (one string key per reservation, binary-safe):
//   key   = "smockron-resv:" + owner + "\0" + domain + "\0" + identifier + "\0" + tag
//           (owner: the master's host name and accounting endpoint, so that
//           redundant masters sharing one Redis each read back their own
//           book; tag: 16 hex digits, unique across the master's runs)
//   value = at_ms "," units "," opened_us (decimal; the use's time, the
//           estimate charged, when the master first received it)
//   TTL   = reservation_timeout + k_reservation_keep: the master gives it
//           back at reservation_timeout; the record outlives that by a day,
//           for a master that is down meanwhile.
// The prefix is not the states' ("smockron:"), so neither read-back meets
// the other's records.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace smockron::master {

inline constexpr std::string_view k_reservation_prefix = "smockron-resv:";
inline constexpr std::chrono::hours k_reservation_keep{24};

struct reservation_record {
  std::string owner;
  std::string domain;
  std::string identifier;
  std::uint64_t tag = 0;
  std::int64_t at_ms = 0;
  std::int64_t units = 0;
  std::int64_t opened_us = 0;
};

/// The owner of this master's records: its host name and accounting endpoint.
std::string reservation_owner(std::string_view accounting_endpoint);
/// Where the records of `owner` start (what the read-back scans for).
std::string reservation_prefix(std::string_view owner);
std::string reservation_key(std::string_view owner, std::string_view domain, std::string_view identifier,
                            std::uint64_t tag);
std::string encode_reservation(const reservation_record& r);
/// The record `key` and `value` describe; nothing when they are not one
/// (another layout, a bad number, units not positive).
std::optional<reservation_record> decode_reservation(std::string_view key, std::string_view value);

}  // namespace smockron::master
