// Durations, sizes and rates as written in config files.
#include "shared/base/units.hpp"

#include <gtest/gtest.h>

using namespace smockron;
using namespace std::chrono;

namespace {
template <class T>
T ok(const parse_result<T>& r) {
  EXPECT_TRUE(std::holds_alternative<T>(r)) << (std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : "");
  return std::holds_alternative<T>(r) ? std::get<T>(r) : T{};
}
template <class T>
std::string err(const parse_result<T>& r) {
  EXPECT_TRUE(std::holds_alternative<std::string>(r));
  return std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : "";
}
}  // namespace

TEST(Units, Durations) {
  EXPECT_EQ(ok(parse_duration("250ms")), milliseconds(250));
  EXPECT_EQ(ok(parse_duration("5s")), seconds(5));
  EXPECT_EQ(ok(parse_duration("2min")), minutes(2));
  EXPECT_EQ(ok(parse_duration("1h")), hours(1));
  EXPECT_EQ(ok(parse_duration("1d")), hours(24));
  EXPECT_EQ(ok(parse_duration("100us")), microseconds(100));
  EXPECT_EQ(ok(parse_duration("0s")), microseconds(0));
  EXPECT_NE(err(parse_duration("5")).find("needs a unit"), std::string::npos);
  EXPECT_NE(err(parse_duration("5 s")).find("unknown duration unit"), std::string::npos);
  EXPECT_NE(err(parse_duration("s")).find("invalid duration"), std::string::npos);
  EXPECT_NE(err(parse_duration("-5s")).find("invalid duration"), std::string::npos);
  EXPECT_NE(err(parse_duration("99999999999999999999d")).find("invalid duration"), std::string::npos);
  EXPECT_NE(err(parse_duration("999999999999d")).find("too large"), std::string::npos);
}

TEST(Units, Sizes) {
  EXPECT_EQ(ok(parse_size("512")), 512u);
  EXPECT_EQ(ok(parse_size("16KiB")), 16u * 1024);
  EXPECT_EQ(ok(parse_size("1MiB")), 1024u * 1024);
  EXPECT_EQ(ok(parse_size("2GiB")), 2ull * 1024 * 1024 * 1024);
  EXPECT_EQ(ok(parse_size("1KB")), 1000u);
  EXPECT_NE(err(parse_size("1TiB")).find("unknown size unit"), std::string::npos);
  EXPECT_NE(err(parse_size("KiB")).find("invalid size"), std::string::npos);
  EXPECT_NE(err(parse_size("18446744073709551615GiB")).find("too large"), std::string::npos);
}

TEST(Units, Rates) {
  EXPECT_EQ(ok(parse_rate("10/s")), (rate{10, seconds(1)}));
  EXPECT_EQ(ok(parse_rate("600/min")), (rate{600, minutes(1)}));
  EXPECT_EQ(ok(parse_rate("1000/h")), (rate{1000, hours(1)}));
  EXPECT_EQ(ok(parse_rate("5/d")), (rate{5, hours(24)}));
  EXPECT_EQ(ok(parse_rate("30/10s")), (rate{30, seconds(10)}));
  EXPECT_EQ(ok(parse_rate("3/s")).interval_us(), 333'333);
  EXPECT_EQ(ok(parse_rate("30/10s")).interval_us(), 333'333);
  EXPECT_NE(err(parse_rate("0/s")).find("at least one"), std::string::npos);
  EXPECT_NE(err(parse_rate("10")).find("invalid rate"), std::string::npos);
  EXPECT_NE(err(parse_rate("10/")).find("invalid rate"), std::string::npos);
  EXPECT_NE(err(parse_rate("10/0s")).find("empty period"), std::string::npos);
  EXPECT_NE(err(parse_rate("ten/s")).find("invalid rate"), std::string::npos);
  EXPECT_NE(err(parse_rate("10/fortnight")).find("unknown duration unit"), std::string::npos);
}

TEST(Units, Formatting) {
  EXPECT_EQ(format_duration(milliseconds(250)), "250ms");
  EXPECT_EQ(format_duration(seconds(5)), "5s");
  EXPECT_EQ(format_duration(minutes(2)), "2min");
  EXPECT_EQ(format_rate(rate{10, seconds(1)}), "10/s");
  EXPECT_EQ(format_rate(rate{30, seconds(10)}), "30/10s");
  EXPECT_EQ(format_rate(rate{100, minutes(1)}), "100/min");
}
