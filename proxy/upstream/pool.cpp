// Upstream connections (see pool.hpp).
#include "proxy/upstream/pool.hpp"

#include <sys/socket.h>

#include <cerrno>

#include "shared/base/log.hpp"

namespace smockron::proxy {
namespace {

// An idle pooled connection the upstream has neither closed nor written to.
bool still_open(link& l) {
  char ch;
  const auto n = ::recv(l.socket().native_handle(), &ch, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

constexpr std::size_t k_surplus = 4;
constexpr auto k_surplus_idle = std::chrono::seconds(1);

}  // namespace

void upstream_pool::adopt(const runtime& rt) {
  slots_.clear();
  slots_.resize(rt.servers.size());
  for (std::size_t u = 0; u < rt.servers.size(); ++u) slots_[u].resize(rt.servers[u].size());
  round_robin_.assign(rt.servers.size(), 0);
  generation_ = rt.generation;
}

bool upstream_pool::take_pooled(const runtime& rt, upstream_conn& up, std::size_t upstream, bool check_idle) {
  if (generation_ != rt.generation) return false;
  auto& slots = slots_[upstream];
  const std::size_t s = round_robin_[upstream] % slots.size();
  auto& slot = slots[s];
  if (slot.idle.empty() || (slot.down_until != steady::time_point{} && slot.down_until > clock_.steady_now())) {
    return false;
  }
  if (check_idle && !still_open(slot.idle.back().l)) return false;  // acquire() drops it
  ++round_robin_[upstream];
  up.use(std::move(slot.idle.back().l), s, true);
  slot.idle.pop_back();
  return true;
}

awaitable<bool> upstream_pool::acquire(const runtime& rt, io_deadline& d, upstream_conn& up, std::size_t upstream,
                                       bool allow_reuse, bool check_idle) {
  if (generation_ != rt.generation) adopt(rt);
  auto& slots = slots_[upstream];
  const auto& cfg = rt.cfg.upstreams[upstream];
  const auto now = clock_.steady_now();
  up.release();
  for (std::size_t attempt = 0; attempt < slots.size(); ++attempt) {
    const std::size_t s = round_robin_[upstream]++ % slots.size();
    auto& slot = slots[s];
    if (slot.down_until > now && attempt + 1 < slots.size())
      continue;  // skip a down server unless it is the last chance
    while (allow_reuse && !slot.idle.empty()) {
      link l = std::move(slot.idle.back().l);
      slot.idle.pop_back();
      if (check_idle && !still_open(l)) continue;
      up.use(std::move(l), s, true);
      co_return true;
    }
    up.use(link(tcp_socket(ex_)), s, false);
    d.expires_after(rt.cfg.connect_timeout);
    auto [ec] = co_await up.sock->socket().async_connect(rt.servers[upstream][s], nothrow);
    if (ec == asio::error::operation_aborted && !d.expired) {
      up.release();  // the exchange was cancelled (its client left): no fault of the server's
      co_return false;
    }
    if (ec) {
      (d.expired ? metrics_.upstream_timeout : metrics_.upstream_connect).inc();
      slot.down_until = clock_.steady_now() + cfg.fail_timeout;
      resolve_soon_.store(true, std::memory_order_relaxed);
      up.release();
      continue;
    }
    up.sock->socket().set_option(tcp::no_delay(true), ec);
    if (rt.upstream_tls[upstream] && !co_await start_tls(rt, d, *up.sock, upstream, s)) {
      slot.down_until = clock_.steady_now() + cfg.fail_timeout;
      up.release();
      continue;
    }
    slot.down_until = {};
    co_return true;
  }
  co_return false;
}

awaitable<bool> upstream_pool::start_tls(const runtime& rt, io_deadline& d, link& l, std::size_t upstream,
                                         std::size_t s) {
  const auto& ctx = rt.upstream_tls[upstream];
  l.start_tls(*ctx, ctx);
  prepare_client_session(*l.tls(), rt.cfg.upstreams[upstream], rt.server_hosts[upstream][s]);
  // The connect's deadline (connect_timeout) covers the handshake too.
  auto [ec] = co_await l.tls()->async_handshake(asio::ssl::stream_base::client, nothrow);
  if (!ec) co_return true;
  metrics_.upstream_tls.inc();
  std::uint64_t suppressed = 0;
  if (tls_log_.allow(clock_.steady_now(), suppressed)) {
    log::get("proxy")->warn("upstream {} server {}: TLS handshake failed: {} ({} similar suppressed)",
                            rt.cfg.upstreams[upstream].name, to_string(rt.servers[upstream][s]),
                            d.classify(ec).message(), suppressed);
  }
  co_return false;
}

void upstream_pool::give_back(const runtime& rt, upstream_conn& up, std::size_t upstream) {
  if (generation_ == rt.generation && up.sock) {
    auto& slot = slots_[upstream][up.server];
    const auto keep = static_cast<std::size_t>(rt.cfg.upstreams[upstream].keepalive);
    const auto now = clock_.coarse_steady_now();  // a few ms of resolution do for a second's grace
    // Beyond `keepalive`, a connection of a burst stays a moment (up to
    // k_surplus times as many): the next burst takes it instead of opening
    // one more. The oldest of those go once idle for k_surplus_idle.
    while (slot.idle.size() > keep && now - slot.idle.front().since > k_surplus_idle) {
      slot.idle.erase(slot.idle.begin());
    }
    if (slot.idle.size() < keep * k_surplus) {
      slot.idle.push_back({std::move(*up.sock), now});
    }
  }
  up.release();
}

}  // namespace smockron::proxy
