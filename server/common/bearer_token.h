// Bearer-token checks shared by the gRPC and HTTP front ends (the `authorization` metadata or
// header: "Bearer <token>", the scheme in any case as RFC 7235 says), and constant-time comparison
// of secrets. Tested by tests/server/server_test.cc (gRPC) and the HTTP API tests.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace flux2::server {

// Secrets compared in time that depends on their length only (tokens, passwords).
bool constant_time_equal(absl::string_view a, absl::string_view b);

// OK when `token` is empty, or when there is exactly one authorization value and it is
// "Bearer <token>" (scheme case-insensitive, compared in constant time); else Unauthenticated
// saying whether the credentials were missing, repeated or wrong.
absl::Status check_bearer_token(const std::string& token,
                                const std::vector<absl::string_view>& authorization_values);

}  // namespace flux2::server
