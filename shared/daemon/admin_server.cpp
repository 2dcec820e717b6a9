// Admin HTTP endpoint on Beast, one coroutine per connection.
#include "shared/daemon/admin_server.hpp"

#include "shared/base/log.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

namespace smockron {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

struct admin_server::impl : std::enable_shared_from_this<impl> {
  impl(asio::io_context& ioc, handler h, access a)
      : acceptor(ioc), on_request(std::move(h)), allow(std::move(a)), log(log::get("admin")) {}

  // A peer outside the allow list is closed at once, counted and logged.
  bool admitted(tcp::socket& socket) {
    if (allow.allow.empty()) return true;
    boost::system::error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    const auto peer = ec ? std::nullopt : parse_ip(remote.address().to_string());
    if (peer && allowed(allow.allow, *peer)) return true;
    if (allow.refused) allow.refused->inc();
    std::uint64_t suppressed = 0;
    if (refused_log.allow(std::chrono::steady_clock::now(), suppressed)) {
      log->warn("admin connection from {} refused: not in admin_allow ({} similar suppressed)",
                ec ? std::string("?") : remote.address().to_string(), suppressed);
    }
    socket.close(ec);
    return false;
  }

  asio::awaitable<void> accept_loop() {
    auto self = shared_from_this();
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(use_nothrow);
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
      if (ec) continue;  // e.g. EMFILE: keep serving
      if (!admitted(socket)) continue;
      asio::co_spawn(acceptor.get_executor(), serve(std::move(socket)), asio::detached);
    }
  }

  asio::awaitable<void> serve(tcp::socket socket) {
    auto self = shared_from_this();
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer(8192);
    http::request_parser<http::string_body> parser;
    parser.header_limit(8192);
    parser.body_limit(k_max_body);  // only a filter reads bodies (the override API's rules)
    stream.expires_after(std::chrono::seconds(5));
    auto [ec, n] = co_await http::async_read(stream, buffer, parser, use_nothrow);
    (void)n;
    response r;
    if (ec == http::error::body_limit) {
      r = {413, "text/plain; charset=utf-8", "request body too large\n"};
    } else if (ec == http::error::header_limit) {
      r = {431, "text/plain; charset=utf-8", "request header too large\n"};
    } else if (ec && parser.is_header_done()) {
      r = {400, "text/plain; charset=utf-8", "bad request\n"};
    } else if (ec) {
      co_return;  // nothing usable arrived (closed, timed out, garbage)
    }
    const auto& req = parser.get();
    std::string_view target = req.target();
    const auto question = target.find('?');
    const std::string_view query =
        question == std::string_view::npos ? std::string_view() : target.substr(question + 1);
    target = target.substr(0, question);
    std::optional<response> filtered;
    if (r.status == 200 && filter_) {
      const auto auth = req.find(http::field::authorization);
      filtered =
          filter_(request_view{req.method_string(), target, query,
                               auth == req.end() ? std::string_view() : std::string_view(auth->value()), req.body()});
    }
    if (r.status != 200) {
      // already decided above
    } else if (filtered) {
      r = std::move(*filtered);
    } else if (req.method() != http::verb::get && req.method() != http::verb::head) {
      r = {405, "text/plain; charset=utf-8", "method not allowed\n"};
    } else {
      r = on_request(target, query);
    }
    http::response<http::string_body> res{static_cast<http::status>(r.status), req.version()};
    res.set(http::field::server, "smockron-admin");
    res.set(http::field::content_type, r.content_type);
    res.keep_alive(false);
    const bool head = req.method() == http::verb::head;
    const std::size_t length = r.body.size();
    res.body() = head ? std::string() : std::move(r.body);
    res.prepare_payload();
    if (head) res.content_length(length);
    stream.expires_after(std::chrono::seconds(5));
    co_await http::async_write(stream, res, use_nothrow);
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  tcp::acceptor acceptor;
  handler on_request;
  filter filter_;
  access allow;
  std::shared_ptr<spdlog::logger> log;
  log::rate_limiter refused_log;
};

admin_server::admin_server(asio::io_context& ioc, const host_port& listen, handler h, access a)
    : impl_(std::make_shared<impl>(ioc, std::move(h), std::move(a))) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(listen.host, ec);
  const tcp::endpoint ep(address, listen.port);
  if (!ec) impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  // The address and why, without Asio's source locations.
  if (ec) throw std::runtime_error("cannot listen on " + listen.to_string() + ": " + ec.message());
  asio::co_spawn(ioc, impl_->accept_loop(), asio::detached);
}

admin_server::admin_server(asio::io_context& ioc, const host_port& listen, handler h)
    : admin_server(ioc, listen, std::move(h), access{}) {}

admin_server::~admin_server() { stop(); }

std::uint16_t admin_server::port() const { return impl_->acceptor.local_endpoint().port(); }

void admin_server::stop() {
  asio::post(impl_->acceptor.get_executor(), [i = impl_] {
    beast::error_code ignored;
    i->acceptor.close(ignored);
  });
}

void admin_server::set_filter(filter f) { impl_->filter_ = std::move(f); }

}  // namespace smockron
