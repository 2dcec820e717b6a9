// recv() and sendmsg() as bare system calls. glibc's wrappers are thread
// cancellation points and pay two atomic operations per call for it, on
// every read and write of the request path; the proxy never cancels a thread.
// Same results as the libc calls: -1 with errno on failure.
#pragma once

#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>

namespace smockron::proxy::sys {

inline ssize_t recv(int fd, void* data, std::size_t size, int flags) {
  return ::syscall(SYS_recvfrom, fd, data, size, flags, nullptr, nullptr);
}

inline ssize_t sendmsg(int fd, const msghdr* msg, int flags) { return ::syscall(SYS_sendmsg, fd, msg, flags); }

}  // namespace smockron::proxy::sys
