// One client connection, top to bottom: read a request head (with its
// deadline and limits), route it, admit it (admission.hpp), answer, hold or
// forward it (forward.hpp), log it, and go on with the next request while
// the connection is kept alive.
#pragma once

#include "proxy/io/asio_types.hpp"
#include "proxy/request/worker.hpp"

namespace smockron::proxy {

/// Serves the connection `socket` on worker `w` until it closes.
awaitable<void> serve_connection(shared_state& s, worker& w, tcp_socket socket);

}  // namespace smockron::proxy
