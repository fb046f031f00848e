// The OpenAI-compatible HTTP API beside gRPC, in the same process and through the same serving
// core (queue, limits, bearer token, TLS, metrics, drain): POST /v1/images/generations (JSON),
// POST /v1/images/edits (multipart), GET /v1/models, GET /health (liveness), GET /ready
// (readiness), GET /openapi.json. An http::Application (server/http/transport/transport.h): the
// transport owns the connections and enforces the limits of the request head and body; this
// routes, authenticates before any body byte is read, converts bodies (server/http/openai_images.h)
// and answers from the job's events (a JSON response, or server-sent events). Every refusal is
// OpenAI's error JSON and counted in flux2_requests_total.
// Why Boost.Beast and not cpp-httplib 0.11 (Debian's shared library):
// server/http/transport/README.md. Tested by tests/server/http_api_test.cc (fake engine, in
// process), http_hostile_test.py (the hostile-client suite) and openai_client_test.mjs (the
// `openai` npm client).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "server/http/transport/transport.h"
#include "server/serving/serving_core.h"

namespace flux2::server {

class DeadlineWatch;  // http_api.cc: withdraws jobs whose X-Request-Timeout passed

struct HttpApiOptions {
  std::string host = "0.0.0.0";
  int port = 8000;                                // 0 picks a free one
  std::string tls_cert_pem, tls_key_pem;          // with both: HTTPS (the gRPC port's files)
  int64_t max_request_bytes = int64_t{48} << 20;  // larger bodies (either framing) get 413
  double head_timeout_s = 10;           // --http-head-timeout-s: request line + headers -> 408
  double body_timeout_s = 60;           // --http-body-timeout-s: the whole body -> 408
  double idle_timeout_s = 5;            // --http-idle-timeout-s: keep-alive wait
  int max_connections = 1024;           // --http-max-connections
  int max_connections_per_client = 64;  // --http-max-connections-per-client (per IP address)
};

// The request header that sets a deadline, in seconds (decimal), as gRPC's grpc-timeout does.
inline constexpr char kRequestTimeoutHeader[] = "X-Request-Timeout";
// Seconds a client is told to wait after 429 (queue full) and 503 (loading, draining) in
// Retry-After.
inline constexpr int kRetryAfterSeconds = 1;

class HttpApi final : public http::Application {
 public:
  // `auth_token`: the bearer token every /v1 route must carry; empty for none.
  HttpApi(ServingCore& core, std::string auth_token);
  ~HttpApi() override;  // stop()s at once

  // Binds the port and starts serving; Unavailable naming --http-port when the port cannot be
  // bound, InvalidArgument when the TLS PEMs do not load.
  absl::Status start(const HttpApiOptions& options);
  int port() const { return port_; }
  // Stops accepting and waits until every request read so far is answered and its response
  // written (or `deadline`); then closes every connection.
  void stop(Clock::time_point deadline);

  // http::Application
  std::optional<http::Response> check_head(const http::RequestHead& head) override;
  void handle(std::shared_ptr<http::Exchange> exchange) override;
  http::Response render_refusal(const http::Refusal& refusal) override;

 private:
  void models(http::Exchange& exchange);
  void loras(http::Exchange& exchange);  // GET /v1/loras

  ServingCore& core_;
  const std::string auth_token_;
  std::unique_ptr<DeadlineWatch> deadlines_;
  std::unique_ptr<http::Transport> transport_;
  int port_ = 0;
};

}  // namespace flux2::server
