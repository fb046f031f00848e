// What both front ends (gRPC, server/grpc/grpc_service.h, and the OpenAI-compatible HTTP API,
// server/http/http_api.h) need from the server: the model being served, admission, withdrawal,
// metrics and the bearer token; and the one path from a GenerateImageRequest to a Job (validation
// against the served limits). Tested through tests/server/server_test.cc and the HTTP API tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "flux2/v1/image_generation.pb.h"
#include "kernels/backend_options.h"
#include "server/ops/metrics.h"
#include "server/serving/engine.h"
#include "server/serving/job.h"
#include "server/serving/request_validation.h"
#include "server/serving/stall_watchdog.h"

namespace flux2::server {

// The model being served, as the RPC handlers see it (immutable once published).
struct ServingModel {
  PipelineInfo info;
  RequestLimits limits;
  int queue_depth = 0;
  BackendOptions backend_options;  // as the flags set them (GetModelInfo)
  std::string transformer_file;    // --transformer-file's file name (no directory); "" when none
  int http_port = 0;               // the bound HTTP API port; 0 when it is off
  StallPolicy stall;               // --stall-timeout-min-s, --stall-step-multiple
  std::string test_inject_fault;   // TEST ONLY: --test-inject-fault as given; "" in production
  const Engine* engine = nullptr;  // for Engine::validate (thread-safe); outlives the RPCs
};

// What the RPC handlers need from the server (implemented by Server).
class GenerationHost {
 public:
  virtual ~GenerationHost() = default;
  // The model, or Unavailable while loading, draining or after a load failure.
  virtual absl::StatusOr<std::shared_ptr<const ServingModel>> serving_model() const = 0;
  // Admits a job: ResourceExhausted when the queue is full, Unavailable when draining.
  virtual absl::Status admit(const std::shared_ptr<Job>& job) = 0;
  // The call was cancelled (client or deadline): cancels the job, and finishes it at once with
  // `reason` when it still waits in the queue.
  virtual void withdraw(const std::shared_ptr<Job>& job, const absl::Status& reason) = 0;
  virtual Metrics& metrics() = 0;
  // The bearer token ImageGeneration RPCs and the HTTP API require; empty when none.
  virtual const std::string& auth_token() const = 0;
  // A seed for a request that names none (thread-safe).
  virtual uint64_t random_seed() = 0;
  // The liveness of gRPC's "liveness" health service: Unavailable, saying why, once the model
  // failed to load or the device broke, and while the engine is stalled.
  virtual absl::Status liveness() const = 0;
};

// Validates `request` against the served model (the limits, then the engine's own checks) and
// creates its job, not yet admitted. `deadline` is Clock::time_point::max() for none. Unavailable
// while no model serves.
absl::StatusOr<std::shared_ptr<Job>> create_job(
    GenerationHost& host, const flux2::v1::GenerateImageRequest& request, Clock::time_point arrival,
    Clock::time_point deadline, Job::ProgressCallback on_progress, Job::DoneCallback on_done,
    std::shared_ptr<const ServingModel>* model);

// The request id as logged: printable ASCII only, at most kMaxRequestIdBytes (validation rejects
// anything else, but rejected requests are logged too).
std::string loggable_request_id(const std::string& id);

// "OK", "INVALID_ARGUMENT", ...: the label values of flux2_requests_total{code}.
std::string status_code_name(const absl::Status& status);

// A finished generation request, as its client saw it: counted in flux2_requests_total and
// flux2_request_duration_seconds under `method`, and one access-log line (server/common/log.h:
// method, request id, code, seconds, the client's address, the request's size, steps, images and
// quality when `spec` is known, the error message).
void record_finished_request(Metrics& metrics, absl::string_view method,
                             const std::string& request_id, const absl::Status& status,
                             double seconds, const std::string& peer, const JobSpec* spec);

// OK when `token` is empty or one of `authorization_values` (the Authorization header or metadata
// values) is exactly "Bearer <token>" (compared in constant time); else Unauthenticated saying
// whether the credentials were missing or wrong.
// Secrets compared in time that depends on their length only (tokens, passwords).
bool constant_time_equal(absl::string_view a, absl::string_view b);

absl::Status check_bearer_token(const std::string& token,
                                const std::vector<absl::string_view>& authorization_values);

}  // namespace flux2::server
