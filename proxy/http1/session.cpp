// One client connection (see session.hpp).
#include "proxy/http1/session.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include "proxy/codec/proxy_protocol.hpp"
#include "proxy/h2/session.hpp"
#include "proxy/http1/bridge.hpp"
#include "proxy/http1/forward.hpp"
#include "proxy/request/admission.hpp"
#include "proxy/request/request_steps.hpp"

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
      peer_text_ = format_ip(peer_);
      if (rt->listener_tls && rt->cfg.http2 && alpn_h2(*c_.client.tls())) {
        co_await serve_h2(s_, w_, conn_, rt, peer_, peer_text_);
        co_return;
      }
    }
    for (bool first = true;; first = false) {
      if (s_.newer_than(*w_.rt)) w_.rt = s_.current();
      // Between requests the connection is idle: closed after idle_timeout,
      // or at once when draining. On a new connection the header_timeout runs
      // from the accept: one deadline for the whole head.
      const bool deadline_running = first && c_.in.size() == 0;
      if (c_.in.size() == 0 && !co_await wait_for_request(first)) co_return;
      // This request's generation, whatever other sessions of the worker pick up meanwhile.
      const std::shared_ptr<const runtime> rt = w_.rt;
      if (first && rt->cfg.http2 && !c_.client.tls() && co_await h2_preface()) {
        co_await serve_h2(s_, w_, conn_, rt, peer_, peer_text_);
        co_return;
      }
      c_.idle = false;
      c_.tick = rt->tick;
      if (!deadline_running) c_.expires_after(rt->cfg.header_timeout);
      c_.response_fields.clear();  // the last request's fields are not this one's
      if (co_await read_head(*rt) == connection_next::ends) co_return;
      const connection_next next = co_await serve_request(rt);
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

  // Whether ALPN chose HTTP/2 during the handshake.
  static bool alpn_h2(tls_stream& tls) {
    const unsigned char* p = nullptr;
    unsigned n = 0;
    SSL_get0_alpn_selected(tls.native_handle(), &p, &n);
    return std::string_view(reinterpret_cast<const char*>(p), n) == "h2";
  }

  // Whether the connection starts with HTTP/2's preface (prior knowledge),
  // read within the head's deadline. False: an HTTP/1.1 request (or the
  // client went quiet; the head's own read finds out).
  awaitable<bool> h2_preface() {
    for (;;) {
      const std::string_view got = view(c_.in);
      const std::size_t n = std::min(got.size(), k_h2_preface.size());
      if (got.substr(0, n) != k_h2_preface.substr(0, n)) co_return false;
      if (n == k_h2_preface.size()) co_return true;
      auto [ec, r] = co_await read_more(c_, c_.client, c_.in.prepare(k_head_read), std::nullopt);
      if (ec) co_return false;
      c_.in.commit(r);
    }
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
  awaitable<connection_next> serve_request(const std::shared_ptr<const runtime>& generation) {
    const runtime& rt = *generation;
    http1::request_head& req = c_.request;
    s_.metrics.http1_requests.inc();
    // The access log's line, begun now: the head's views do not outlive forwarding.
    if (rt.cfg.access_log) {
      entry_ = begin_entry(rt, req, peer_, peer_text_, s_.clk.wall_us());
      started_ = s_.clk.steady_now();
    }
    // A route whose cost estimate is a number in the JSON body: its start first.
    std::string joined;
    std::string_view body_prefix;
    // (Not for a client that waits for 100-continue before it sends the body:
    // that is answered once the request is admitted, with cost_default.)
    if (const std::size_t want = req.expect_continue ? 0 : body_prefix_wanted(rt, req, false)) {
      if (!co_await read_body_prefix(want, rt.cfg.body_timeout)) co_return connection_next::ends;
      body_prefix = view(c_.in).substr(req.size, want);
      if (!c_.early.empty()) body_prefix = joined.assign(body_prefix).append(c_.early).substr(0, want);
    }
    const std::int64_t now_us = s_.clk.wall_us();
    admission_env env = admission_env_of(s_, w_);
    admission a;
    const steps_decision plan =
        plan_request(env, rt, req, c_.target, peer_, -1, a, c_.response_fields, entry_.get(), now_us, body_prefix);
    if (plan.next == next_step::answer) co_return co_await answer_plan(plan);
    const route* r = plan.r;
    if (plan.next == next_step::hold) {
      // Held until its release time, unless the client leaves first. (No
      // coroutine of its own: every frame alive during a hold is memory each
      // held request costs.)
      const auto held_from = entry_ ? s_.clk.steady_now() : steady::time_point{};
      c_.expires_never();
      shrink_head();
      // The gate speaks wall time; the hold is that far from now.
      const hold_end end = co_await hold(c_, std::chrono::microseconds(a.gate.release_us - s_.clk.wall_us()));
      end_hold(env, rt, *r, a, end, s_.clk.wall_us());
      if (entry_) entry_->held_ms = ms_since(held_from);
      if (end == hold_end::client_left) {
        answered(0);  // the client left while held
        co_return connection_next::ends;
      }
    }
    // Under a concurrency rule, a slot first (held until the exchange ends).
    // (The slot is the session's, not this frame's: every request's frame
    // would grow by it, concurrency rule or not.)
    if (s_.concurrency.any() && concurrency_limit(s_.concurrency, *r, a, s_.clk.wall_us()) > 0) {
      if (const auto refused = co_await take_slot(rt, *r, a, now_us, slot_)) co_return *refused;
    }
    // Exact admission: the master's word last, so that a request it lets go
    // goes (nothing else refuses it after).
    if (a.exact) {
      if (const auto refused = co_await ask_master(rt, *r, a, now_us)) {
        slot_.reset();
        co_return *refused;
      }
    }
    c_.outcome = {};
    c_.outcome.body_cost_limit = a.body_limit;
    forward_env fenv{w_.pool, s_.metrics, s_.draining, s_.clk};
    const http1::forward_info hop = next_hop(rt, peer_, peer_text_, c_.client.tls() != nullptr);
    // One awaitable in this frame (alive while a request is held), whichever protocol the upstream speaks.
    awaitable<connection_next> exchange = rt.cfg.upstreams[r->upstream_index].http2()
                                              ? forward_to_h2(s_, w_, generation, *r, c_, hop)
                                              : forward(fenv, rt, *r, c_, hop);
    const connection_next next = co_await std::move(exchange);
    slot_.reset();  // the exchange is over: its concurrency slot is free
    // A cost known only now (a response field, the body's size) is charged now.
    if (a.charge_when_done) charge_done(env, rt, *r, a, cost_when_done(*r, c_.outcome), s_.clk.wall_us());
    if (entry_) {
      note_outcome(*entry_, rt, r, c_.outcome);
      answered(c_.outcome.status);
    }
    co_return next;
  }

  // Exact admission (proxy/gate/asks.hpp): asks the master whether the
  // request may go, and waits for the answer at most control_fresh (then it
  // goes without one: fail-open). An answer to wait holds it until then and
  // it asks again, unless that is past its max_delay (or gRPC deadline) from
  // its admission (`admitted_us`): refused, with Retry-After at that time.
  // Nothing: it goes (accounted); else the connection's next step.
  awaitable<std::optional<connection_next>> ask_master(const runtime& rt, const route& r, admission& a,
                                                       std::int64_t admitted_us) {
    admission_env env = admission_env_of(s_, w_);
    const auto held_from = entry_ ? s_.clk.steady_now() : steady::time_point{};
    const auto note_held = [&] {
      if (entry_) entry_->held_ms += ms_since(held_from);
    };
    c_.expires_never();
    shrink_head();
    std::int64_t settles = -1;  // the ASK whose GO lets it go (-1: none came)
    for (;;) {
      ask_wait q;  // left if this frame is destroyed while it waits
      q.table = &w_.asks;
      q.w.wake = [this] {
        c_.hold_until = steady::now();  // the watchdog ends the wait now
        c_.rewatch();
      };
      const std::int64_t latest_ms = (admitted_us + a.max_delay_us) / 1000;
      if (!w_.asks.ask(r.domain, a.who->value, a.exact_units, a.tier, latest_ms, q.w, s_.clk.wall_us())) break;
      hold_end end = co_await hold(c_, rt.cfg.control_fresh);
      if (end == hold_end::client_left) {
        q.leave();
        note_held();
        // (A GO that came in the same turn is settled with no units.)
        const bool gone_with_go = q.w.answered && q.w.verdict == wire::verdict_kind::go;
        exact_abandoned(env, rt, r, a, s_.clk.wall_us(), gone_with_go ? q.w.answered_seq : -1);
        answered(0);  // the client left while waiting
        co_return connection_next::ends;
      }
      if (!q.w.answered) {
        q.leave();  // it goes, charged by its own accounting; a GO that comes is settled with no units
        s_.metrics.exact_unanswered.inc();
        break;
      }
      const std::int64_t now_us = s_.clk.wall_us();
      if (q.w.verdict == wire::verdict_kind::go) {
        settles = q.w.answered_seq;
        // A GO for later: held until then (its units are its own from then on).
        if (q.w.at_ms * 1000 > now_us) {
          end = co_await hold(c_, std::chrono::microseconds(q.w.at_ms * 1000 - now_us));
          if (end == hold_end::client_left) {
            note_held();
            exact_abandoned(env, rt, r, a, s_.clk.wall_us(), settles);
            answered(0);
            co_return connection_next::ends;
          }
        }
        break;
      }
      const bool never = q.w.verdict == wire::verdict_kind::never;
      const std::int64_t at_us = q.w.at_ms * 1000;
      if (never || at_us > admitted_us + a.max_delay_us) {
        note_held();
        exact_refused(env, rt, r, a, never, now_us);
        if (entry_) note_admission(*entry_, r, a);  // refused, not what the gate planned
        const refusal no = refusal_for_exact(env.g, rt, r, a, never ? -1 : at_us - now_us, now_us, c_.response_fields);
        answered(no.status);
        co_return co_await answer(no.status, no.text, no.retry_after_s);
      }
      end = co_await hold(c_, std::chrono::microseconds(std::max<std::int64_t>(at_us - now_us, 0)));
      if (end == hold_end::client_left) {
        note_held();
        exact_abandoned(env, rt, r, a, s_.clk.wall_us());
        answered(0);
        co_return connection_next::ends;
      }
    }
    note_held();
    exact_went(env, rt, r, a, s_.clk.wall_us(), settles);
    co_return std::nullopt;
  }

  // Takes a concurrency slot for the request, waiting for one until
  // max_delay from its admission (`admitted_us`). Nothing: it holds `slot`
  // and goes; else the connection's next step (refused, or the client left).
  awaitable<std::optional<connection_next>> take_slot(const runtime& rt, const route& r, admission& a,
                                                      std::int64_t admitted_us, held_slot& slot) {
    slot_wait queue;  // left if this frame is destroyed while it waits
    queue.table = &w_.slots;
    slot_table::waiter& w = queue.w;
    w.wake = [this] {
      c_.hold_until = steady::now();  // the watchdog ends the hold now
      c_.rewatch();
    };
    const std::int64_t now_us = s_.clk.wall_us();
    if (auto* e = w_.slots.acquire(r.domain, a.who->value, w_.accounting.delivers(r.domain), w, now_us, a.tier)) {
      slot = held_slot(w_.slots, e);
      co_return std::nullopt;
    }
    s_.metrics.concurrency_waits.inc();
    const auto held_from = entry_ ? s_.clk.steady_now() : steady::time_point{};
    c_.expires_never();
    shrink_head();
    const std::int64_t left_us = admitted_us + rt.route_limits[r.index].max_delay_us - now_us;
    const hold_end end = co_await hold(c_, std::chrono::microseconds(std::max<std::int64_t>(left_us, 0)));
    if (entry_) entry_->held_ms += ms_since(held_from);
    if (w.granted) slot = held_slot(w_.slots, w.granted);
    else w_.slots.cancel(w, s_.clk.wall_us());
    if (end == hold_end::client_left || !slot) {
      // Not forwarded: a reservation it holds is closed at its estimate.
      admission_env env = admission_env_of(s_, w_);
      close_reservation(env, rt, r, a);
    }
    if (end == hold_end::client_left) {
      answered(0);  // the client left while waiting (its slot, if one came, is given back)
      co_return connection_next::ends;
    }
    if (slot) co_return std::nullopt;
    s_.metrics.reject_concurrency.inc();
    const refusal no =
        refusal_for_concurrency(r, concurrency_limit(s_.concurrency, r, a, s_.clk.wall_us()), c_.response_fields);
    answered(no.status);
    co_return co_await answer(no.status, no.text, no.retry_after_s);
  }

  // Answers a request the steps refused (a coroutine of its own: its frame is not every request's).
  awaitable<connection_next> answer_plan(const steps_decision& plan) {
    answered(plan.status);
    const unsigned version = c_.request.version;
    if (!plan.why.empty()) co_return co_await refuse_bad_request(version, plan.why);
    if (plan.body_unread) co_return co_await refuse(c_, version, plan.status, plan.text);
    co_return co_await answer(plan.status, plan.text, plan.retry_after_s);
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

  // 400 with the reason (its text built in this frame, not in every request's).
  awaitable<connection_next> refuse_bad_request(unsigned version, std::string_view why) {
    co_return co_await refuse(c_, version, 400, "bad request: " + std::string(why) + "\n");
  }

  // Reads until `want` bytes of the body are in: those that came with the
  // head, then more into `early` (forwarded after the head, as the bytes that
  // arrive during a hold are), so the head's views into `in` stay where they
  // are. False when the client went away or took longer than `timeout`.
  awaitable<bool> read_body_prefix(std::size_t want, steady::duration timeout) {
    const std::size_t with_head = c_.in.size() - c_.request.size;
    while (with_head + c_.early.size() < want) {
      const std::size_t at = c_.early.size();
      c_.early.resize(want - with_head);
      const auto [ec, n] =
          co_await read_more(c_, c_.client, asio::buffer(c_.early.data() + at, c_.early.size() - at), timeout);
      c_.early.resize(at + n);
      if (ec) co_return false;
    }
    co_return true;
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
  held_slot slot_;  ///< the concurrency slot of the request being forwarded (none: empty)
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
