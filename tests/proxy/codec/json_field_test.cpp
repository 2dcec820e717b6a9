// One member's number from the start of a JSON body: a table, then a
// differential test against nlohmann-json on generated bodies (whole, and
// cut at every length).
#include "proxy/codec/json_field.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

using namespace smockron::proxy;
using kind = json_field_result::kind;

namespace {
std::string shown(const json_field_result& r) {
  switch (r.k) {
    case kind::number: return "number " + std::string(r.digits);
    case kind::not_found: return "not found";
    case kind::malformed: return "malformed";
  }
  return "?";
}
}  // namespace

TEST(JsonField, Table) {
  const struct {
    const char* body;
    const char* expect;
  } rows[] = {
      {R"({"max_tokens": 512})", "number 512"},
      {R"(  {"model":"m","max_tokens":0,"stream":true})", "number 0"},
      {R"({"messages":[{"role":"user","max_tokens":9}],"max_tokens":64})", "number 64"},  // nested ones are not it
      {R"({"a":{"b":[1,2,{"c":"}"}]},"max_tokens":7})", "number 7"},                      // a brace in a string
      {R"({"p":"a \"quoted\" max_tokens","max_tokens":8})", "number 8"},
      {R"({"max_tokens":8,"max_tokens":9})", "number 8"},  // the first, as the bytes come
      {R"({"max\u005ftokens":5})", "not found"},           // a name with escapes never matches
      {R"({"model":"m"})", "not found"},
      {R"({})", "not found"},
      {"", "not found"},
      {R"({"max_tokens":12)", "not found"},  // cut short: the number may go on
      {R"({"prompt":"a very long prompt cut sho)", "not found"},
      {R"({"max_tokens":5.0})", "malformed"},
      {R"({"max_tokens":1e3})", "malformed"},
      {R"({"max_tokens":-1})", "malformed"},
      {R"({"max_tokens":"512"})", "malformed"},
      {R"({"max_tokens":null})", "malformed"},
      {R"({"max_tokens":0512})", "malformed"},
      {R"({"max_tokens":12345678901234567890})", "malformed"},
      {R"([{"max_tokens":1}])", "malformed"},
      {R"(max_tokens=5)", "malformed"},
      {R"({max_tokens:5})", "malformed"},
      {R"({"a" 1,"max_tokens":5})", "malformed"},
  };
  for (const auto& row : rows) EXPECT_EQ(shown(json_field(row.body, "max_tokens")), row.expect) << row.body;
}

TEST(JsonField, AgreesWithAJsonLibraryWholeAndCutShort) {
  std::mt19937 rng(7);
  const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::function<nlohmann::json(int)> value = [&](int depth) -> nlohmann::json {
    switch (depth > 2 ? pick(4) : pick(6)) {
      case 0: return pick(1000);
      case 1: return std::string(static_cast<std::size_t>(pick(6)), "a\"}{,:\\ "[pick(8)]);
      case 2: return pick(2) == 0;
      case 3: return nullptr;
      case 4: {
        nlohmann::json a = nlohmann::json::array();
        for (int i = pick(3); i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (int i = pick(3); i > 0; --i) o[pick(2) ? "max_tokens" : "k" + std::to_string(pick(3))] = value(depth + 1);
        return o;
      }
    }
  };
  for (int n = 0; n < 2000; ++n) {
    nlohmann::json body = nlohmann::json::object();
    for (int i = pick(4); i > 0; --i) body["k" + std::to_string(i)] = value(1);
    if (pick(3) != 0) body["max_tokens"] = pick(4) == 0 ? value(1) : nlohmann::json(pick(100000));
    const std::string text = body.dump(pick(2) ? -1 : 1);
    const auto got = json_field(text, "max_tokens");
    // The library's view: its map holds one value per name (what dump wrote).
    if (!body.contains("max_tokens")) {
      EXPECT_EQ(got.k, kind::not_found) << text;
    } else if (body["max_tokens"].is_number_unsigned() || body["max_tokens"].is_number_integer()) {
      ASSERT_EQ(got.k, kind::number) << text;
      EXPECT_EQ(std::string(got.digits), body["max_tokens"].dump()) << text;
    } else {
      EXPECT_EQ(got.k, kind::malformed) << text;
    }
    // Cut short at every length: never a different number, never a crash.
    for (std::size_t cut = 0; cut < text.size(); ++cut) {
      const auto part = json_field(std::string_view(text).substr(0, cut), "max_tokens");
      if (part.k == kind::number) {
        EXPECT_EQ(part.digits, got.digits) << text.substr(0, cut);
      }
      if (part.k == kind::malformed) {
        EXPECT_EQ(got.k, kind::malformed) << text.substr(0, cut);
      }
    }
  }
}
