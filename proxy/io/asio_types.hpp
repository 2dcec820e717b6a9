// The Asio types of the proxy's HTTP path. One concrete executor type
// everywhere (no type-erased any_io_executor copied per operation), C++20
// coroutines, and errors as values (`nothrow` completion tokens).
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <string>

namespace smockron::proxy {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using steady = std::chrono::steady_clock;
using executor_t = asio::io_context::executor_type;
template <class T>
using awaitable = asio::awaitable<T, executor_t>;
using tcp_socket = asio::basic_stream_socket<tcp, executor_t>;
using tcp_acceptor = asio::basic_socket_acceptor<tcp, executor_t>;
using steady_timer = asio::basic_waitable_timer<steady, asio::wait_traits<steady>, executor_t>;
inline constexpr auto nothrow = asio::as_tuple(asio::use_awaitable_t<executor_t>{});

/// "192.0.2.1:80", "[2001:db8::1]:80": an endpoint as logs and errors show it.
inline std::string to_string(const tcp::endpoint& ep) {
  // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, a false
  // positive) about `"[" + std::string`.
  const auto a = ep.address();
  std::string out;
  if (a.is_v6()) out += '[';
  out += a.to_string();
  if (a.is_v6()) out += ']';
  out += ':';
  out += std::to_string(ep.port());
  return out;
}

}  // namespace smockron::proxy
