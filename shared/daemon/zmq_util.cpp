// ZeroMQ multipart helpers.
#include "shared/daemon/zmq_util.hpp"

namespace smockron::zmq_util {

bool recv(zmq::socket_t& s, multipart& m, zmq::recv_flags flags) {
  m.count = 0;
  m.truncated = false;
  zmq::message_t overflow;
  for (;;) {
    zmq::message_t& target = m.count < multipart::max_frames ? m.msgs[m.count] : overflow;
    // Only the first frame may find nothing ready; later frames of a message are always there.
    if (!s.recv(target, m.count == 0 ? flags : zmq::recv_flags::none)) return false;
    if (m.count < multipart::max_frames) {
      m.views[m.count] = std::string_view(static_cast<const char*>(target.data()), target.size());
      ++m.count;
    } else {
      m.truncated = true;
    }
    if (!target.more()) return true;
  }
}

bool send(zmq::socket_t& s, std::span<const std::string_view> frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const bool last = i + 1 == frames.size();
    const auto flags = last ? zmq::send_flags::dontwait : (zmq::send_flags::dontwait | zmq::send_flags::sndmore);
    // Only the first frame can fail on HWM: ZeroMQ queues the rest of a started message.
    if (!s.send(zmq::const_buffer(frames[i].data(), frames[i].size()), flags)) return false;
  }
  return true;
}

}  // namespace smockron::zmq_util
