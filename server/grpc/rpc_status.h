// The one place where absl::Status becomes grpc::Status: same code, same message, and the field
// violations of a refused request (server/serving/field_violations.h) as a google.rpc.BadRequest
// inside a google.rpc.Status sent in the grpc-status-details-bin trailer.
// Tested by tests/server/validate_test.cc (RpcStatus).
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace flux2::server {

// Type URL of google.rpc.BadRequest in google.protobuf.Any.
inline constexpr char kBadRequestTypeUrl[] = "type.googleapis.com/google.rpc.BadRequest";

grpc::Status to_grpc_status(const absl::Status& status);

}  // namespace flux2::server
