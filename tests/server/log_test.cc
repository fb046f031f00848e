// The log lines of server/common/log.h, captured from stderr: text lines start with an RFC 3339 UTC
// timestamp and the level, JSON lines parse and carry every request field; server faults log at
// ERROR, client errors at INFO.
// Run: build/bin/server_unit_tests --gtest_filter='Log*'
#include "server/common/log.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace flux2::server {
namespace {

// Runs `body` with stderr redirected to a file; returns what it wrote.
template <typename Body>
std::string capture_stderr(Body body) {
  const std::string path = ::testing::TempDir() + "/flux2_log_test.txt";
  std::fflush(stderr);
  const int saved = dup(fileno(stderr));
  FILE* file = std::fopen(path.c_str(), "w");
  dup2(fileno(file), fileno(stderr));
  body();
  std::fflush(stderr);
  dup2(saved, fileno(stderr));
  close(saved);
  std::fclose(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// True when `line` starts "YYYY-MM-DDTHH:MM:SS.mmmZ <LEVEL> flux2_server: ". (No std::regex:
// GCC 12's <regex> trips -Wmaybe-uninitialized under the sanitizer build's -Werror.)
bool is_text_log_line(const std::string& line) {
  const std::string shape = "dddd-dd-ddTdd:dd:dd.dddZ ";
  if (line.size() < shape.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const bool digit = line[i] >= '0' && line[i] <= '9';
    if (shape[i] == 'd' ? !digit : line[i] != shape[i]) return false;
  }
  const std::string rest = line.substr(shape.size());
  for (const char* level : {"INFO ", "WARNING ", "ERROR "}) {
    if (rest.rfind(std::string(level) + "flux2_server: ", 0) == 0) return true;
  }
  return false;
}

RequestLogRecord sample_record() {
  RequestLogRecord r;
  r.method = "images.generations";
  r.request_id = "req-1";
  r.code = "OK";
  r.seconds = 0.25;
  r.peer = "127.0.0.1:5555";
  r.width = 512;
  r.height = 256;
  r.steps = 4;
  r.num_images = 2;
  r.quality = "lossless";
  return r;
}

TEST(LogTest, TextLinesHaveTimeLevelAndFields) {
  set_log_format(LogFormat::kText);
  const std::string out = capture_stderr([] {
    log_line(LogLevel::kWarning, "drain timeout");
    log_request(sample_record());
  });
  std::istringstream lines(out);
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  EXPECT_TRUE(is_text_log_line(first)) << first;
  EXPECT_NE(first.find(" WARNING flux2_server: drain timeout"), std::string::npos) << first;
  EXPECT_TRUE(is_text_log_line(second)) << second;
  EXPECT_NE(second.find(" INFO flux2_server: images.generations request_id=req-1 code=OK "
                        "seconds=0.250 size=512x256 steps=4 images=2 quality=lossless "
                        "peer=127.0.0.1:5555"),
            std::string::npos)
      << second;
}

// A request id or an error message the client chose cannot add fields to a text line: values
// that are not plain tokens are double-quoted, with quotes and backslashes escaped.
TEST(LogTest, ClientChosenValuesCannotForgeTextFields) {
  RequestLogRecord forged = sample_record();
  forged.request_id = "x code=OK peer=1.2.3.4:1 \"q\"";
  forged.code = "INVALID_ARGUMENT";
  forged.error = "size: 'a code=OK' is not WIDTHxHEIGHT";
  const std::string out = capture_stderr([&] { log_request(forged); });
  EXPECT_NE(out.find("request_id=\"x code=OK peer=1.2.3.4:1 \\\"q\\\"\" code=INVALID_ARGUMENT "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(" error=\"size: 'a code=OK' is not WIDTHxHEIGHT\""), std::string::npos) << out;
}

TEST(LogTest, JsonLinesCarryEveryField) {
  set_log_format(LogFormat::kJson);
  RequestLogRecord failed = sample_record();
  failed.code = "INTERNAL";
  failed.error = "the engine failed";
  const std::string out = capture_stderr([&] {
    log_line(LogLevel::kInfo, "ready \"quoted\"");
    log_request(sample_record());
    log_request(failed);
  });
  set_log_format(LogFormat::kText);
  std::istringstream lines(out);
  std::vector<nlohmann::json> parsed;
  for (std::string line; std::getline(lines, line);) parsed.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(parsed.size(), 3u) << out;
  EXPECT_EQ(parsed[0]["level"], "info");
  EXPECT_EQ(parsed[0]["message"], "ready \"quoted\"");
  EXPECT_TRUE(parsed[0]["time"].get<std::string>().ends_with("Z"));
  const nlohmann::json& r = parsed[1];
  EXPECT_EQ(r["event"], "request");
  EXPECT_EQ(r["method"], "images.generations");
  EXPECT_EQ(r["request_id"], "req-1");
  EXPECT_EQ(r["code"], "OK");
  EXPECT_EQ(r["seconds"], 0.25);
  EXPECT_EQ(r["peer"], "127.0.0.1:5555");
  EXPECT_EQ(r["width"], 512);
  EXPECT_EQ(r["height"], 256);
  EXPECT_EQ(r["steps"], 4);
  EXPECT_EQ(r["num_images"], 2);
  EXPECT_EQ(r["quality"], "lossless");
  EXPECT_FALSE(r.contains("error"));
  EXPECT_EQ(parsed[2]["level"], "error");  // the server's own fault
  EXPECT_EQ(parsed[2]["error"], "the engine failed");
}

}  // namespace
}  // namespace flux2::server
