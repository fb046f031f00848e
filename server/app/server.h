// flux2_server as an object, the composition root: Create(options) validates the configuration
// and reads the files the flags name; Start() builds the serving core (server/serving/), the gRPC
// front end (server/grpc/), the HTTP API (server/http/) and the metrics endpoint (server/ops/) and
// connects them; GracefulStop(deadline) drains. The server's state and health live in the core
// (server/serving/server_state.h); this only passes them on. Tested by tests/server/server_test.cc
// (fake engine, in process) and the end-to-end tests.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/app/server_options.h"
#include "server/grpc/grpc_front_end.h"
#include "server/http/http_api.h"
#include "server/ops/metrics.h"
#include "server/ops/metrics_endpoint.h"
#include "server/serving/serving_core.h"

namespace flux2::server {

// What the flags' files hold: the bearer token, /metrics' basic-auth user and password, TLS PEMs.
struct ServerSecrets {
  std::string auth_token;
  std::string metrics_user, metrics_password;
  std::string tls_cert_pem, tls_key_pem;
};

// Reads --auth-token-file, --metrics-basic-auth-file and --tls-cert / --tls-key; errors name the
// flag.
absl::StatusOr<ServerSecrets> read_server_secrets(const ServerOptions& options);

class Server {
 public:
  // Validates `options` and reads their files. `factory` creates the engine on the worker thread;
  // nullptr loads the checkpoint the options name (server/serving/pipeline_engine.h).
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options,
                                                        EngineFactory factory = nullptr);
  ~Server();  // GracefulStop()s with a zero deadline if still running

  // Binds the ports and starts serving health, metrics and (once the model is loaded and warm)
  // generation. Fails when a port cannot be bound.
  absl::Status Start();
  // The bound ports (useful with port 0).
  int grpc_port() const { return grpc_.port(); }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }  // 0 when --http-port -1 turned it off

  // Asks WaitForStopRequest to return (signal handler thread).
  void RequestStop();
  // Blocks until RequestStop() (returns OK), or the model failed to load or the device broke
  // (returns that error: the process exits non-zero after the drain).
  absl::Status WaitForStopRequest();
  // Drains: readiness NOT_SERVING and new generation requests UNAVAILABLE at once; queued and
  // running jobs finish until `deadline`, then the rest are cancelled (UNAVAILABLE); every HTTP
  // response is written; then gRPC and the metrics endpoint shut down. OK when all admitted work
  // finished in time, DeadlineExceeded otherwise. Idempotent.
  absl::Status GracefulStop(Clock::time_point deadline);
  // The serving core (its model, state and metrics), for tests and the load bench.
  ServingCore& core() { return core_; }
  Metrics& metrics() { return metrics_; }
  bool worker_joined() const { return core_.worker_joined(); }
  bool device_broken() const { return core_.device_broken(); }

 private:
  Server(const ServerOptions& options, EngineFactory factory, ServerSecrets secrets);

  const ServerOptions options_;
  const ServerSecrets secrets_;
  Metrics metrics_;
  ServingCore core_;
  GrpcFrontEnd grpc_;
  std::unique_ptr<HttpApi> http_;
  MetricsEndpoint metrics_endpoint_;
  int metrics_port_ = 0;
  int http_port_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;         // guarded by mu_: Start() succeeded
  bool stopped_ = false;         // guarded by mu_: GracefulStop ran
  bool stop_requested_ = false;  // guarded by mu_
};

}  // namespace flux2::server
