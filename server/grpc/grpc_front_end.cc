// The gRPC server of flux2_server; see grpc_front_end.h.
// Tested by tests/server/server_test.cc and the end-to-end tests.
#include "server/grpc/grpc_front_end.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace flux2::server {

GrpcFrontEnd::~GrpcFrontEnd() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

absl::Status GrpcFrontEnd::start(const GrpcOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, which lets a second server bind the same port and silently
  // take half the connections; a port in use must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Requests carry reference images: gRPC refuses larger messages with RESOURCE_EXHAUSTED.
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_request_bytes));
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(options.address, credentials, &port_);
  service_ = std::make_unique<ImageGenerationService>(core_, options.auth_token);
  builder.RegisterService(service_.get());
  // Reflection answers from the generated descriptor pool; a generated file is in it only when its
  // object file is linked. Naming the google.rpc types here keeps error_details.proto (BadRequest,
  // RetryInfo, ...) resolvable, so clients can decode grpc-status-details-bin through reflection.
  (void)google::rpc::Status::descriptor();
  (void)google::rpc::BadRequest::descriptor();
  // v1 beside Debian's v1alpha plugin; list_services names what this builder registers.
  reflection_v1_ = std::make_unique<ReflectionV1Service>(
      std::vector<std::string>{flux2::v1::ImageGeneration::service_full_name(),
                               "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                               grpc::reflection::v1::ServerReflection::service_full_name()});
  builder.RegisterService(reflection_v1_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("--port: cannot listen on ", options.address, " (in use?)"));
  }
  set_health(core_.state().health());
  return absl::OkStatus();
}

void GrpcFrontEnd::set_health(const Health& /*changed*/) {
  std::lock_guard<std::mutex> lock(health_mu_);
  if (!server_) return;
  grpc::HealthCheckServiceInterface* service = server_->GetHealthCheckService();
  if (service == nullptr) return;
  // The latest state, not the one passed: changes reported from two threads may arrive in either
  // order.
  const Health health = core_.state().health();
  service->SetServingStatus("", health.ready.ok());  // the server takes generation requests
  // The service's own name (what grpc_health_probe -service and generic checkers ask): as "".
  service->SetServingStatus(flux2::v1::ImageGeneration::service_full_name(), health.ready.ok());
  service->SetServingStatus("readiness", health.ready.ok());
  service->SetServingStatus("liveness", health.live.ok());
}

void GrpcFrontEnd::stop(Clock::time_point deadline) {
  if (!server_) return;
  service_->wait_for_no_calls(deadline);
  server_->Shutdown(std::chrono::system_clock::now());
  std::lock_guard<std::mutex> lock(health_mu_);
  server_.reset();
}

}  // namespace flux2::server
