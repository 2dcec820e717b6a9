// ZeroMQ helpers shared by both daemons: bounded multipart receive into
// reusable messages, non-blocking multipart send.
#pragma once

#include <zmq.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <string_view>

namespace smockron::zmq_util {

/// Frames of one received message; reused across receives (no allocation for small frames).
struct multipart {
  static constexpr std::size_t max_frames = 8;
  std::array<zmq::message_t, max_frames> msgs;
  std::array<std::string_view, max_frames> views;
  std::size_t count = 0;   ///< frames kept (at most max_frames)
  bool truncated = false;  ///< the message had more frames than max_frames (rest discarded)
  std::span<const std::string_view> frames() const { return {views.data(), count}; }
};

/// Receives one whole multipart message. Returns false if none is ready
/// (with `flags` = dontwait) or the socket was interrupted.
bool recv(zmq::socket_t& s, multipart& m, zmq::recv_flags flags = zmq::recv_flags::dontwait);

/// Sends frames without blocking; false if the message could not be queued (HWM reached).
bool send(zmq::socket_t& s, std::span<const std::string_view> frames);

}  // namespace smockron::zmq_util
