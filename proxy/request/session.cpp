// One client connection (see session.hpp).
#include "proxy/request/session.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include "proxy/codec/path.hpp"
#include "proxy/codec/proxy_protocol.hpp"
#include "proxy/request/access_log.hpp"
#include "proxy/request/admission.hpp"
#include "proxy/request/forward.hpp"
#include "proxy/request/ratelimit_fields.hpp"

namespace smockron::proxy {
namespace {

class session {
public:
  session(shared_state& s, worker& w, std::shared_ptr<connection> conn)
      : s_(s), w_(w), conn_(std::move(conn)), c_(*conn_) {}

  awaitable<void> run() {
    boost::system::error_code ignored;
    c_.client.socket().set_option(tcp::no_delay(true), ignored);
    if (auto parsed = parse_ip(c_.client.socket().remote_endpoint(ignored).address().to_string())) peer_ = *parsed;
    {
      // The connection's own stages (PROXY header, TLS) use the generation in
      // force when it was accepted: a reload reaches the very next connection,
      // even the first one a worker accepts after it.
      if (s_.newer_than(*w_.rt)) w_.rt = s_.current();
      const std::shared_ptr<const runtime> rt = w_.rt;
      if (rt->cfg.proxy_protocol && !co_await read_proxy_header(*rt)) co_return;
      if (rt->listener_tls && !co_await tls_handshake(*rt)) co_return;
    }
    peer_text_ = format_ip(peer_);
    for (bool first = true;; first = false) {
      if (s_.newer_than(*w_.rt)) w_.rt = s_.current();
      // Between requests the connection is idle: closed after idle_timeout,
      // or at once when draining. On a new connection the header_timeout runs
      // from the accept: one deadline for the whole head.
      const bool deadline_running = first && c_.in.size() == 0;
      if (c_.in.size() == 0 && !co_await wait_for_request(first)) co_return;
      // This request's generation, whatever other sessions of the worker pick up meanwhile.
      const std::shared_ptr<const runtime> rt = w_.rt;
      c_.idle = false;
      c_.tick = rt->tick;
      if (!deadline_running) c_.expires_after(rt->cfg.header_timeout);
      c_.response_fields.clear();  // the last request's fields are not this one's
      if (co_await read_head(*rt) == connection_next::ends) co_return;
      const connection_next next = co_await serve_request(*rt);
      write_entry();  // the request's one access-log record, whichever way it ended
      if (next == connection_next::ends) co_return;
    }
  }

private:
  // The PROXY protocol header a load balancer sends first: the client it
  // names becomes the peer (LOCAL and UNKNOWN keep the socket's). It counts
  // against max_header_bytes and header_timeout. False: missing, invalid or
  // late; the connection is closed without a response, as HAProxy does.
  awaitable<bool> read_proxy_header(const runtime& rt) {
    const auto limit = static_cast<std::size_t>(rt.cfg.max_header_bytes);
    c_.expires_after(rt.cfg.header_timeout);
    for (;;) {
      const auto r = proxy_protocol::parse(view(c_.in), limit);
      if (r.state == proxy_protocol::status::complete) {
        if (r.source) peer_ = *r.source;
        c_.in.consume(r.consumed);
        co_return true;
      }
      if (r.state == proxy_protocol::status::invalid) break;
      auto [ec, n] = co_await read_more(c_, c_.client, c_.in.prepare(k_head_read), std::nullopt);
      if (ec) break;
      c_.in.commit(n);
    }
    s_.metrics.proxy_protocol_error.inc();
    co_return false;
  }

  // The TLS handshake, within header_timeout (its own; the request head
  // gets another). Bytes already read (behind a PROXY header) are its start.
  // False: failed or late, closed without a response.
  awaitable<bool> tls_handshake(const runtime& rt) {
    c_.client.start_tls(rt.listener_tls->context(), rt.listener_tls);
    c_.expires_after(rt.cfg.header_timeout);
    auto [ec, used] = co_await c_.client.tls()->async_handshake(asio::ssl::stream_base::server, c_.in.data(), nothrow);
    c_.in.consume(used);
    if (ec || c_.in.size() > 0) {
      s_.metrics.tls_handshake_error.inc();
      co_return false;
    }
    co_return true;
  }

  // Waits for the first bytes of a request on an idle connection. False:
  // closed, draining, or silent until the deadline.
  awaitable<bool> wait_for_request(bool first) {
    if (s_.draining) co_return false;
    c_.idle = true;
    const auto& cfg = w_.rt->cfg;
    auto [ec, n] =
        co_await read_first(c_, c_.client, c_.in.prepare(k_head_read), first ? cfg.header_timeout : cfg.idle_timeout);
    if (ec) co_return false;
    c_.in.commit(n);
    if (s_.newer_than(*w_.rt)) w_.rt = s_.current();  // a reload while this connection was idle
    co_return true;
  }

