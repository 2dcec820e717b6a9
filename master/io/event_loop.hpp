// The master's loop: one epoll instance on the master's thread. What has
// descriptors to watch (the accounting reader: its listener and every
// gatekeeper's connection; the UDP query endpoint) registers them with a
// source to call when they are ready, and the service turns the loop
// (Redis's ae.c shape: the loop knows descriptors, the owners know protocols).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace smockron::master {

class event_loop {
public:
  /// A descriptor's owner: called with the epoll events that came (EPOLLIN,
  /// EPOLLOUT, EPOLLHUP, EPOLLERR), on the loop's thread.
  class source {
  public:
    virtual void on_ready(std::uint32_t events) = 0;

  protected:
    ~source() = default;
  };

  /// Throws std::system_error when the kernel gives no epoll instance.
  event_loop();
  ~event_loop();
  event_loop(const event_loop&) = delete;
  event_loop& operator=(const event_loop&) = delete;

  /// Watches `fd` for `events` (level-triggered: what one call leaves is seen
  /// again) until remove(). False (errno set) when the kernel refuses.
  bool add(int fd, std::uint32_t events, source& s);
  /// Changes what `fd` is watched for (0: nothing, for now).
  void modify(int fd, std::uint32_t events, source& s);
  /// Stops watching `fd` (before it is closed).
  void remove(int fd);

  /// Waits up to `timeout` for readiness (at most 60 s) and calls the source
  /// of each ready descriptor; returns how many there were. A source may add
  /// or remove descriptors meanwhile, but not destroy another ready source
  /// (owners close in the call and free afterwards).
  /// `hold` (if any) is locked once the wait is over, before any source is
  /// called: what the sources do is under it, the wait is not.
  int run_once(std::chrono::milliseconds timeout, std::unique_lock<std::mutex>* hold = nullptr);

private:
  int fd_ = -1;
};

}  // namespace smockron::master
