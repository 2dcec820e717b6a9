// One HTTP/2 stream of a client connection: the request as it arrived (its
// fields become the same request head an HTTP/1.1 request parses into), what
// the request steps decided, its body on its way upstream, and what answers
// it. The HTTP/1.1-client bridge (http1/bridge.cpp) uses the same object
// for its one upstream stream.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "proxy/codec/h2_fields.hpp"
#include "proxy/gate/slots.hpp"
#include "proxy/io/conn_io.hpp"
#include "proxy/request/access_log.hpp"
#include "proxy/request/admission.hpp"
#include "proxy/request/runtime.hpp"

namespace smockron::proxy {

class upstream_exchange;  // proxy/upstream/exchange.hpp

/// One stream: a request and what answers it.
struct h2_stream {
  h2_stream(std::int32_t i, std::size_t max_header) : id(i), fields(max_header) {}

  std::int32_t id;
  h2::request_fields fields;
  http1::request_head req;
  std::string target;  ///< a rewritten target (req.target points here then)
  std::shared_ptr<const runtime> rt;
  const route* r = nullptr;
  admission adm;
  std::unique_ptr<access_entry> entry;
  steady::time_point started{}, held_from{};
  /// The hold's timer (or, waiting for the start of its body, that wait's).
  std::unique_ptr<steady_timer> timer;
  /// Under a concurrency rule: the slot it holds while forwarded, or its
  /// place in the queue for one (slot_waiting), and when it was admitted.
  held_slot slot;
  std::unique_ptr<slot_wait> slot_queue;  ///< made only under a concurrency rule (a stream is small)
  bool slot_waiting = false;
  /// Exact admission: its question to the master (asking: waiting for the
  /// answer; ask_held: held until the time an answer named, to ask again).
  std::unique_ptr<ask_wait> ask;
  bool asking = false;
  bool ask_held = false;
  bool go_held = false;      ///< held until the time its GO named
  std::int64_t go_ask = -1;  ///< that GO's ASK number
  std::int64_t admitted_us = 0;
  bool dispatched = false;  ///< its head was complete and it was decided
  bool grpc = false;
  bool held = false;
  bool closed = false;    ///< nghttp2 closed it: done, or reset by the client
  bool body_end = false;  ///< the client's END_STREAM arrived
  /// Not 0: its steps wait for this much of the body (a cost estimate read from it).
  std::size_t prefix_wanted = 0;
  bool too_large = false;              ///< its body went over a bound (max_body_bytes, or what its cost may grow to)
  bool refused = false;                ///< its body is not wanted (answered by the proxy, or done): read and dropped
  bool forwarding = false;             ///< handed to its upstream
  bool resetting = false;              ///< nghttp2 resets it (for what the client sent): not to be forwarded
  std::string body_in;                 ///< request body bytes not yet sent upstream
  std::size_t body_at = 0;             ///< of which taken already (an HTTP/2 upstream takes them piecewise)
  steady::time_point last_progress{};  ///< response bytes last taken by nghttp2 (or first buffered)
  unsigned status = 0;
  std::string response_fields;      ///< the proxy's own lines (limit fields) for whatever answers
  upstream_exchange* up = nullptr;  ///< the upstream side, while forwarding (either protocol)
  /// What became of it: body bytes each way, the upstream server, the
  /// response's cost field (a route whose cost is read from the response).
  request_outcome outcome;
  /// What answering uses, made when the stream is answered or forwarded: a
  /// held stream does not carry it (most of its memory otherwise).
  struct response {
    std::string out;  ///< response body bytes nghttp2 has not taken yet
    std::size_t out_at = 0;
    bool out_end = false;      ///< no more response body bytes will come
    bool deferred = false;     ///< nghttp2 waits for body bytes (resume when some come)
    std::string fields_arena;  ///< bytes of the submitted response's fields
    std::string trailers_arena;
    std::vector<h2::field> trailers;  ///< response trailers (from an HTTP/2 upstream)
  };
  std::unique_ptr<response> res_;
  response& res() {
    if (!res_) res_ = std::make_unique<response>();
    return *res_;
  }

  /// Request body bytes for an HTTP/2 upstream: at most `n` into `buf`; `eof` once all are taken and the body ended.
  std::size_t take_body(std::uint8_t* buf, std::size_t n, bool& eof) {
    const std::size_t taken = std::min(n, body_in.size() - body_at);
    std::memcpy(buf, body_in.data() + body_at, taken);
    body_at += taken;
    if (body_at == body_in.size()) {
      body_in.clear();
      body_at = 0;
    }
    eof = body_end && body_in.empty();
    return taken;
  }
  std::size_t pending_out() const { return res_ ? res_->out.size() - res_->out_at : 0; }
};

}  // namespace smockron::proxy
