// Each stream of a client connection: the request steps, answers, holds, forwarding, HTTP/2 upstream events (see
// connection.hpp).
#include "proxy/h2/connection.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include "proxy/upstream/h1_upstream.hpp"

#include <algorithm>
#include <cstdlib>

namespace smockron::proxy {

using namespace h2_detail;

void h2_connection::dispatch(const std::shared_ptr<h2_stream>& st, bool end_stream) {
  st->dispatched = true;
  if (end_stream) st->body_end = true;
  if (s_.newer_than(*w_.rt)) w_.rt = s_.current();
  st->rt = w_.rt;
  const runtime& rt = *st->rt;
  s_.metrics.h2_requests.inc();
  const bool too_large = st->fields.too_large();
  const std::string_view why = too_large ? std::string_view{} : st->fields.finish(end_stream, st->req);
  st->grpc = h2::grpc::is_grpc(st->fields.content_type());
  if (rt.cfg.access_log) {
    st->entry = begin_entry(rt, st->req, peer_, peer_text_, s_.clk.wall_us());
    st->entry->protocol = "HTTP/2";
    st->started = s_.clk.steady_now();
  }
  if (too_large) {
    s_.metrics.header_too_large.inc();
    s_.metrics.h2_header_list.inc();
    answer(*st, 431, "request headers too large\n");
    return;
  }
  if (!why.empty()) {
    s_.metrics.bad_request.inc();
    answer(*st, 400, "bad request: " + std::string(why) + "\n");
    return;
  }
  if (const std::size_t want = end_stream ? 0 : body_prefix_wanted(rt, st->req, true)) {
    // The DATA are kept in body_in as they come (the connection's window
    // given back on arrival; the stream's, at most 64 KiB, when forwarded).
    st->prefix_wanted = want;
    st->timer = std::make_unique<steady_timer>(exec_);
    st->timer->expires_after(rt.cfg.body_timeout);
    st->timer->async_wait([self = shared_from_this(), st](const boost::system::error_code& ec) {
      if (!ec && awaits_body(*st)) self->decide(st);  // what came is what there is
    });
    return;
  }
  decide(st);
}

void h2_connection::decide(const std::shared_ptr<h2_stream>& st) {
  const runtime& rt = *st->rt;
  std::string_view body_prefix;
  if (st->prefix_wanted != 0) {
    body_prefix = std::string_view(st->body_in).substr(0, st->prefix_wanted);
    st->prefix_wanted = 0;
    if (st->timer) st->timer->cancel();
  }
  const std::int64_t now_us = s_.clk.wall_us();
  admission_env env = admission_env_of(s_, w_);
  // A gRPC call is not held past its deadline: refused at once instead (as a hold beyond max_delay is).
  const auto deadline = st->grpc ? h2::grpc::parse_timeout(st->fields.grpc_timeout()) : std::nullopt;
  const steps_decision plan = plan_request(env, rt, st->req, st->target, peer_, deadline ? deadline->count() : -1,
                                           st->adm, st->response_fields, st->entry.get(), now_us, body_prefix);
  st->r = plan.r;
  st->admitted_us = now_us;  // a concurrency slot is waited for until max_delay from now, held by the rate or not
  const admission& a = st->adm;
  st->outcome.body_cost_limit = a.body_limit;
  if (plan.next == next_step::answer) {
    if (!plan.why.empty()) {
      answer(*st, 400, "bad request: " + std::string(plan.why) + "\n");
    } else {
      answer(*st, plan.status, plan.text, plan.retry_after_s, plan.by_limit ? plan.r->grpc_status : 0,
             plan.retry_after_s > 0 ? plan.retry_after_s * 1000 : -1);
    }
    return;
  }
  if (plan.next == next_step::hold) {
    const std::int64_t wait_us = a.gate.release_us - now_us;
    st->held = true;
    st->held_from = s_.clk.steady_now();
    st->timer = std::make_unique<steady_timer>(exec_);
    st->timer->expires_after(std::chrono::microseconds(wait_us));
    st->timer->async_wait([self = shared_from_this(), st](const boost::system::error_code& ec) {
      if (!ec && !st->closed && st->held) self->release(st);
    });
    return;
  }
  // Forwarded once the read that opened it is parsed (forward_opened).
  if (take_slot(st) && ask_master(st)) opened_.push_back(st);
}

bool h2_connection::ask_master(const std::shared_ptr<h2_stream>& st) {
  if (!st->adm.exact) return true;
  st->held_from = s_.clk.steady_now();
  if (send_ask(st)) return false;
  // No room for the question: it goes without (now, in the caller's order).
  admission_env env = admission_env_of(s_, w_);
  exact_went(env, *st->rt, *st->r, st->adm, s_.clk.wall_us(), -1);
  return true;
}

bool h2_connection::send_ask(const std::shared_ptr<h2_stream>& st) {
  const admission& a = st->adm;
  if (!st->ask) {
    st->ask = std::make_unique<ask_wait>();
    st->ask->table = &w_.asks;
    // The answer ends the wait now; the timer's handler goes on.
    st->ask->w.wake = [s = st.get()] {
      if (s->timer) s->timer->cancel();
    };
  }
  const std::int64_t latest_ms = (st->admitted_us + a.max_delay_us) / 1000;
  if (!w_.asks.ask(st->r->domain, a.who->value, a.exact_units, a.tier, latest_ms, st->ask->w, s_.clk.wall_us())) {
    return false;
  }
  st->asking = true;
  if (!st->timer) st->timer = std::make_unique<steady_timer>(exec_);
  st->timer->expires_after(st->rt->cfg.control_fresh);
  st->timer->async_wait([self = shared_from_this(), st](const boost::system::error_code&) {
    if (st->closed || !st->asking) return;
    self->ask_ended(st);
  });
  return true;
}

void h2_connection::ask_ended(const std::shared_ptr<h2_stream>& st) {
  st->asking = false;
  ask_table::waiter& w = st->ask->w;
  if (!w.answered) {
    st->ask->leave();  // it goes, charged by its own accounting; a GO that comes is settled with no units
    s_.metrics.exact_unanswered.inc();
    exact_go(st, -1);
    return;
  }
  if (w.verdict == wire::verdict_kind::go) {
    const std::int64_t wait_us = w.at_ms * 1000 - s_.clk.wall_us();
    if (wait_us <= 0) {
      exact_go(st, w.answered_seq);
      return;
    }
    // A GO for later: held until then (its units are its own from then on).
    st->go_held = true;
    st->go_ask = w.answered_seq;
    st->timer->expires_after(std::chrono::microseconds(wait_us));
    st->timer->async_wait([self = shared_from_this(), st](const boost::system::error_code& ec) {
      if (ec || st->closed || !st->go_held) return;
      st->go_held = false;
      self->exact_go(st, st->go_ask);
    });
    return;
  }
  const route& r = *st->r;
  const std::int64_t now_us = s_.clk.wall_us();
  const bool never = w.verdict == wire::verdict_kind::never;
  const std::int64_t at_us = w.at_ms * 1000;
  if (never || at_us > st->admitted_us + st->adm.max_delay_us) {
    if (st->entry)
      st->entry->held_ms += std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st->held_from).count();
    admission_env env = admission_env_of(s_, w_);
    exact_refused(env, *st->rt, r, st->adm, never, now_us);
    if (st->entry) note_admission(*st->entry, r, st->adm);  // refused, not what the gate planned
    st->slot.reset();
    const refusal no =
        refusal_for_exact(env.g, *st->rt, r, st->adm, never ? -1 : at_us - now_us, now_us, st->response_fields);
    answer(*st, no.status, no.text, no.retry_after_s, r.grpc_status,
           no.retry_after_s > 0 ? no.retry_after_s * 1000 : -1);
    return;
  }
  // Held until the time the answer named, then asked again.
  st->ask_held = true;
  st->timer->expires_after(std::chrono::microseconds(std::max<std::int64_t>(at_us - now_us, 0)));
  st->timer->async_wait([self = shared_from_this(), st](const boost::system::error_code& ec) {
    if (ec || st->closed || !st->ask_held) return;
    st->ask_held = false;
    if (!self->send_ask(st)) self->exact_go(st, -1);
  });
}

