// A listening socket for one of the master's stream endpoints (tcp://host:port
// or ipc://path, an abstract socket when the path starts with '@'):
// non-blocking, close-on-exec, its accepted connections inheriting its
// receive buffer.
#pragma once

#include <string>

namespace smockron::master {

struct bound_socket {
  int fd = -1;
  std::string endpoint;
  std::string unlink_path;  ///< an ipc:// file to remove when done (none for an abstract socket)
};

/// Binds and listens on `endpoint`; `rcvbuf` > 0 sets SO_RCVBUF. Throws
/// std::runtime_error naming the endpoint when it cannot.
bound_socket bind_endpoint(const std::string& endpoint, int rcvbuf);

}  // namespace smockron::master
