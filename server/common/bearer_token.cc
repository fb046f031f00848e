// Bearer-token checks; see bearer_token.h. Tested by the server and HTTP API tests.
#include "server/common/bearer_token.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace flux2::server {

bool constant_time_equal(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status check_bearer_token(const std::string& token,
                                const std::vector<absl::string_view>& authorization_values) {
  if (token.empty()) return absl::OkStatus();
  if (authorization_values.empty()) {
    return absl::UnauthenticatedError("missing `authorization: Bearer <token>`");
  }
  if (authorization_values.size() > 1) {
    return absl::UnauthenticatedError("more than one `authorization` value; send exactly one");
  }
  constexpr absl::string_view kScheme = "bearer ";
  const absl::string_view value = authorization_values.front();
  const bool bearer =
      value.size() > kScheme.size() && absl::EqualsIgnoreCase(value.substr(0, 7), kScheme);
  if (!bearer || !constant_time_equal(value.substr(kScheme.size()), token)) {
    return absl::UnauthenticatedError("the bearer token in `authorization` is not valid");
  }
  return absl::OkStatus();
}

}  // namespace flux2::server
