// Exact admission at the gatekeeper (proxy/gate/asks.hpp): questions, their
// answers, and what a question left behind settles.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proxy/gate/asks.hpp"

using namespace smockron;
using namespace smockron::proxy;

namespace {

struct AskTable : ::testing::Test {
  std::vector<wire::ask> sent;
  std::vector<std::string> settled;  ///< "domain/identifier" of each use of no units
  ask_table table{0xab00,
                  [this](const wire::ask& m) {
                    EXPECT_EQ(m.holder, 0xab00u);
                    sent.push_back(m);
                  },
                  [this](std::string_view d, std::string_view id, std::int64_t seq) {
                    settled.push_back(std::string(d) + "/" + std::string(id) + "#" + std::to_string(seq));
                  }};

  wire::answer answer(std::int64_t seq, wire::verdict_kind v, std::int64_t at_ms = 0) {
    return wire::answer{"api", "k", 0xab00, seq, v, at_ms};
  }
};

}  // namespace

TEST_F(AskTable, AnAnswerWakesItsQuestion) {
  ask_wait a, b;
  a.table = b.table = &table;
  int woken = 0;
  a.w.wake = b.w.wake = [&] { ++woken; };
  ASSERT_TRUE(table.ask("api", "k", 40, "pro", 9000, a.w, 0));
  ASSERT_TRUE(table.ask("api", "k", 2, "", 9000, b.w, 0));
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].cost, 40);
  EXPECT_EQ(sent[0].tier, "pro");
  EXPECT_EQ(sent[0].latest_ms, 9000);
  EXPECT_NE(sent[0].seq, sent[1].seq);
  table.on_answer(answer(sent[1].seq, wire::verdict_kind::wait, 123));
  EXPECT_EQ(woken, 1);
  EXPECT_TRUE(b.w.answered);
  EXPECT_EQ(b.w.verdict, wire::verdict_kind::wait);
  EXPECT_EQ(b.w.at_ms, 123);
  EXPECT_FALSE(a.w.answered);
  table.on_answer(answer(sent[1].seq, wire::verdict_kind::go));  // a second answer (another master's): ignored
  EXPECT_EQ(woken, 1);
  table.on_answer(answer(sent[0].seq, wire::verdict_kind::go));
  EXPECT_EQ(woken, 2);
  EXPECT_EQ(a.w.verdict, wire::verdict_kind::go);
  EXPECT_EQ(a.w.answered_seq, sent[0].seq) << "what its accounting settles (ask=SEQ)";
  EXPECT_EQ(table.open(), 0u);
  EXPECT_TRUE(settled.empty());
}

// A request that stopped waiting (its client left, or it went on without an
// answer and its own accounting charged it): a GO that comes is settled with no units.
TEST_F(AskTable, AGoForARequestThatStoppedWaitingIsSettled) {
  {
    ask_wait gone;  // its client leaves: destroyed while it waits
    gone.table = &table;
    ASSERT_TRUE(table.ask("api", "left", 5, "", 9000, gone.w, 0));
  }
  ask_wait went;
  went.table = &table;
  ASSERT_TRUE(table.ask("api", "late", 5, "", 9000, went.w, 0));
  went.leave();  // no answer in time: it went without one
  ASSERT_EQ(table.open(), 2u);
  table.on_answer(wire::answer{"api", "left", 0xab00, sent[0].seq, wire::verdict_kind::go, 0});
  table.on_answer(wire::answer{"api", "late", 0xab00, sent[1].seq, wire::verdict_kind::go, 0});
  EXPECT_EQ(settled, (std::vector<std::string>{"api/left#0", "api/late#1"}));
  // A WAIT for one that left settles nothing (nothing was held open).
  {
    ask_wait gone;
    gone.table = &table;
    ASSERT_TRUE(table.ask("api", "left", 5, "", 9000, gone.w, 0));
  }
  table.on_answer(wire::answer{"api", "left", 0xab00, sent[2].seq, wire::verdict_kind::wait, 9});
  EXPECT_EQ(settled.size(), 2u);
  EXPECT_EQ(table.open(), 0u);
}

TEST_F(AskTable, QuestionsLeftBehindAreForgotten) {
  {
    ask_wait gone;
    gone.table = &table;
    ASSERT_TRUE(table.ask("api", "k", 1, "", 9000, gone.w, 1'000));
  }
  table.tick(1'000 + ask_table::k_forget_us - 1);
  EXPECT_EQ(table.open(), 1u);
  table.tick(1'000 + ask_table::k_forget_us);
  EXPECT_EQ(table.open(), 0u);
  // Silenced (the worker stops): nothing more is asked.
  table.silence();
  ask_wait w;
  w.table = &table;
  EXPECT_FALSE(table.ask("api", "k", 1, "", 9000, w.w, 0));
}

TEST(ExactDomains, FreshOnlyWhileTheMasterRepeatsIt) {
  exact_domains x;
  EXPECT_FALSE(x.any());
  EXPECT_FALSE(x.exact("api", 0));
  x.set("api", 1'000'000);
  EXPECT_TRUE(x.any());
  EXPECT_TRUE(x.exact("api", 1'000'000 + wire::policy_fresh_ms * 1000));
  EXPECT_FALSE(x.exact("api", 1'000'001 + wire::policy_fresh_ms * 1000)) << "a silent master: decided alone again";
  EXPECT_FALSE(x.exact("web", 1'000'000));
}