  // Reads the rest of a request head within max_header_bytes and the
  // deadline running, or answers why not (408, 414, 431, 400).
  awaitable<connection_next> read_head(const runtime& rt) {
    const auto limit = static_cast<std::size_t>(rt.cfg.max_header_bytes);
    http1::parse_result parsed;
    for (std::size_t scanned = 0;;) {
      parsed = http1::parse_request(view(c_.in), limit, c_.request, scanned);
      if (parsed.status != http1::parse_status::incomplete) break;
      const auto room = std::min(std::max(k_head_read, c_.in.size()), limit - c_.in.size());
      auto [ec, n] = co_await read_more(c_, c_.client, c_.in.prepare(room), std::nullopt);
      if (ec) {
        if (c_.expired) {
          s_.metrics.header_timeout.inc();
          co_await respond(c_, 11, 408, "request head not received in time\n", false);
        }
        co_return connection_next::ends;
      }
      c_.in.commit(n);
    }
    switch (parsed.status) {
      case http1::parse_status::complete: co_return connection_next::goes_on;
      case http1::parse_status::line_too_long:
        s_.metrics.header_too_large.inc();
        co_return co_await refuse(c_, 11, 414, "request line too long\n");
      case http1::parse_status::headers_too_large:
        s_.metrics.header_too_large.inc();
        co_return co_await refuse(c_, 11, 431, "request headers too large\n");
      default: s_.metrics.bad_request.inc(); co_return co_await refuse_bad_request(11, parsed.reason);
    }
  }

  // One request whose head is in c_.request.
  awaitable<connection_next> serve_request(const runtime& rt) {
    http1::request_head& req = c_.request;
    const unsigned version = req.version;
    // The access log's line, begun now: the head's views do not outlive forwarding.
    if (rt.cfg.access_log) begin_entry(rt);
    if (req.body == http1::framing::length && rt.cfg.max_body_bytes > 0 && req.content_length > rt.cfg.max_body_bytes) {
      s_.metrics.bad_request.inc();
      answered(413);
      co_return co_await refuse(c_, version, 413, "request body too large\n");
    }
    std::string_view why;
    const route* r = route_for(rt, why);
    if (!why.empty()) {
      s_.metrics.bad_request.inc();
      answered(400);
      co_return co_await refuse_bad_request(version, why);
    }
    if (!r) {
      s_.metrics.no_route.inc();
      answered(404);
      co_return co_await answer(404, "no route\n", 0);
    }
    const std::int64_t now_us = s_.clk.wall_us();
    admission_env env{s_.gate, s_.metrics, w_.accounting};
    const admission a = admit(env, rt, *r, req, peer_, now_us);
    add_response_fields(rt, *r, a, now_us);
    if (entry_) {
      entry_->decision = to_string(a.outcome);
      entry_->shadow = a.shadow ? to_string(*a.shadow) : std::string_view{};
      entry_->domain = r->domain;
      if (a.who) entry_->identifier = a.who->value;
    }
    if (a.outcome == decision::rejected) {
      // A full queue is the proxy's own capacity, not the client's limit: 503 whatever the route's status.
      const bool full = a.gate.reason == reject_reason::held_full;
      const unsigned status = a.ambiguous ? 400 : a.unidentified ? 403 : a.no_master || full ? 503 : r->status;
      answered(status);
      if (a.ambiguous)
        co_return co_await answer(400, "bad request: more than one value for the client identifier\n", 0);
      if (a.no_master) co_return co_await answer(503, "no rate-limit master covers this route, retry later\n", 1);
      if (a.unidentified)
        co_return co_await answer(403, "this route needs an identifier the request does not carry\n", 0);
      co_return co_await answer(status,
                                full ? "too many requests held, retry later\n" : "rate limit exceeded, retry later\n",
                                a.gate.retry_after_s);
    }
    if (a.outcome == decision::delayed) {
      // Held until its release time, unless the client leaves first. (No
      // coroutine of its own: every frame alive during a hold is memory each
      // held request costs.)
      const auto held_from = entry_ ? s_.clk.steady_now() : steady::time_point{};
      c_.expires_never();
      shrink_head();
      // The gate speaks wall time; the hold is that far from now.
      const hold_end end = co_await hold(c_, std::chrono::microseconds(a.gate.release_us - s_.clk.wall_us()));
      held(rt, *r, a, end);
      if (entry_) entry_->held_ms = ms_since(held_from);
      if (end == hold_end::client_left) {
        answered(0);  // the client left while held
        co_return connection_next::ends;
      }
    }
    forward_env fenv{w_.pool, s_.metrics, s_.draining, s_.clk};
    http1::forward_info hop;
    hop.peer_ip = peer_text_;
    hop.proto = c_.client.tls() ? "https" : "http";
    hop.forwarded_element = rt.cfg.real_ip_header == config::proxy_config::real_ip_header_kind::forwarded;
    hop.trusted_peer = std::any_of(rt.cfg.trusted_proxies.begin(), rt.cfg.trusted_proxies.end(),
                                   [&](const cidr& c) { return c.contains(peer_); });
    const connection_next next = co_await forward(fenv, rt, *r, c_, hop);
    if (entry_) {
      const request_outcome& o = c_.outcome;
      entry_->bytes_in = o.bytes_in;
      entry_->bytes_out = o.bytes_out;
      if (o.server) entry_->upstream = to_string(rt.servers[r->upstream_index][*o.server]);
      answered(o.status);
    }
    co_return next;
  }

