// The gRPC side of flux2_server: one grpc::Server with flux2.v1.ImageGeneration
// (server/grpc/grpc_service.h), grpc.health.v1 (services "", "liveness", "readiness" and the
// ImageGeneration name, set from the server's Health), reflection v1alpha and v1, TLS and the
// receive limit. Tested by tests/server/server_test.cc and the end-to-end tests.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/server.h"
#include "server/grpc/grpc_service.h"
#include "server/grpc/reflection_v1.h"
#include "server/serving/serving_core.h"

namespace flux2::server {

struct GrpcOptions {
  std::string address;                    // "host:port" (port 0: any free one)
  int64_t max_request_bytes = 0;          // the largest message received
  std::string tls_cert_pem, tls_key_pem;  // PEM text; both empty: plaintext
  std::string auth_token;                 // bearer token of the ImageGeneration RPCs; "" for none
};

class GrpcFrontEnd {
 public:
  explicit GrpcFrontEnd(ServingCore& core) : core_(core) {}
  ~GrpcFrontEnd();  // shuts down at once if still running

  // Builds and starts the server; Unavailable naming --port when it cannot listen. Health starts
  // as the core's state says.
  absl::Status start(const GrpcOptions& options);
  int port() const { return port_; }
  // Sets every health service from `health` (liveness from live, the rest from ready).
  void set_health(const Health& health);
  // Waits until no generation call is open (or `deadline`), then shuts gRPC down at once.
  void stop(Clock::time_point deadline);

 private:
  ServingCore& core_;
  std::unique_ptr<ImageGenerationService> service_;
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex health_mu_;  // health updates come from several threads; each applies the latest
  int port_ = 0;
};

}  // namespace flux2::server
