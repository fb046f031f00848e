// Job creation and bearer-token checks shared by the gRPC and HTTP front ends; see
// generation_host.h. Tested through tests/server/server_test.cc and the HTTP API tests.
#include "server/serving/generation_host.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "server/common/log.h"

namespace flux2::server {

bool constant_time_equal(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::shared_ptr<Job>> create_job(
    GenerationHost& host, const flux2::v1::GenerateImageRequest& request, Clock::time_point arrival,
    Clock::time_point deadline, Job::ProgressCallback on_progress, Job::DoneCallback on_done,
    std::shared_ptr<const ServingModel>* model) {
  absl::StatusOr<std::shared_ptr<const ServingModel>> serving = host.serving_model();
  if (!serving.ok()) return serving.status();
  *model = *serving;
  absl::StatusOr<JobSpec> spec =
      validate_generate_request(request, (*model)->limits, host.random_seed());
  if (!spec.ok()) return spec.status();
  FLUX_RETURN_IF_ERROR(engine_validation_status((*model)->engine->validate(spec->params)));
  return std::make_shared<Job>(std::move(*spec), arrival, deadline, std::move(on_progress),
                               std::move(on_done));
}

std::string loggable_request_id(const std::string& id) {
  std::string out;
  for (char c : id.substr(0, kMaxRequestIdBytes)) out += (c >= 0x20 && c <= 0x7e) ? c : '?';
  return out;
}

std::string status_code_name(const absl::Status& status) {
  // absl's names are gRPC's (both enumerate google.rpc.Code).
  return absl::StatusCodeToString(status.code());
}

void record_finished_request(Metrics& metrics, absl::string_view method,
                             const std::string& request_id, const absl::Status& status,
                             double seconds, const std::string& peer, const JobSpec* spec) {
  RequestLogRecord record;
  record.method = std::string(method);
  record.request_id = request_id;
  record.code = status_code_name(status);
  record.seconds = seconds;
  record.peer = peer;
  if (spec != nullptr) {
    record.width = spec->params.width;
    record.height = spec->params.height;
    record.steps = static_cast<int>(spec->params.num_inference_steps);
    record.num_images = spec->num_images;
    record.quality = std::string(quality_name(spec->params.quality));
  }
  if (!status.ok()) record.error = std::string(status.message());
  metrics.count_request(method, record.code, seconds);
  log_request(record);
}

absl::Status check_bearer_token(const std::string& token,
                                const std::vector<absl::string_view>& authorization_values) {
  if (token.empty()) return absl::OkStatus();
  const std::string expected = absl::StrCat("Bearer ", token);
  for (absl::string_view value : authorization_values) {
    if (constant_time_equal(value, expected)) return absl::OkStatus();
  }
  return absl::UnauthenticatedError(authorization_values.empty()
                                        ? "missing `authorization: Bearer <token>`"
                                        : "the bearer token in `authorization` is not valid");
}

}  // namespace flux2::server