void h2_connection::exact_go(const std::shared_ptr<h2_stream>& st, std::int64_t ask) {
  if (st->entry)
    st->entry->held_ms += std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st->held_from).count();
  admission_env env = admission_env_of(s_, w_);
  exact_went(env, *st->rt, *st->r, st->adm, s_.clk.wall_us(), ask);
  forward(st);
}

bool h2_connection::take_slot(const std::shared_ptr<h2_stream>& st) {
  const route& r = *st->r;
  const admission& a = st->adm;
  const std::int64_t now_us = s_.clk.wall_us();
  if (!s_.concurrency.any() || concurrency_limit(s_.concurrency, r, a, now_us) <= 0) return true;
  st->slot_queue = std::make_unique<slot_wait>();
  st->slot_queue->table = &w_.slots;
  slot_table::waiter& w = st->slot_queue->w;
  // The slot is the stream's at once; the timer's handler forwards it.
  w.wake = [this, s = st.get()] {
    s->slot = held_slot(w_.slots, s->slot_queue->w.granted);
    if (s->timer) s->timer->cancel();
  };
  if (auto* e = w_.slots.acquire(r.domain, a.who->value, w_.accounting.delivers(r.domain), w, now_us, a.tier)) {
    st->slot = held_slot(w_.slots, e);
    return true;
  }
  s_.metrics.concurrency_waits.inc();
  st->slot_waiting = true;
  st->held_from = s_.clk.steady_now();
  if (!st->timer) st->timer = std::make_unique<steady_timer>(exec_);
  const std::int64_t left_us = st->admitted_us + st->rt->route_limits[r.index].max_delay_us - now_us;
  st->timer->expires_after(std::chrono::microseconds(std::max<std::int64_t>(left_us, 0)));
  st->timer->async_wait([self = shared_from_this(), st](const boost::system::error_code&) {
    if (st->closed || !st->slot_waiting) return;
    self->slot_wait_ended(st);
  });
  return false;
}

