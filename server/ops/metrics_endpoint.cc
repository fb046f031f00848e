// The /metrics endpoint; see metrics_endpoint.h. Tested by tests/server/metrics_test.cc.
#include "server/ops/metrics_endpoint.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/bearer_token.h"

namespace flux2::server {

absl::Status MetricsEndpoint::start(const std::string& address, Metrics& metrics,
                                    const std::string& user, const std::string& password) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-port: cannot serve metrics on ", address, ": ", e.what()));
  }
  for (const auto& collectable : metrics.collectables()) exposer_->RegisterCollectable(collectable);
  user_ = user;
  password_ = password;
  if (!user_.empty()) {
    exposer_->RegisterAuth(
        [this](const std::string& given_user, const std::string& given_password) {
          return constant_time_equal(given_user, user_) &&
                 constant_time_equal(given_password, password_);
        },
        "flux2 metrics");
  }
  const std::vector<int> ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? 0 : ports.front();
  return absl::OkStatus();
}

}  // namespace flux2::server