  // The rate-limit fields (always when limited, on every response with
  // ratelimit_headers) and the decision (explain) for whatever answers.
  void add_response_fields(const runtime& rt, const route& r, const admission& a, std::int64_t now_us) {
    const bool limited =
        a.outcome == decision::delayed || (a.outcome == decision::rejected && a.gate.v == verdict::reject);
    if (a.who && !r.domain.empty() && (limited || r.ratelimit_headers)) {
      const auto q = s_.gate.quota(rt.gate_domain[r.domain_index], a.who->value, now_us);
      const std::int64_t throttled_s = limited ? std::max<std::int64_t>(1, a.gate.retry_after_s) : 0;
      append_ratelimit_fields(c_.response_fields, r.domain, q, throttled_s);
    }
    if (r.explain) {
      const std::string_view reason = a.no_master                                 ? "no_master"
                                      : a.ambiguous                               ? "ambiguous_identifier"
                                      : a.unidentified                            ? "unidentified"
                                      : a.gate.reason == reject_reason::held_full ? "held_full"
                                                                                  : "delay_too_long";
      append_decision_field(c_.response_fields, a.outcome, a.shadow, reason,
                            a.outcome == decision::delayed ? (a.gate.release_us - now_us + 999) / 1000 : 0);
    }
  }

  void begin_entry(const runtime& rt) {
    const http1::request_head& req = c_.request;
    entry_ = std::make_unique<access_entry>();
    entry_->time_us = s_.clk.wall_us();
    entry_->client = format_ip(client_address(req.headers, peer_, rt.cfg.trusted_proxies, rt.cfg.real_ip_header));
    entry_->peer = peer_text_;
    entry_->method = req.method;
    entry_->target = redact_query(req.target, rt.redacted_query);  // hashed credentials stay hashed
    started_ = s_.clk.steady_now();
  }

  double ms_since(steady::time_point from) const {
    return std::chrono::duration<double, std::milli>(s_.clk.steady_now() - from).count();
  }

  // The request's outcome for its access-log record: the status sent (0:
  // none, the client or upstream went away) and the time until it was known
  // (a refused client's lingering close is not the request's time).
  void answered(unsigned status) {
    if (!entry_) return;
    entry_->status = status;
    entry_->duration_ms = ms_since(started_);
  }

  // Writes the request's record, once, when the request is done (as h2o logs
  // at request disposal); the stages only fill it in.
  void write_entry() {
    if (!entry_) return;
    if (auto* log = s_.access.get()) log->write(*entry_);
    entry_.reset();
  }

  // Normalizes the path of the request target (with normalize_path; path.hpp)
  // and works out what routes match: the path without segment parameters
  // (`route_path`, set only when that differs from the target's path). The
  // request then goes on with the normalized target, its parameters kept or
  // stripped (path_parameters). False (`why` set) when the path cannot be
  // normalized safely, or carries parameters the configuration refuses.
  bool prepare_path(const runtime& rt, std::string& route_path, std::string_view& why) {
    http1::request_head& req = c_.request;
    const std::string_view target = req.target;
    const std::string_view p = target.substr(0, target.find('?'));
    if (!p.starts_with('/')) return true;  // "*" or absolute-form
    using params = config::proxy_config::path_parameters_action;
    const params action = rt.cfg.path_parameters;
    const bool has_params = p.find(';') != std::string_view::npos;
    if (has_params) {
      if (action == params::reject) {
        why = "parameters in path";
        return false;
      }
      // "/api/..;/x": the routes see "/x", a backend that keeps parameters "/api/..;/x".
      if (action == params::keep && path::hides_dot_segment(p)) {
        why = "dot-segment with parameters in path";
        return false;
      }
      route_path = path::strip_parameters(p);
      if (rt.normalize_path) route_path = path::normalize(route_path, rt.path_options, why);
      if (!why.empty()) return false;
      if (action == params::strip) return retarget(std::string(route_path), p.size());
    }
    if (!rt.normalize_path || path::already_normal(p, rt.path_options)) return true;
    std::string normal = path::normalize(p, rt.path_options, why);
    if (!why.empty()) return false;
    return retarget(std::move(normal), p.size());
  }

