// The wire codec on arbitrary frames: decoding never crashes, and whatever
// decodes re-encodes to frames that decode to the same message; a BATCH's
// records unpack and re-pack to the same bytes.
#include <cstdint>

#include "fuzz_frames.hpp"
#include "shared/protocol/wire.hpp"
#include "shared/protocol/wire_batch.hpp"
#include "shared/protocol/wire_lease.hpp"
#include "shared/protocol/wire_limit.hpp"
#include "shared/protocol/wire_tier.hpp"

using namespace smockron;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto f = fuzz::frames(data, size);
  wire::scratch s;
  if (auto a = wire::decode_accounting(f)) {
    const auto enc = wire::encode(a.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_accounting(enc->view());
    FUZZ_CHECK(back);
    FUZZ_CHECK(back->domain == a->domain && back->state == a->state && back->identifier == a->identifier);
    FUZZ_CHECK(back->received_ms == a->received_ms && back->loginfo == a->loginfo && back->cost == a->cost);
    FUZZ_CHECK(a->cost >= 0 && a->cost <= wire::max_cost);
    FUZZ_CHECK(back->adjust == a->adjust && back->reserve == a->reserve && back->tier == a->tier);
    FUZZ_CHECK(a->tier.empty() || (wire::valid_tier_name(a->tier) && a->state != wire::status::rejected));
    FUZZ_CHECK(!a->adjust || (*a->adjust >= -wire::max_cost && *a->adjust <= wire::max_cost));
    FUZZ_CHECK(!a->adjust || a->state == wire::status::rejected);
    FUZZ_CHECK(!a->reserve || a->state != wire::status::rejected);
    FUZZ_CHECK(a->state != wire::status::delayed || back->delayed_ms == a->delayed_ms);
    FUZZ_CHECK(back->ask == a->ask && a->ask <= wire::max_cost && (a->ask < 0 || a->state != wire::status::rejected));
  }
  if (auto c = wire::decode_delay_until(f)) {
    const auto enc = wire::encode(c.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_delay_until(enc->view());
    FUZZ_CHECK(back);
    FUZZ_CHECK(back->domain == c->domain && back->identifier == c->identifier);
    FUZZ_CHECK(back->next_ms == c->next_ms && back->interval_ms == c->interval_ms);
  }
  if (auto p = wire::decode_policy(f)) {
    FUZZ_CHECK(p->count <= wire::max_policy_rules);
    const auto enc = wire::encode(p.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_policy(enc->view());
    FUZZ_CHECK(back && back->domain == p->domain && back->identifier == p->identifier && back->count == p->count);
    for (std::size_t i = 0; i < p->count; ++i) {
      const auto& r = p->rules[i];
      FUZZ_CHECK(r.burst >= 1 && r.burst <= wire::max_policy_burst && r.interval_us >= 1);
      FUZZ_CHECK(r.interval_us * r.burst <= wire::max_policy_span_us);  // what the gate relies on
      FUZZ_CHECK(back->rules[i].interval_us == r.interval_us && back->rules[i].burst == r.burst);
    }
  }
  if (auto q = wire::decode_quota(f)) {
    FUZZ_CHECK(q->count <= wire::max_quota_items);
    const auto enc = wire::encode(q.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_quota(enc->view());
    FUZZ_CHECK(back && back->domain == q->domain && back->identifier == q->identifier && back->count == q->count);
    for (std::size_t i = 0; i < q->count; ++i) {
      const auto& a = q->items[i];
      const auto& b = back->items[i];
      FUZZ_CHECK(a.limit >= 1 && a.limit <= wire::max_quota_limit);
      FUZZ_CHECK(a.per != calendar::period::fixed || (a.length_s >= 1 && a.length_s <= wire::max_quota_length_s));
      FUZZ_CHECK(a.limit == b.limit && a.per == b.per && a.offset_s == b.offset_s && a.length_s == b.length_s);
      // What the gate computes from it stays ordered.
      const auto w = a.window();
      const std::int64_t t = 1'700'000'000'000'000;
      FUZZ_CHECK(calendar::window_start_us(w, t) <= t && t < calendar::window_end_us(w, t));
    }
  }
  if (auto l = wire::decode_lease(f)) {
    FUZZ_CHECK(l->want >= 0 && l->want <= wire::max_concurrency && l->held >= 0 && l->held <= wire::max_concurrency);
    const auto enc = wire::encode(l.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_lease(enc->view());
    FUZZ_CHECK(back && back->domain == l->domain && back->identifier == l->identifier && back->holder == l->holder);
    FUZZ_CHECK(back->want == l->want && back->held == l->held && back->returned == l->returned);
    FUZZ_CHECK(back->tier == l->tier && (l->tier.empty() || wire::valid_tier_name(l->tier)));
  }
  if (auto g = wire::decode_grant(f)) {
    FUZZ_CHECK(g->cap >= 0 && g->cap <= g->held && g->held <= wire::max_concurrency);  // what a holder relies on
    const auto enc = wire::encode(g.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_grant(enc->view());
    FUZZ_CHECK(back && back->domain == g->domain && back->identifier == g->identifier && back->holder == g->holder);
    FUZZ_CHECK(back->held == g->held && back->cap == g->cap && back->seen == g->seen);
  }
  if (auto c = wire::decode_concurrency(f)) {
    const auto enc = wire::encode(c.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_concurrency(enc->view());
    FUZZ_CHECK(back && back->domain == c->domain && back->identifier == c->identifier && back->limit == c->limit);
  }
  if (auto t = wire::decode_tier(f)) {
    FUZZ_CHECK(wire::valid_tier_name(t->name) && t->count <= wire::max_policy_rules);
    const auto enc = wire::encode(t.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_tier(enc->view());
    FUZZ_CHECK(back && back->domain == t->domain && back->name == t->name && back->count == t->count);
    FUZZ_CHECK(back->concurrency == t->concurrency);
    for (std::size_t i = 0; i < t->count; ++i) {
      FUZZ_CHECK(back->rules[i].interval_us == t->rules[i].interval_us && back->rules[i].burst == t->rules[i].burst);
    }
  }
  if (auto l = wire::decode_limit(f)) {
    using kind = wire::limit_ref::kind;
    const auto& r = l->limit;
    FUZZ_CHECK(r.by != kind::none);
    FUZZ_CHECK(r.by != kind::rule || r.index < wire::max_policy_rules);
    FUZZ_CHECK(r.by != kind::quota || r.index < wire::max_quota_items);
    FUZZ_CHECK(r.by != kind::share || wire::policy_fits(r.share_interval_us, r.share_burst));
    const auto enc = wire::encode_limit(wire::delay_until{l->domain, l->identifier, l->next_ms, 0, r}, s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_limit(enc->view());
    FUZZ_CHECK(back && back->domain == l->domain && back->identifier == l->identifier && back->next_ms == l->next_ms);
    FUZZ_CHECK(back->limit.by == r.by && back->limit.index == r.index);
    FUZZ_CHECK(back->limit.share_interval_us == r.share_interval_us && back->limit.share_burst == r.share_burst);
  }
  if (auto a = wire::decode_ask(f)) {
    FUZZ_CHECK(a->seq >= 0 && a->seq <= wire::max_sequence && a->cost >= 0 && a->cost <= wire::max_cost);
    const auto enc = wire::encode(a.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_ask(enc->view());
    FUZZ_CHECK(back && back->domain == a->domain && back->identifier == a->identifier && back->holder == a->holder);
    FUZZ_CHECK(back->seq == a->seq && back->cost == a->cost && back->tier == a->tier);
    FUZZ_CHECK(back->latest_ms == a->latest_ms);
  }
  if (auto a = wire::decode_answer(f)) {
    // What a gatekeeper relies on: a wait names a time, never names none (a GO may name one).
    FUZZ_CHECK(a->verdict != wire::verdict_kind::wait || a->at_ms > 0);
    FUZZ_CHECK(a->verdict != wire::verdict_kind::never || a->at_ms == 0);
    const auto enc = wire::encode(a.value(), s);
    FUZZ_CHECK(enc);
    const auto back = wire::decode_answer(enc->view());
    FUZZ_CHECK(back && back->domain == a->domain && back->identifier == a->identifier && back->holder == a->holder);
    FUZZ_CHECK(back->seq == a->seq && back->verdict == a->verdict && back->at_ms == a->at_ms);
  }
  if (auto x = wire::decode_exact(f)) {
    const auto enc = wire::encode(x.value(), s);
    FUZZ_CHECK(enc);
    FUZZ_CHECK(wire::decode_exact(enc->view())->domain == x->domain);
  }
  // A BATCH's records (as the master unpacks them) re-pack to the same bytes.
  if (f.size() == 3) {
    const std::string_view batch[3] = {f[0], wire::batch_status, f[2]};
    std::string again;
    std::size_t records = 0;
    const bool ok = wire::for_each_batch_record(std::span<const std::string_view>(batch), [&](auto frames) {
      FUZZ_CHECK(frames.size() >= 2 && frames[0] == f[0]);
      FUZZ_CHECK(wire::append_batch_record(again, frames.subspan(1)));
      ++records;
    });
    FUZZ_CHECK(ok == (records > 0));
    FUZZ_CHECK(!ok || again == f[2]);
  }
  return 0;
}
