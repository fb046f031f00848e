// The OpenAI-compatible HTTP API beside gRPC, in the same process and through the same admission
// queue, limits, bearer token, TLS files, metrics and drain: POST /v1/images/generations (JSON),
// POST /v1/images/edits (multipart), GET /v1/models, GET /health (liveness), GET /ready
// (readiness), GET /openapi.json. Bodies and errors: server/http/openai_images.h. A generation
// blocks its HTTP worker thread until the job is done (or streams server-sent events from it),
// watching the connection (server/http/http_connection.h) and the X-Request-Timeout deadline
// meanwhile.
//
// Why cpp-httplib (Debian's libcpp-httplib-dev 0.11): keep-alive, read/write/keep-alive timeouts,
// a payload limit, multipart parsing, chunked responses (server-sent events) and TLS through
// OpenSSL in a few readable calls. libmicrohttpd needs far more C glue for multipart and
// streaming, and Boost.Beast leaves parsing multipart and the connection loop to us.
// Tested by tests/server/http_api_test.cc (fake engine, in process) and
// tests/server/openai_client_test.mjs (the `openai` npm client against flux2_server).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "server/serving/serving_core.h"

namespace httplib {
class Server;
}

namespace flux2::server {

struct HttpApiOptions {
  std::string host = "0.0.0.0";
  int port = 8000;            // 0 picks a free one
  std::string tls_cert_file;  // with tls_key_file: HTTPS (the gRPC port's files)
  std::string tls_key_file;
  int64_t max_request_bytes = int64_t{48} << 20;  // larger bodies get 413
  // Worker threads: each generation holds one until it is answered, so this is the queue depth
  // plus the running job, twice over, plus room for health checks and model listings.
  int threads = 34;
};

// The request header that sets a deadline, in seconds (decimal), as gRPC's grpc-timeout does.
inline constexpr char kRequestTimeoutHeader[] = "X-Request-Timeout";
// Seconds a client is told to wait after 429 (queue full) and 503 (loading) in Retry-After.
inline constexpr int kRetryAfterSeconds = 1;

class HttpApi {
 public:
  // `auth_token`: the bearer token every request but the probes must carry; empty for none.
  HttpApi(ServingCore& core, std::string auth_token);
  ~HttpApi();  // stop()s

  // Binds the port and starts serving on a thread of its own; Unavailable naming --http-port when
  // the port cannot be bound (or the TLS files do not load).
  absl::Status start(const HttpApiOptions& options);
  int port() const { return port_; }
  // Stops accepting, closes idle keep-alive connections and waits for the running handlers.
  void stop();

 private:
  void add_routes();

  ServingCore& core_;
  const std::string auth_token_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};  // set by thread_ when listen_after_bind() returns
  int port_ = 0;
};

}  // namespace flux2::server
