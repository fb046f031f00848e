// How a finished request is accounted: counted in flux2_requests_total and
// flux2_request_duration_seconds under its method, with the code its client saw, and one
// access-log line (server/common/log.h log_request). Both front ends call it exactly once per
// request. Tested by tests/server/log_test.cc and the front ends' counting tests.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/ops/metrics.h"
#include "server/serving/job.h"

namespace flux2::server {

// The request id as logged: printable ASCII only, at most kMaxRequestIdBytes (validation rejects
// anything else, but rejected requests are logged too).
std::string loggable_request_id(const std::string& id);

// "OK", "INVALID_ARGUMENT", ...: the label values of flux2_requests_total{code} (absl's names,
// which are gRPC's: both enumerate google.rpc.Code).
std::string status_code_name(const absl::Status& status);

// A finished request as its client saw it: counted under `method` and logged (method, request id,
// code, seconds, the client's address, the request's size, steps, images and quality when `spec`
// is known, the error message).
void record_finished_request(Metrics& metrics, absl::string_view method,
                             const std::string& request_id, const absl::Status& status,
                             double seconds, const std::string& peer, const JobSpec* spec);

}  // namespace flux2::server