  // The request goes on with `path` and the query as sent (the target's part after its first `path_size` bytes).
  bool retarget(std::string path, std::size_t path_size) {
    http1::request_head& req = c_.request;
    path.append(req.target.substr(path_size));
    c_.target = std::move(path);
    req.target = c_.target;
    return true;
  }

  // A response of the proxy's own to a request that has no body to skip
  // (else the connection closes after it: unread body bytes would be parsed
  // as the next request).
  awaitable<connection_next> answer(unsigned status, std::string_view body, std::int64_t retry_after_s) {
    const http1::request_head& req = c_.request;
    const bool go_on = req.keep_alive && req.body == http1::framing::none && !s_.draining;
    if (co_await respond(c_, req.version, status, body, go_on, retry_after_s) == connection_next::ends)
      co_return connection_next::ends;
    c_.in.consume(req.size);
    co_return connection_next::goes_on;
  }

  // A hold ended: its place among the held is free; a client that left gives its slot back to the gate.
  void held(const runtime& rt, const route& r, const admission& a, hold_end end) {
    s_.gate.release_held(rt.route_limits[r.index]);
    if (end == hold_end::released) return;
    s_.metrics.client_gone_held.inc();
    s_.gate.cancel(rt.gate_domain[r.domain_index], a.who->value, a.gate, s_.clk.wall_us());
  }

  // The route of the request, after its path was prepared (prepare_path):
  // nullptr when none matches, or `why` set when the path is refused.
  const route* route_for(const runtime& rt, std::string_view& why) {
    std::string route_path;  // set when routes match another form of the path than the one forwarded
    if (!prepare_path(rt, route_path, why)) return nullptr;
    const std::string_view target = c_.request.target;
    return rt.routes.match(c_.request.host,
                           route_path.empty() ? target.substr(0, target.find('?')) : std::string_view(route_path));
  }

  // 400 with the reason (its text built in this frame, not in every request's).
  awaitable<connection_next> refuse_bad_request(unsigned version, std::string_view why) {
    co_return co_await refuse(c_, version, 400, "bad request: " + std::string(why) + "\n");
  }

  // While held, the head buffer keeps only the bytes read (it was made for
  // any head: most of a held request's memory otherwise).
  void shrink_head() {
    const char* from = static_cast<const char*>(c_.in.data().data());
    const std::size_t n = c_.in.size();
    c_.in.shrink_to_fit();
    http1::rebase(c_.request, from, n, static_cast<const char*>(c_.in.data().data()));
  }

  shared_state& s_;
  worker& w_;
  std::shared_ptr<connection> conn_;
  connection& c_;
  ip_address peer_;
  std::string peer_text_;
  /// The current request's access log line (access_log on). On the heap: every
  /// connection's frame would otherwise carry its 300 bytes, access log or not.
  std::unique_ptr<access_entry> entry_;
  steady::time_point started_{};
};

}  // namespace

awaitable<void> serve_connection(shared_state& s, worker& w, tcp_socket socket) {
  auto conn = std::make_shared<connection>(std::move(socket), s.clk, w.rt->tick);
  ++s.connections;
  w.sessions.insert(conn.get());
  struct unregister {
    shared_state& s;
    worker& w;
    connection& c;
    ~unregister() {
      w.sessions.erase(&c);
      c.close();
      --s.connections;
    }
  } guard{s, w, *conn};
  connection::watch(conn);
  session sess(s, w, conn);
  co_await sess.run();
  // TLS ends with close_notify, as nginx's SSL_shutdown: without it a client
  // cannot tell a body delimited by the close from a truncated one. The
  // peer's own close_notify (or its close) is awaited for a moment only.
  if (tls_stream* tls = conn->client.tls(); tls && !conn->expired) {
    conn->expires_after(std::chrono::seconds(1));
    co_await tls->async_shutdown(nothrow);
  }
}

}  // namespace smockron::proxy
