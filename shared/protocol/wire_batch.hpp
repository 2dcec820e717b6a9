// Accounting messages in batches (a wire addition, for CURVE links only).
// Under CURVE every frame travels in a box of its own, and a box costs more
// than reading the frame: an accounting message of five frames would cost
// five. So a gatekeeper whose link speaks CURVE packs the messages of one
// domain that leave together into one message of three frames:
//
//   [domain\0, "BATCH", records]
//
// where `records` is each message's frames after its topic, as a count
// (1 byte, 1..15) and then each frame as a 2-byte big-endian length and its
// bytes. The topic stays the first frame, so a master's subscriptions (and
// sharding by domain) select batches as they select messages. Only our own
// masters speak CURVE with our gatekeepers, so no spec-only master sees one.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace smockron::wire {

inline constexpr std::string_view batch_status = "BATCH";
/// A batch's records are at most this many bytes (the master reads messages of up to 32 KiB).
inline constexpr std::size_t max_batch_bytes = 16 * 1024;
/// Frames per record at most (an accounting message has five or six, a LEASE five).
inline constexpr std::size_t max_batch_record_frames = 15;

/// Appends one message's frames after its topic to `records`; false (and
/// nothing appended) when a frame is over 65535 bytes or there are too many.
bool append_batch_record(std::string& records, std::span<const std::string_view> frames_after_topic);

/// True when `frames` is a batch ([topic, "BATCH", records]).
inline bool is_batch(std::span<const std::string_view> frames) {
  return frames.size() == 3 && frames[1] == batch_status;
}

/// Calls `each(frames)` for every record of a batch, the topic first in each
/// (views into `batch`, valid during the call). Returns false, having called
/// nothing, when the records are malformed.
template <class Each>
bool for_each_batch_record(std::span<const std::string_view> batch, Each&& each);

namespace detail {
/// Splits the next record off `records` into `out` (topic first); its frame count, 0 when malformed.
std::size_t next_batch_record(std::string_view& records, std::string_view topic,
                              std::span<std::string_view, max_batch_record_frames + 1> out);
bool batch_well_formed(std::string_view records);
}  // namespace detail

template <class Each>
bool for_each_batch_record(std::span<const std::string_view> batch, Each&& each) {
  if (!is_batch(batch) || !detail::batch_well_formed(batch[2])) return false;
  std::string_view records = batch[2];
  std::string_view frames[max_batch_record_frames + 1];
  while (!records.empty()) {
    const std::size_t n = detail::next_batch_record(records, batch[0], frames);
    each(std::span<const std::string_view>(frames, n));
  }
  return true;
}

}  // namespace smockron::wire
