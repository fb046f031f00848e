// JSON bodies (server/http/json_body.h): depth refused as met (a 48 MiB '[[[[...' in bounded
// memory and time), duplicate keys, numbers overflowing a double, invalid UTF-8 and lone
// surrogates, the BOM, and the param each error names (message prefix and payload).
//   build-http/bin/http_transport_tests --gtest_filter='JsonBody*'
#include "server/http/json_body.h"

#include <sys/resource.h>

#include <chrono>

#include "gtest/gtest.h"

namespace flux2::server::http {
namespace {

// The error's message, after checking it is InvalidArgument whose payload param is `param`.
std::string error_of(std::string_view body, std::string_view param, int max_depth = 32) {
  const absl::StatusOr<nlohmann::json> parsed = parse_json_body(body, max_depth);
  EXPECT_FALSE(parsed.ok()) << body.substr(0, 80);
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(json_error_param(parsed.status()), param) << parsed.status();
  return std::string(parsed.status().message());
}

long peak_rss_kb() {  // NOLINT(runtime/int): getrusage's type
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

TEST(JsonBody, ParsesOrdinaryBodies) {
  const absl::StatusOr<nlohmann::json> parsed =
      parse_json_body(R"({"prompt": "a fox \u00e9 \ud83e\udd8a", "n": 2, "x": [1, {"y": null}]})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)["n"], 2);
  EXPECT_EQ((*parsed)["prompt"], "a fox \xc3\xa9 \xf0\x9f\xa6\x8a");
  EXPECT_TRUE(parse_json_body("[1e308, -1e308, 18446744073709551616, 1e-400]").ok());
  EXPECT_TRUE(parse_json_body(std::string(32, '[') + std::string(32, ']')).ok());
}

TEST(JsonBody, NestingDeeperThanTheLimitIsRefusedAsMet) {
  EXPECT_EQ(error_of(std::string(33, '[') + std::string(33, ']'), "body"),
            "body: nesting deeper than 32");
  EXPECT_EQ(error_of(R"({"user": {"a": {"b": 1}}})", "body", 2), "body: nesting deeper than 2");
  // 48 MiB of '[': refused at depth 33, so neither the DOM nor the parser's stack grows with it.
  const std::string deep(size_t{48} << 20, '[');
  const long rss_before = peak_rss_kb();  // NOLINT(runtime/int)
  const auto begin = std::chrono::steady_clock::now();
  EXPECT_EQ(error_of(deep, "body"), "body: nesting deeper than 32");
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(1));
  EXPECT_LT(peak_rss_kb() - rss_before, 16 << 10) << "KiB of peak memory growth";
}

TEST(JsonBody, DuplicateKeysNameTheKey) {
  EXPECT_EQ(error_of(R"({"size": "99999x99999", "size": "64x64"})", "size"),
            "size: duplicate key 'size'");
  EXPECT_EQ(error_of(R"({"prompt": "x", "user": {"a": 1, "b": [{"a": 1}], "a": 2}})", "user"),
            "user: duplicate key 'user.a'");
  EXPECT_TRUE(parse_json_body(R"({"a": {"a": 1}, "b": {"a": 1}})").ok());  // other objects
}

TEST(JsonBody, NumbersOverflowingADoubleNameTheMember) {
  EXPECT_EQ(error_of(R"({"prompt": "x", "n": 1e400})", "n"), "n: 1e400 is out of range");
  EXPECT_EQ(error_of(R"({"seed": -)" + std::string(400, '9') + "}", "seed"),
            "seed: -" + std::string(400, '9') + " is out of range");
  EXPECT_EQ(error_of(R"({"user": [1, 2e999]})", "user"), "user: 2e999 is out of range");
  EXPECT_EQ(error_of("[1e400]", "body"), "body: 1e400 is out of range");
}

TEST(JsonBody, InvalidUtf8NamesTheMember) {
  EXPECT_EQ(error_of("{\"prompt\": \"a\xff\"}", "prompt"), "prompt: is not valid UTF-8");
  EXPECT_EQ(error_of("{\"prompt\": \"\xc0\xaf\"}", "prompt"), "prompt: is not valid UTF-8");
  EXPECT_EQ(error_of(R"({"prompt": "\ud800 alone"})", "prompt"), "prompt: is not valid UTF-8");
  EXPECT_EQ(error_of("{\"n\": 1, \"k\xff\": 2}", "body"),
            "body: a key or string is not valid UTF-8");
}

TEST(JsonBody, SyntaxErrorsAndTheBom) {
  EXPECT_NE(error_of(R"({"prompt": "x",})", "body").find("body: invalid JSON at byte"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"a": 1} {"b": 2})", "body").find("invalid JSON"), std::string::npos);
  EXPECT_NE(error_of("", "body").find("invalid JSON"), std::string::npos);
  EXPECT_EQ(error_of("\xEF\xBB\xBF{}", "body"),
            "body: starts with a UTF-8 byte order mark; send JSON without one");
  EXPECT_NE(error_of(R"({"a": NaN})", "body").find("invalid JSON"), std::string::npos);
}

}  // namespace
}  // namespace flux2::server::http
