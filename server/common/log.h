// flux2_server's log lines on stderr: one line per event with a UTC timestamp and a level, as text
// ("2026-12-02T16:40:01.123Z INFO flux2_server: ready ...") or, with --log-format json, one JSON
// object per line ({"time", "level", "message"}; finished requests as {"event": "request", ...}
// with their fields) for log collectors. Thread-safe: a line is written whole.
// Tested by tests/server/log_test.cc.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace flux2::server {

enum class LogLevel : uint8_t { kInfo, kWarning, kError };
enum class LogFormat : uint8_t { kText, kJson };

// Set once at start-up from --log-format, before other threads log; text by default.
void set_log_format(LogFormat format);
LogFormat log_format();

// One line: text "<time> <LEVEL> flux2_server: <message>", json {"time", "level", "message"}.
void log_line(LogLevel level, absl::string_view message);

// What the access log says of one finished generation request (one line per request).
struct RequestLogRecord {
  std::string method;      // "GenerateImage", "images.generations", ...
  std::string request_id;  // printable (loggable_request_id); empty: none
  std::string code;        // "OK", "INVALID_ARGUMENT", ...
  double seconds = 0.0;
  std::string peer;  // "ipv4:127.0.0.1:5555" (gRPC) or "127.0.0.1:5555" (HTTP); empty: unknown
  // The request as validated; absent (0 / empty) when it was refused before validation passed.
  int64_t width = 0, height = 0;
  int steps = 0;  // 0: the model default
  int num_images = 0;
  std::string quality;  // "lossless" / "high"
  std::string loras;    // the LoRA adapters applied, "name:scale,name:scale"; empty: none
  std::string error;    // the status message when code is not OK
};

// The access-log line: text "... INFO flux2_server: <method> request_id=... code=... seconds=...
// size=WxH steps=N images=N quality=... [loras=...] peer=... error=...", json {"event": "request",
// ...}. Errors of the server's own making (INTERNAL, UNKNOWN, DATA_LOSS) are logged at ERROR, the
// client's at INFO.
void log_request(const RequestLogRecord& record);

// The current time as RFC 3339 UTC with milliseconds ("2026-12-02T16:40:01.123Z").
std::string log_timestamp();

}  // namespace flux2::server
