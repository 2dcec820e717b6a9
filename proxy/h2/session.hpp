// An HTTP/2 client connection (RFC 9113): libnghttp2's session API is the
// frame codec (HPACK, stream states, flow control, frame validation) and our
// Asio I/O drives it: one read loop feeds it the client's bytes, one write
// loop sends what it has to send. Every stream is a request with the same
// steps as an HTTP/1.1 one (request_steps.hpp): route, identification, the
// gate, accounting, the access log. A held stream waits on a timer of its
// own while the connection's other streams go on; a stream the client resets
// while held is dropped and its slot given back. Admitted streams go to
// their upstream over HTTP/1.1 (translated both ways) or HTTP/2 (h2c/h2:
// multiplexed, trailers and all, which is what gRPC needs).
//
// The client's abuse is bounded and counted (smockron_proxy_http2_abuse_total):
// concurrent streams, resets (Rapid Reset, and streams the server resets for what the client sent), frames that carry
// no request (SETTINGS, PING, PRIORITY, empty DATA, unearned WINDOW_UPDATE), CONTINUATION frames per header block, the
// decoded header list, and a response stalled behind a window the client never opens (body_timeout).
#pragma once

#include <memory>
#include <string>

#include "proxy/io/conn_io.hpp"
#include "proxy/request/worker.hpp"

namespace smockron::proxy {

/// The connection preface a client with prior knowledge sends first (RFC 9113 3.4).
inline constexpr std::string_view k_h2_preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves HTTP/2 on `conn` until it ends: its TLS handshake done (ALPN h2),
/// or in the clear with the bytes read so far (the preface) in `conn->in`.
/// `rt`: the generation in force when the connection was accepted.
awaitable<void> serve_h2(shared_state& s, worker& w, std::shared_ptr<connection> conn,
                         std::shared_ptr<const runtime> rt, const ip_address& peer, std::string peer_text);

}  // namespace smockron::proxy
