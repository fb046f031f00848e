// grpc.reflection.v1 ServerReflection, served beside Debian's v1alpha plugin (gRPC 1.51 ships
// only v1alpha; current grpcurl, buf curl and Postman ask v1 first). Answers from the generated
// descriptor pool, as the v1alpha plugin does, so every message type linked into the server
// (flux2.v1, grpc.health.v1, google.rpc.Status and the error details) is resolvable.
// Tested by tests/server/server_test.cc (ReflectionV1*) and tests/server/e2e_test.cc.
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace flux2::server {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // `services`: the fully qualified names list_services reports (the server's registered
  // services, in the order given).
  explicit ReflectionV1Service(std::vector<std::string> services);

  // One response per request until the client half-closes; blocks a sync-server thread for the
  // stream's lifetime (as the v1alpha service does).
  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

 private:
  const std::vector<std::string> services_;
};

}  // namespace flux2::server