void h2_connection::slot_wait_ended(const std::shared_ptr<h2_stream>& st) {
  st->slot_waiting = false;
  if (st->entry)
    st->entry->held_ms += std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st->held_from).count();
  if (st->slot) {
    if (ask_master(st)) forward(st);
    return;
  }
  w_.slots.cancel(st->slot_queue->w, s_.clk.wall_us());
  s_.metrics.reject_concurrency.inc();
  const refusal no = refusal_for_concurrency(
      *st->r, concurrency_limit(s_.concurrency, *st->r, st->adm, s_.clk.wall_us()), st->response_fields);
  answer(*st, no.status, no.text, no.retry_after_s, st->r->grpc_status, no.retry_after_s * 1000);
}

void h2_connection::release(const std::shared_ptr<h2_stream>& st) {
  st->held = false;
  admission_env env = admission_env_of(s_, w_);
  end_hold(env, *st->rt, *st->r, st->adm, hold_end::released, s_.clk.wall_us());
  if (st->entry)
    st->entry->held_ms = std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st->held_from).count();
  if (take_slot(st) && ask_master(st)) forward(st);
}

void h2_connection::close_stream(h2_stream& st, std::uint32_t) {
  st.closed = true;
  if (st.adm.charge_when_done && (st.forwarding || st.outcome.cost_cut)) {
    // A cost known only now (a response field, the body's size) is charged
    // now, once; a body cut off past what fits is charged that, forwarded or not.
    admission_env env = admission_env_of(s_, w_);
    charge_done(env, *st.rt, *st.r, st.adm, cost_when_done(*st.r, st.outcome), s_.clk.wall_us());
    st.adm.charge_when_done = false;
  }
  if (st.held) {
    st.held = false;
    admission_env env = admission_env_of(s_, w_);
    end_hold(env, *st.rt, *st.r, st.adm, hold_end::client_left, s_.clk.wall_us());
    if (st.entry)
      st.entry->held_ms = std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st.held_from).count();
  }
  if (st.adm.charge_when_done && st.r != nullptr) {
    // Admitted and never forwarded (its client left while it waited for a
    // concurrency slot, or none came): a reservation it holds is closed at its estimate.
    admission_env env = admission_env_of(s_, w_);
    close_reservation(env, *st.rt, *st.r, st.adm);
  }
  if (st.timer) st.timer->cancel();
  // Its question to the master is left (a GO that comes is settled with no units).
  if (st.adm.exact && st.r != nullptr && (st.asking || st.ask_held || st.go_held)) {
    // A GO it was held for, or one that came before its timer's handler ran, is settled with no units.
    const bool answered_go = st.asking && st.ask && st.ask->w.answered && st.ask->w.verdict == wire::verdict_kind::go;
    const std::int64_t go = st.go_held ? st.go_ask : answered_go ? st.ask->w.answered_seq : -1;
    admission_env env = admission_env_of(s_, w_);
    exact_abandoned(env, *st.rt, *st.r, st.adm, s_.clk.wall_us(), go);
  }
  st.asking = st.ask_held = st.go_held = false;
  if (st.ask) st.ask->leave();
  // Its concurrency slot is free (or its place in the queue given up).
  st.slot_waiting = false;
  if (st.slot_queue && st.slot_queue->w.on != nullptr) w_.slots.cancel(st.slot_queue->w, s_.clk.wall_us());
  st.slot.reset();
  cancel_upstream(st);
  drop_body(st);
  if (st.entry) {
    note_outcome(*st.entry, *st.rt, st.r, st.outcome);
    st.entry->duration_ms = std::chrono::duration<double, std::milli>(s_.clk.steady_now() - st.started).count();
    if (auto* log = s_.access.get()) log->write(*st.entry);
    st.entry.reset();
  }
}

void h2_connection::submit(h2_stream& st, const std::vector<h2::field>& fields, bool with_body) {
  st.last_progress = s_.clk.coarse_steady_now();  // body_timeout for its body from now (sweep_loop)
  const auto nv = to_nv(fields);
  nghttp2_data_provider prd{};
  prd.source.ptr = &st;
  prd.read_callback = read_body;
  nghttp2_submit_response(session_, st.id, nv.data(), nv.size(), with_body ? &prd : nullptr);
  flush();
}

