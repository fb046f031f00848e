// Request accounting; see access_log.h. Tested by tests/server/log_test.cc.
#include "server/serving/access_log.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/decimal.h"
#include "server/common/log.h"
#include "server/serving/validate.h"

namespace flux2::server {

std::string loggable_request_id(const std::string& id) {
  std::string out;
  for (char c : id.substr(0, kMaxRequestIdBytes)) out += (c >= 0x20 && c <= 0x7e) ? c : '?';
  return out;
}

std::string status_code_name(const absl::Status& status) {
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
    for (const AppliedLora& lora : spec->loras) {
      absl::StrAppend(&record.loras, record.loras.empty() ? "" : ",", lora.name, ":",
                      exact_decimal(lora.scale));
    }
  }
  if (!status.ok()) record.error = std::string(status.message());
  metrics.count_request(method, record.code, seconds);
  log_request(record);
}

}  // namespace flux2::server
