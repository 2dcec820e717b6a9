// An HTTP/1.1 client's request on an HTTP/2 upstream (h2c or h2): the
// request body goes up de-chunked as it comes, the response's events come
// back as an HTTP/1.1 response (chunked with its trailers for HTTP/1.1, until
// close for HTTP/1.0). A response writer over the upstream exchange's
// events (proxy/upstream/exchange.hpp); the HTTP/2 stream itself is
// h2_upstream.hpp's.
#pragma once

#include <memory>

#include "proxy/codec/http1.hpp"
#include "proxy/io/conn_io.hpp"
#include "proxy/request/worker.hpp"

namespace smockron::proxy {

/// Forwards an HTTP/1.1 client's request (`c.request`, its head at the front
/// of `c.in`) to route `r`'s HTTP/2 upstream: the body streamed up as it
/// comes (de-chunked), the response back re-framed for the client (chunked,
/// trailers included, for HTTP/1.1; until close for HTTP/1.0). Fills
/// `c.outcome`; returns whether the client connection goes on.
awaitable<connection_next> forward_to_h2(shared_state& s, worker& w, std::shared_ptr<const runtime> rt, const route& r,
                                         connection& c, const http1::forward_info& hop);

}  // namespace smockron::proxy
