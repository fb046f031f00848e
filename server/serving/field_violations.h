// Refusals that name request fields, carried in an absl::Status so every layer passes them as it
// passes any error: InvalidArgument whose message names every field ("width: ...; n: ...") and
// whose payload holds the violations themselves (plain bytes, no protobuf). The gRPC front end
// turns them into google.rpc.BadRequest details, the HTTP front end into OpenAI's `param`. Tested
// by tests/server/validate_test.cc.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "model/field_violation.h"

namespace flux2::server {

using flux2::FieldViolation;

// InvalidArgument naming every violation in its message, the violations in its payload.
absl::Status invalid_argument_status(const std::vector<FieldViolation>& violations);

// The violations a status of invalid_argument_status carries (empty for any other status).
std::vector<FieldViolation> field_violations_of(const absl::Status& status);

}  // namespace flux2::server
