// Log lines in text or JSON; see log.h. Tested by tests/server/log_test.cc.
#include "server/common/log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/json_util.h"
#include "nlohmann/json.hpp"

namespace flux2::server {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};
std::mutex g_write_mu;  // one whole line at a time

absl::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "INFO";
}

void write_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

// A logfmt value: as it is when it is a plain token, else double-quoted with `"` and `\` escaped,
// so a value a client chose (a request id, an error quoting its fields) cannot forge fields.
std::string logfmt_value(absl::string_view value) {
  const bool plain = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
           absl::string_view("._:/-+[]").find(c) != absl::string_view::npos;
  });
  if (plain) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

void set_log_format(LogFormat format) {
  g_format.store(format);
}

LogFormat log_format() {
  return g_format.load();
}

std::string log_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                         utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, millis);
}

void log_line(LogLevel level, absl::string_view message) {
  if (log_format() == LogFormat::kJson) {
    write_line(dump_json({{"time", log_timestamp()},
                          {"level", absl::AsciiStrToLower(level_name(level))},
                          {"message", std::string(message)}}));
    return;
  }
  write_line(absl::StrCat(log_timestamp(), " ", level_name(level), " flux2_server: ", message));
}

void log_request(const RequestLogRecord& r) {
  const bool server_fault = r.code == "INTERNAL" || r.code == "UNKNOWN" || r.code == "DATA_LOSS";
  const LogLevel level = server_fault ? LogLevel::kError : LogLevel::kInfo;
  if (log_format() == LogFormat::kJson) {
    nlohmann::json line = {
        {"time", log_timestamp()},    {"level", absl::AsciiStrToLower(level_name(level))},
        {"event", "request"},         {"method", r.method},
        {"request_id", r.request_id}, {"code", r.code},
        {"seconds", r.seconds},       {"peer", r.peer}};
    if (r.width > 0) {
      line["width"] = r.width;
      line["height"] = r.height;
      line["steps"] = r.steps;
      line["num_images"] = r.num_images;
      line["quality"] = r.quality;
    }
    if (!r.loras.empty()) line["loras"] = r.loras;
    if (!r.error.empty()) line["error"] = r.error;
    write_line(dump_json(line));
    return;
  }
  std::string text =
      absl::StrFormat("%s request_id=%s code=%s seconds=%.3f", r.method,
                      r.request_id.empty() ? "-" : logfmt_value(r.request_id), r.code, r.seconds);
  if (r.width > 0) {
    absl::StrAppend(&text, " size=", r.width, "x", r.height, " steps=", r.steps,
                    " images=", r.num_images, " quality=", r.quality);
  }
  if (!r.loras.empty()) absl::StrAppend(&text, " loras=", logfmt_value(r.loras));
  if (!r.peer.empty()) absl::StrAppend(&text, " peer=", logfmt_value(r.peer));
  if (!r.error.empty()) absl::StrAppend(&text, " error=", logfmt_value(r.error));
  log_line(level, text);
}

}  // namespace flux2::server
