// Accounting messages in batches (see wire_batch.hpp).
#include "shared/protocol/wire_batch.hpp"

namespace smockron::wire {

bool append_batch_record(std::string& records, std::span<const std::string_view> frames_after_topic) {
  if (frames_after_topic.empty() || frames_after_topic.size() > max_batch_record_frames) return false;
  for (const auto f : frames_after_topic) {
    if (f.size() > 0xffff) return false;
  }
  records += static_cast<char>(frames_after_topic.size());
  for (const auto f : frames_after_topic) {
    records += static_cast<char>(f.size() >> 8);
    records += static_cast<char>(f.size() & 0xff);
    records += f;
  }
  return true;
}

namespace detail {

std::size_t next_batch_record(std::string_view& records, std::string_view topic,
                              std::span<std::string_view, max_batch_record_frames + 1> out) {
  if (records.empty()) return 0;
  const std::size_t count = static_cast<unsigned char>(records[0]);
  if (count == 0 || count > max_batch_record_frames) return 0;
  std::size_t at = 1;
  out[0] = topic;
  for (std::size_t i = 0; i < count; ++i) {
    if (records.size() - at < 2) return 0;
    const std::size_t len =
        (std::size_t{static_cast<unsigned char>(records[at])} << 8) | static_cast<unsigned char>(records[at + 1]);
    at += 2;
    if (records.size() - at < len) return 0;
    out[i + 1] = records.substr(at, len);
    at += len;
  }
  records.remove_prefix(at);
  return count + 1;
}

bool batch_well_formed(std::string_view records) {
  if (records.empty()) return false;
  std::string_view frames[max_batch_record_frames + 1];
  while (!records.empty()) {
    if (next_batch_record(records, {}, frames) == 0) return false;
  }
  return true;
}

}  // namespace detail
}  // namespace smockron::wire
