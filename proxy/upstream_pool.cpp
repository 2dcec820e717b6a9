// Upstream connections (see upstream_pool.hpp).
#include "proxy/upstream_pool.hpp"

#include <sys/socket.h>

#include <cerrno>

namespace smockron::proxy {
namespace {

// An idle pooled connection the upstream has neither closed nor written to.
bool still_open(tcp_socket& sock) {
  char ch;
  const auto n = ::recv(sock.native_handle(), &ch, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

void upstream_pool::adopt(const runtime& rt) {
  slots_.clear();
  slots_.resize(rt.servers.size());
  for (std::size_t u = 0; u < rt.servers.size(); ++u) slots_[u].resize(rt.servers[u].size());
  round_robin_.assign(rt.servers.size(), 0);
  generation_ = rt.generation;
}

bool upstream_pool::take_pooled(const runtime& rt, connection& c, std::size_t upstream, bool check_idle) {
  if (generation_ != rt.generation) return false;
  auto& slots = slots_[upstream];
  const std::size_t s = round_robin_[upstream] % slots.size();
  auto& slot = slots[s];
  if (slot.idle.empty() || (slot.down_until != steady::time_point{} && slot.down_until > clock_.steady_now())) {
    return false;
  }
  if (check_idle && !still_open(slot.idle.back())) return false;  // acquire() drops it
  ++round_robin_[upstream];
  c.up.use(std::move(slot.idle.back()), s, true);
  slot.idle.pop_back();
  return true;
}

awaitable<bool> upstream_pool::acquire(const runtime& rt, connection& c, std::size_t upstream, bool allow_reuse,
                                       bool check_idle) {
  if (generation_ != rt.generation) adopt(rt);
  upstream_conn& up = c.up;
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
      tcp_socket sock = std::move(slot.idle.back());
      slot.idle.pop_back();
      if (check_idle && !still_open(sock)) continue;
      up.use(std::move(sock), s, true);
      co_return true;
    }
    up.use(tcp_socket(c.client.get_executor()), s, false);
    c.expires_after(rt.cfg.connect_timeout);
    auto [ec] = co_await up.sock->async_connect(rt.servers[upstream][s], nothrow);
    if (ec) {
      (c.expired ? metrics_.upstream_timeout : metrics_.upstream_connect).inc();
      slot.down_until = clock_.steady_now() + cfg.fail_timeout;
      resolve_soon_.store(true, std::memory_order_relaxed);
      up.release();
      continue;
    }
    up.sock->set_option(tcp::no_delay(true), ec);
    slot.down_until = {};
    co_return true;
  }
  co_return false;
}

void upstream_pool::give_back(const runtime& rt, connection& c, std::size_t upstream) {
  upstream_conn& up = c.up;
  if (generation_ == rt.generation && up.sock) {
    auto& slot = slots_[upstream][up.server];
    if (static_cast<std::int64_t>(slot.idle.size()) < rt.cfg.upstreams[upstream].keepalive) {
      slot.idle.push_back(std::move(*up.sock));
    }
  }
  up.release();
}

}  // namespace smockron::proxy
