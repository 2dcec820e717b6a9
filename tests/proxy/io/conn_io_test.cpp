// Connection deadlines and holding on a manual clock: the watchdog cancels
// an operation once the clock passes its deadline, and not before; a hold
// ends early when the client leaves.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/write.hpp>

#include <memory>
#include <optional>

#include "proxy/io/conn_io.hpp"
#include "shared/base/clock.hpp"

using namespace smockron;
using namespace smockron::proxy;

namespace {

class ConnIo : public ::testing::Test {
protected:
  ConnIo() : acceptor_(ioc_.get_executor(), {asio::ip::make_address("127.0.0.1"), 0}), peer_(ioc_.get_executor()) {
    tcp_socket server(ioc_.get_executor());
    peer_.connect(acceptor_.local_endpoint());
    acceptor_.accept(server);
    conn_ = std::make_shared<connection>(std::move(server), clock_, std::chrono::milliseconds(1));
    connection::watch(conn_);
  }
  ~ConnIo() override {
    conn_->close();
    ioc_.run_for(std::chrono::milliseconds(5));
  }
  // Runs the io_context until `done` or 10 s of real time (a sanitizer build on a busy machine is slow).
  template <class F>
  bool run_until(F done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < end) ioc_.run_for(std::chrono::milliseconds(2));
    return done();
  }

  manual_clock clock_;
  asio::io_context ioc_;
  tcp_acceptor acceptor_;
  tcp_socket peer_;
  std::shared_ptr<connection> conn_;
};

TEST_F(ConnIo, AReadTimesOutWhenTheClockPassesItsDeadline) {
  std::optional<boost::system::error_code> result;
  std::array<char, 64> buf;
  asio::co_spawn(
      ioc_.get_executor(),
      [&]() -> awaitable<void> {
        auto [ec, n] = co_await read_more(*conn_, conn_->client, asio::buffer(buf), std::chrono::seconds(30));
        result = conn_->classify(ec);
      },
      asio::detached);
  ioc_.run_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(result) << "no time has passed on the clock";
  clock_.advance(std::chrono::seconds(29));
  ioc_.run_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(result) << "29 s of 30";
  clock_.advance(std::chrono::seconds(2));
  ASSERT_TRUE(run_until([&] { return result.has_value(); }));
  EXPECT_EQ(*result, asio::error::timed_out);
}

TEST_F(ConnIo, DataIsProgressAndRestartsTheDeadline) {
  std::optional<std::size_t> got;
  std::array<char, 64> buf;
  asio::co_spawn(
      ioc_.get_executor(),
      [&]() -> awaitable<void> {
        auto [ec, n] = co_await read_more(*conn_, conn_->client, asio::buffer(buf), std::chrono::seconds(30));
        if (!ec) got = n;
      },
      asio::detached);
  ioc_.run_for(std::chrono::milliseconds(20));
  clock_.advance(std::chrono::seconds(20));
  asio::write(peer_, asio::buffer("hello", 5));
  ASSERT_TRUE(run_until([&] { return got.has_value(); }));
  EXPECT_EQ(*got, 5u);
  EXPECT_FALSE(conn_->expired);
}

TEST_F(ConnIo, AHoldEndsEarlyWhenTheClientLeaves) {
  std::optional<bool> stayed;
  asio::co_spawn(
      ioc_.get_executor(),
      [&]() -> awaitable<void> { stayed = co_await hold(*conn_, std::chrono::seconds(60)) == hold_end::released; },
      asio::detached);
  ioc_.run_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(stayed);
  peer_.close();
  ASSERT_TRUE(run_until([&] { return stayed.has_value(); }));
  EXPECT_FALSE(*stayed);
}

TEST_F(ConnIo, AHoldLastsItsTime) {
  std::optional<bool> stayed;
  asio::co_spawn(
      ioc_.get_executor(),
      [&]() -> awaitable<void> { stayed = co_await hold(*conn_, std::chrono::milliseconds(30)) == hold_end::released; },
      asio::detached);
  ASSERT_TRUE(run_until([&] { return stayed.has_value(); }));
  EXPECT_TRUE(*stayed);
}

TEST_F(ConnIo, AClientThatSendsThenLeavesIsSeenLeaving) {
  std::optional<bool> stayed;
  asio::co_spawn(
      ioc_.get_executor(),
      [&]() -> awaitable<void> { stayed = co_await hold(*conn_, std::chrono::seconds(60)) == hold_end::released; },
      asio::detached);
  ioc_.run_for(std::chrono::milliseconds(10));
  asio::write(peer_, asio::buffer(std::string(3000, 'b')));  // a body, or a pipelined request
  ioc_.run_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(stayed);
  peer_.close();
  ASSERT_TRUE(run_until([&] { return stayed.has_value(); }));
  EXPECT_FALSE(*stayed);
}

TEST_F(ConnIo, WhatAHeldClientSendsIsKeptForForwarding) {
  std::optional<bool> stayed;
  asio::co_spawn(
      ioc_.get_executor(),
      [&]() -> awaitable<void> { stayed = co_await hold(*conn_, std::chrono::seconds(2)) == hold_end::released; },
      asio::detached);
  ioc_.run_for(std::chrono::milliseconds(10));
  asio::write(peer_, asio::buffer(std::string("GET /next HTTP/1.1\r\n\r\n")));
  ASSERT_TRUE(run_until([&] { return conn_->early.size() == 22; })) << "read while held";
  EXPECT_FALSE(stayed) << "the hold goes on";
  ASSERT_TRUE(run_until([&] { return stayed.has_value(); }));
  EXPECT_TRUE(*stayed);
  EXPECT_EQ(conn_->early, "GET /next HTTP/1.1\r\n\r\n");
}

TEST_F(ConnIo, PastTheHoldBufferALeavingClientIsStillSeen) {
  std::optional<bool> stayed;
  asio::co_spawn(
      ioc_.get_executor(),
      [&]() -> awaitable<void> { stayed = co_await hold(*conn_, std::chrono::seconds(60)) == hold_end::released; },
      asio::detached);
  // More than the hold buffer, less than the socket buffers: a FIN behind a full
  // receive window could not arrive at all (TCP), whatever the proxy does.
  // Driven by what it checks, not by how much one read or write moves:
  // sends as the socket takes it until the bound is read (or a deadline).
  const std::string big(96 * 1024, 'x');
  std::size_t sent = 0;
  peer_.non_blocking(true);
  ASSERT_TRUE(run_until([&] {
    boost::system::error_code ec;
    if (sent < big.size()) sent += peer_.write_some(asio::buffer(big.data() + sent, big.size() - sent), ec);
    return conn_->early.size() >= 64u * 1024;
  })) << "read up to the bound: "
      << conn_->early.size() << " bytes of " << sent << " sent";
  EXPECT_FALSE(stayed);
  peer_.close();
  ASSERT_TRUE(run_until([&] { return stayed.has_value(); }));
  EXPECT_FALSE(*stayed);
}

}  // namespace
