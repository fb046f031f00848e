// RawClient: a blocking HTTP/1.1 client over a loopback socket for the transport tests. It sends
// exactly the bytes a test gives (malformed ones included) and parses what comes back: status,
// fields, bodies delimited by Content-Length, chunked or the close, and 1xx interim responses.
// Used by tests/server/http_transport_test.cc (build-http/bin/http_transport_tests).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flux2::server::http::testing {

struct RawResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool chunked = false;          // the body came chunked
  bool close_delimited = false;  // the body ended with the connection

  // The first field named `name` (case-insensitive); "" when absent.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

class RawClient {
 public:
  // Connects to 127.0.0.1:port, from `source_ip` when given (another loopback address such as
  // 127.0.0.2 is another client IP for per-client limits).
  explicit RawClient(int port, const char* source_ip = nullptr);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  // False when the bytes could not all be sent (the server closed or reset).
  bool send(std::string_view bytes);
  // The next response, nullopt when the connection closed (or `timeout_s` passed) before a whole
  // one arrived. 1xx interim responses are skipped (and counted) unless `keep_interim`.
  std::optional<RawResponse> read_response(double timeout_s = 10, bool keep_interim = false);
  // True when the server closes the connection (EOF or reset) within `timeout_s`; the bytes that
  // arrived meanwhile are appended to *bytes when given.
  bool wait_closed(double timeout_s, std::string* bytes = nullptr);
  // True when nothing arrives and the connection stays open for `seconds`.
  bool stays_silent(double seconds);
  void shutdown_write();  // half-close: SHUT_WR
  void reset();           // close with SO_LINGER 0: the server sees RST
  void close();
  int interim_responses() const { return interim_; }
  int fd() const { return fd_; }

 private:
  // Reads more into buffer_; false on EOF, error or the deadline.
  bool fill(double deadline_s);
  // A whole head at the front of buffer_ (nullopt: not yet), consumed.
  std::optional<RawResponse> take_head();
  bool take_body(RawResponse* response, double deadline_s);

  int fd_ = -1;
  std::string buffer_;
  std::string received_;  // what fill() read since read_response last began a response
  bool eof_ = false;
  int interim_ = 0;
};

// A monotonic clock in seconds, for deadlines.
double now_s();

}  // namespace flux2::server::http::testing
