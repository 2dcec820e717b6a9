// The admin endpoint's allow list: a peer outside it is closed at accept and
// counted; one inside is served.
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <thread>

#include "shared/daemon/admin_server.hpp"

using namespace smockron;
namespace asio = boost::asio;

namespace {

std::string get(std::uint16_t port) {
  asio::io_context ioc;
  asio::ip::tcp::socket s(ioc);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(s, asio::buffer(std::string("GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")));
  std::string out;
  boost::system::error_code ec;
  asio::read(s, asio::dynamic_buffer(out), ec);
  return out;
}

std::string serve_one(const std::vector<cidr>& allow, metrics::counter& refused) {
  asio::io_context ioc;
  admin_server admin(
      ioc, {"127.0.0.1", 0},
      [](std::string_view, std::string_view) {
        return admin_server::response{200, "text/plain", "ok\n"};
      },
      admin_server::access{allow, &refused});
  std::thread t([&] { ioc.run_for(std::chrono::seconds(2)); });
  const std::string answer = get(admin.port());
  admin.stop();
  ioc.stop();
  t.join();
  return answer;
}

TEST(AdminServer, AllowListRefusesOthersAndServesItsOwn) {
  metrics::registry reg;
  auto& refused = reg.add_counter("refused", "refused");
  EXPECT_EQ(serve_one({*parse_cidr("10.0.0.0/8")}, refused), "") << "closed at accept";
  EXPECT_EQ(refused.value(), 1);
  EXPECT_NE(serve_one({*parse_cidr("127.0.0.1/32")}, refused).find("200 OK"), std::string::npos);
  EXPECT_NE(serve_one({}, refused).find("200 OK"), std::string::npos) << "empty: anyone";
  EXPECT_EQ(refused.value(), 1);
}

}  // namespace
