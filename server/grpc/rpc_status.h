// The one place where absl::Status becomes grpc::Status (design.md "Errors"): same code, same
// message, and every payload (e.g. google.rpc.BadRequest) packed into a google.rpc.Status sent in
// the grpc-status-details-bin trailer. Tested by tests/server/request_validation_test.cc.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace flux2::server {

grpc::Status to_grpc_status(const absl::Status& status);

// "OK", "INVALID_ARGUMENT", ... (the label values of flux2_requests_total{code}).
std::string grpc_code_name(grpc::StatusCode code);

}  // namespace flux2::server
