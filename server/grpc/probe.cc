// The health probe client; see probe.h. Tested by tests/server/e2e_test.cc (ProbeMode).
#include "server/grpc/probe.h"

#include <chrono>
#include <cstdio>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "kernels/base/read_file.h"

namespace flux2::server {

// Container runtimes and Kubernetes expect an answer quickly; 2 s is the contract.
constexpr auto kProbeTimeout = std::chrono::seconds(2);

int run_health_probe(const HealthProbe& probe) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!probe.tls_cert_file.empty()) {
    absl::StatusOr<std::string> pem = read_file(probe.tls_cert_file, "--tls-cert");
    if (!pem.ok()) {
      std::fprintf(stderr, "probe: %s\n", std::string(pem.status().message()).c_str());
      return 1;
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *std::move(pem);
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateChannel(probe.address, credentials);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kProbeTimeout);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(probe.service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "probe %s at %s: %s (code %d)\n", probe.service.c_str(),
                 probe.address.c_str(), status.error_message().c_str(),
                 static_cast<int>(status.error_code()));
    return 1;
  }
  const bool serving = response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  std::printf("%s: %s\n", probe.service.c_str(),
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
  return serving ? 0 : 1;
}

}  // namespace flux2::server
