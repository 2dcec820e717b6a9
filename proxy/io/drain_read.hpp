// Reads that remember when they drained the socket, as nginx does.
//
// Asio's reactor tries a read at once ("speculatively") unless the last read
// on the socket reported the socket exhausted, and its TCP read reports that
// only at end of stream. So every read after a short one costs a recv()
// that fails with EAGAIN: on the proxy's path that is the read of each
// upstream response (sent for a request just written, it is rarely there
// yet) and of each next client request, about 1.4 wasted system calls per
// request. A read into a `drain_buffer` reports the socket exhausted when it
// returned less than asked for (the kernel's receive queue held no more data
// then), so the next such read waits for the reactor's readiness event
// instead of trying first. New data always brings a new event, which turns
// trying back on.
//
// One thing can wait: an end of stream that arrived together with the data
// just read (its edge is already consumed, and Asio does not ask epoll for
// RDHUP). So only the first read of a head uses it (conn_io.hpp read_first);
// every other read tries a recv() itself first (read_more), so a body that
// ends by closing, or a head cut short, sees its end at once. What is left:
// - a client that half-closes right behind its request is closed at
//   idle_timeout rather than at once;
// - a pooled upstream connection whose server closed right behind its last
//   response is found out by the reset that the next request on it draws
//   (retried on a fresh connection when the request may be), not by the end
//   of stream; a server that only half-closes such a connection and keeps
//   reading draws no reset, and that request waits for upstream_timeout.
//
// This specialises an Asio implementation template for our own buffer type
// (Boost 1.81, Debian 12's); include this header before any read on it.
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/detail/socket_ops.hpp>
#include <boost/version.hpp>

#include <cerrno>

#include "proxy/io/sys_io.hpp"

static_assert(BOOST_VERSION / 100 == 1081,
              "drain_read.hpp specialises Boost 1.81's reactor op: check it against this Boost");

namespace smockron::proxy {

/// A single mutable buffer whose reads report a short read as "drained".
struct drain_buffer : boost::asio::mutable_buffer {
  explicit drain_buffer(boost::asio::mutable_buffer b) : boost::asio::mutable_buffer(b) {}
};

}  // namespace smockron::proxy

namespace boost::asio::detail {

template <typename MutableBufferSequence>
class reactive_socket_recv_op_base;

template <>
class reactive_socket_recv_op_base<smockron::proxy::drain_buffer> : public reactor_op {
public:
  reactive_socket_recv_op_base(const boost::system::error_code& success_ec, socket_type socket,
                               socket_ops::state_type /*state*/, const smockron::proxy::drain_buffer& buffers,
                               socket_base::message_flags flags, func_type complete_func)
      : reactor_op(success_ec, &reactive_socket_recv_op_base::do_perform, complete_func),
        socket_(socket),
        buffers_(buffers),
        flags_(flags) {}

  static status do_perform(reactor_op* base) {
    auto* o = static_cast<reactive_socket_recv_op_base*>(base);
    const std::size_t size = o->buffers_.size();
    // As socket_ops::non_blocking_recv1 for a stream socket, with the bare system call.
    for (;;) {
      const auto n = smockron::proxy::sys::recv(o->socket_, o->buffers_.data(), size, o->flags_);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return not_done;
      if (n < 0) {
        o->ec_ = boost::system::error_code(errno, boost::asio::error::get_system_category());
        o->bytes_transferred_ = 0;
        return done;
      }
      o->bytes_transferred_ = static_cast<std::size_t>(n);
      if (n == 0) o->ec_ = boost::asio::error::eof;
      // Short (or end of stream): the receive queue is empty now.
      return static_cast<std::size_t>(n) < size || n == 0 ? done_and_exhausted : done;
    }
  }

private:
  socket_type socket_;
  smockron::proxy::drain_buffer buffers_;
  socket_base::message_flags flags_;
};

}  // namespace boost::asio::detail