void h2_connection::answer(h2_stream& st, unsigned status, std::string_view text, std::int64_t retry_after_s,
                           unsigned grpc_status, std::int64_t pushback_ms) {
  // What the client gets: a gRPC call's answer is HTTP 200 with the status in its trailers.
  finished(st, st.grpc ? 200 : status);
  drop_body(st);
  std::vector<h2::field> fields;
  if (st.grpc) {
    // gRPC clients read a status from trailers, not an HTTP error: a trailers-only response.
    std::string_view message = text;
    while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
    h2::grpc::refusal_fields(grpc_status != 0 ? grpc_status : h2::grpc::status_for_http(status), message, pushback_ms,
                             st.response_fields, st.res().fields_arena, fields);
    submit(st, fields, false);
    return;
  }
  h2::simple_response_fields(status, retry_after_s, st.response_fields, st.res().fields_arena, fields);
  st.res().out.assign(text);
  st.res().out_end = true;
  submit(st, fields, !st.req.head);
}

void h2_connection::push_out(h2_stream& st, std::string_view data) {
  if (st.pending_out() == 0 && !data.empty()) st.last_progress = s_.clk.coarse_steady_now();
  st.res().out.append(data);
  if (st.res().deferred) {
    st.res().deferred = false;
    nghttp2_session_resume_data(session_, st.id);
  }
  flush();
}

http1::forward_info h2_connection::hop(const runtime& rt) const {
  return next_hop(rt, peer_, peer_text_, c_.client.tls() != nullptr);
}

void h2_connection::forward_opened() {
  // The rest of the read that opened these streams has been parsed: a reset
  // in it (the client's, or one its frames caused) and a flood that ends the
  // connection keep them from the upstream and from taking an upstream
  // connection.
  for (const auto& st : opened_) forward(st);
  opened_.clear();
}

void h2_connection::forward(const std::shared_ptr<h2_stream>& st) {
  if (st->too_large || st->closed || st->resetting || ending_) return;
  st->forwarding = true;
  const runtime& rt = *st->rt;
  const upstream_request req{*st, *this, st->req, hop(rt), st->rt, *st->r};
  if (rt.cfg.upstreams[st->r->upstream_index].http2()) w_.h2_pool.start(req);
  else start_h1_upstream(h1_exchange_env{w_.pool, s_.metrics, s_.clk}, exec_, req);
}

// ---------------------------------------------------------------------------- upstream events (either protocol)

void h2_connection::on_response(h2_stream& st, const std::vector<h2::field>& fields, bool end_stream) {
  if (st.closed) return;
  unsigned status = 0;
  for (const auto& f : fields) {
    if (f.name == ":status") status = static_cast<unsigned>(std::atoi(std::string(f.value).c_str()));
  }
  finished(st, status);
  if (st.r && st.r->cost.after_response()) note_cost_fields(*st.r, fields, st.outcome);
  // The proxy's own lines go after the upstream's fields.
  std::vector<h2::field> all = fields;
  h2::line_fields(st.response_fields, st.res().fields_arena, all);
  st.res().out_end = end_stream;
  submit(st, all, !end_stream);
}

void h2_connection::on_data(h2_stream& st, std::string_view data) {
  if (!st.closed) push_out(st, data);
}

void h2_connection::on_trailers(h2_stream& st, const std::vector<h2::field>& fields) {
  if (st.closed) return;
  if (st.r && st.r->cost.after_response() && !st.outcome.cost_field) note_cost_fields(*st.r, fields, st.outcome);
  h2::copy_fields(fields, st.res().trailers_arena, st.res().trailers);
}

void h2_connection::on_end(h2_stream& st) {
  st.up = nullptr;
  if (st.closed) return;
  drop_body(st);
  st.res().out_end = true;
  push_out(st, {});
}

void h2_connection::on_failed(h2_stream& st, unsigned status, std::string_view why, bool response_started) {
  st.up = nullptr;
  if (st.closed) return;
  drop_body(st);
  if (response_started) {
    reset(st, NGHTTP2_INTERNAL_ERROR);
    return;
  }
  answer(st, status, why);
}

std::size_t h2_connection::take_body(h2_stream& st, std::uint8_t* buf, std::size_t n, bool& eof) {
  const std::size_t taken = st.take_body(buf, n, eof);
  if (taken > 0) {
    // The client may send as much again on this stream (the connection's part went at arrival).
    nghttp2_session_consume_stream(session_, st.id, taken);
    flush();
  }
  return taken;
}

}  // namespace smockron::proxy
