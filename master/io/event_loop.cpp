// The master's loop (see event_loop.hpp).
#include "master/io/event_loop.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <system_error>

namespace smockron::master {

event_loop::event_loop() : fd_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
}

event_loop::~event_loop() { ::close(fd_); }

bool event_loop::add(int fd, std::uint32_t events, source& s) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = &s;
  return ::epoll_ctl(fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

void event_loop::modify(int fd, std::uint32_t events, source& s) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = &s;
  ::epoll_ctl(fd_, EPOLL_CTL_MOD, fd, &ev);
}

void event_loop::remove(int fd) { ::epoll_ctl(fd_, EPOLL_CTL_DEL, fd, nullptr); }

int event_loop::run_once(std::chrono::milliseconds timeout, std::unique_lock<std::mutex>* hold) {
  std::array<epoll_event, 64> events;
  const int n = ::epoll_wait(fd_, events.data(), static_cast<int>(events.size()),
                             static_cast<int>(std::clamp<std::int64_t>(timeout.count(), 0, 60'000)));
  if (n < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "epoll_wait");
  if (hold != nullptr) hold->lock();
  for (int i = 0; i < n; ++i) static_cast<source*>(events[i].data.ptr)->on_ready(events[i].events);
  return std::max(n, 0);
}

}  // namespace smockron::master
