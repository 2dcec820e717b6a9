// Access log lines: every field in text and JSON, values a client chose
// (targets, identifiers) escaped so that a line stays one line and JSON parses.
#include "proxy/request/access_log.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace smockron::proxy {
namespace {

access_entry sample() {
  access_entry e;
  e.time_us = 1'795'000'000'123'456;  // 2026-11-18T11:06:40.123Z
  e.client = "192.0.2.7";
  e.peer = "10.0.0.5";
  e.method = "POST";
  e.target = "/api/orders?page=2";
  e.status = 429;
  e.bytes_in = 512;
  e.bytes_out = 31;
  e.duration_ms = 1.5;
  e.held_ms = 0;
  e.decision = "rejected";
  e.domain = "api";
  e.identifier = "sha256:00112233445566778899aabbccddeeff";
  return e;
}

TEST(AccessLog, TextLine) {
  EXPECT_EQ(format_text(sample()),
            "time=2026-11-18T11:06:40.123Z client=192.0.2.7 peer=10.0.0.5 method=POST target=/api/orders?page=2 "
            "protocol=HTTP/1.1 "
            "status=429 bytes_in=512 bytes_out=31 duration_ms=1.500 held_ms=0.000 decision=rejected domain=api "
            "identifier=sha256:00112233445566778899aabbccddeeff upstream=-");
}

TEST(AccessLog, TextValuesAreQuotedAndEscaped) {
  auto e = sample();
  e.target = "/a b\"c\\\n\x01\xff";
  e.shadow = "delayed";
  const auto line = format_text(e);
  EXPECT_NE(line.find("target=\"/a b\\\"c\\\\\\x0a\\x01\\xff\""), std::string::npos) << line;
  EXPECT_NE(line.find("shadow=delayed"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(AccessLog, JsonLineParsesWithEveryField) {
  auto e = sample();
  e.target = "/caf\xc3\xa9/\"q\"\n\x7f\xff\xed\xa0\x80";  // valid UTF-8, controls, invalid bytes, a surrogate
  e.upstream = "127.0.0.1:9000";
  const auto line = format_json(e);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["time"], "2026-11-18T11:06:40.123Z");
  EXPECT_EQ(j["client"], "192.0.2.7");
  EXPECT_EQ(j["peer"], "10.0.0.5");
  EXPECT_EQ(j["method"], "POST");
  EXPECT_EQ(j["target"], "/caf\xc3\xa9/\"q\"\n\x7f\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(j["protocol"], "HTTP/1.1");
  EXPECT_EQ(j["status"], 429);
  EXPECT_EQ(j["bytes_in"], 512);
  EXPECT_EQ(j["bytes_out"], 31);
  EXPECT_DOUBLE_EQ(j["duration_ms"].get<double>(), 1.5);
  EXPECT_EQ(j["decision"], "rejected");
  EXPECT_FALSE(j.contains("shadow"));
  EXPECT_EQ(j["domain"], "api");
  EXPECT_EQ(j["upstream"], "127.0.0.1:9000");
}

TEST(AccessLog, FileIsAppendedAndReopenedAfterRotation) {
  const auto dir = std::filesystem::temp_directory_path() / ("smockron-access-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "access.log").string();
  access_log log(path, access_log::format::json);
  log.write(sample());
  std::filesystem::rename(path, path + ".1");  // logrotate moves it
  log.write(sample());                         // still into the moved file
  std::string error;
  ASSERT_TRUE(log.reopen(error)) << error;
  log.write(sample());
  auto lines = [](const std::string& p) {
    std::ifstream in(p);
    int n = 0;
    for (std::string l; std::getline(in, l);) ++n;
    return n;
  };
  EXPECT_EQ(lines(path + ".1"), 2);
  EXPECT_EQ(lines(path), 1);
  EXPECT_FALSE(log.configure((dir / "missing" / "x.log").string(), access_log::format::text, error));
  EXPECT_NE(error.find("cannot open access log"), std::string::npos) << error;
  EXPECT_THROW(access_log((dir / "missing" / "x.log").string(), access_log::format::text), std::runtime_error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace smockron::proxy
