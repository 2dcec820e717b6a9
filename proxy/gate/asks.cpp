// Exact admission on the gatekeeper's side (see asks.hpp).
#include "proxy/gate/asks.hpp"

namespace smockron::proxy {

void exact_domains::set(std::string_view domain, std::int64_t now_us) {
  std::lock_guard lock(mutex_);
  auto it = updated_us_.find(domain);
  if (it == updated_us_.end()) it = updated_us_.emplace(std::string(domain), 0).first;
  it->second = now_us;
  any_.store(true, std::memory_order_relaxed);
}

bool exact_domains::exact(std::string_view domain, std::int64_t now_us) const {
  std::lock_guard lock(mutex_);
  const auto it = updated_us_.find(domain);
  return it != updated_us_.end() && now_us - it->second <= wire::policy_fresh_ms * 1000;
}

bool ask_table::ask(std::string_view domain, std::string_view identifier, std::int64_t cost, std::string_view tier,
                    std::int64_t latest_ms, waiter& w, std::int64_t now_us) {
  // (A worker's sequence numbers never come near max_cost, the bound of the
  // "ask=SEQ" that settles one; past it, requests would go without asking.)
  if (open_.size() >= k_max_open || !send_ || next_seq_ > wire::max_cost) return false;
  const std::int64_t seq = next_seq_++;
  open_.emplace(seq, question{&w, std::string(domain), std::string(identifier), now_us});
  w.seq = seq;
  w.answered = false;
  send_(wire::ask{domain, identifier, holder_, seq, cost, latest_ms, tier});
  return true;
}

void ask_table::leave(waiter& w) {
  const auto it = open_.find(w.seq);
  w.seq = -1;
  if (it != open_.end()) it->second.w = nullptr;
}

void ask_table::on_answer(const wire::answer& a) {
  const auto it = open_.find(a.seq);
  if (it == open_.end()) return;  // forgotten, or not ours
  question q = std::move(it->second);
  open_.erase(it);
  if (q.w == nullptr) {
    // Its request stopped waiting (gone, or gone on without the answer and
    // charged by its own accounting): the GO is settled with no units.
    if (a.verdict == wire::verdict_kind::go && settle_) settle_(q.domain, q.identifier, a.seq);
    return;
  }
  waiter& w = *q.w;
  w.seq = -1;
  w.answered = true;
  w.answered_seq = a.seq;
  w.verdict = a.verdict;
  w.at_ms = a.at_ms;
  if (w.wake) w.wake();
}

void ask_table::tick(std::int64_t now_us) {
  for (auto it = open_.begin(); it != open_.end();) {
    if (it->second.w == nullptr && now_us - it->second.asked_us >= k_forget_us) it = open_.erase(it);
    else ++it;
  }
}

}  // namespace smockron::proxy
