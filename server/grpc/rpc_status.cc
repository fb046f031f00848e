// absl::Status -> grpc::Status with rich details; see rpc_status.h.
// Tested by tests/server/validate_test.cc (RpcStatus).
#include "server/grpc/rpc_status.h"

#include <string>

#include "google/protobuf/any.pb.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "server/serving/field_violations.h"

namespace flux2::server {

grpc::Status to_grpc_status(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering (0..16).
  const auto code = static_cast<grpc::StatusCode>(static_cast<int>(status.code()));
  const std::string message(status.message());
  const std::vector<FieldViolation> violations = field_violations_of(status);
  if (violations.empty()) return grpc::Status(code, message);
  google::rpc::BadRequest bad_request;
  for (const FieldViolation& violation : violations) {
    google::rpc::BadRequest::FieldViolation* v = bad_request.add_field_violations();
    v->set_field(violation.field);
    v->set_description(violation.description);
  }
  google::rpc::Status details;
  details.set_code(static_cast<int>(code));
  details.set_message(message);
  google::protobuf::Any* any = details.add_details();
  any->set_type_url(kBadRequestTypeUrl);
  any->set_value(bad_request.SerializeAsString());
  return grpc::Status(code, message, details.SerializeAsString());
}

}  // namespace flux2::server
