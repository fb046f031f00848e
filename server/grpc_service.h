// The flux2.v1.ImageGeneration RPC handlers on gRPC's callback API: authenticate, validate, admit
// to the bounded queue, then answer from the job's completion (unary) or stream one event per
// denoising step and the result (server streaming). No gRPC thread blocks on a job: a queued
// request only holds its reactor, and a cancel or an expired deadline withdraws it at once. A unary
// request whose worst-case response exceeds --max-response-bytes is refused before admission; the
// stream sends each image in its own message as soon as it is encoded.
// The only layer that maps absl::Status to grpc::Status (server/rpc_status.h).
// Tested by tests/server/server_test.cc (fake engine) and the end-to-end tests.
#pragma once

#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "flux2/v1/image_generation.grpc.pb.h"
#include "kernels/backend_options.h"
#include "server/engine.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/request_validation.h"

namespace flux2::server {

// The model being served, as the RPC handlers see it (immutable once published).
struct ServingModel {
  PipelineInfo info;
  RequestLimits limits;
  int queue_depth = 0;
  BackendOptions backend_options;  // as the flags set them (GetModelInfo)
  std::string transformer_file;    // --transformer-file's file name (no directory); "" when none
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
  // The bearer token ImageGeneration RPCs require; empty when none.
  virtual const std::string& auth_token() const = 0;
};

class ImageGenerationService final : public flux2::v1::ImageGeneration::CallbackService {
 public:
  explicit ImageGenerationService(GenerationHost& host);

  grpc::ServerUnaryReactor* GenerateImage(grpc::CallbackServerContext* context,
                                          const flux2::v1::GenerateImageRequest* request,
                                          flux2::v1::GenerateImageResponse* response) override;
  grpc::ServerWriteReactor<flux2::v1::GenerateImageStreamResponse>* GenerateImageStream(
      grpc::CallbackServerContext* context,
      const flux2::v1::GenerateImageRequest* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const flux2::v1::GetModelInfoRequest* request,
                                         flux2::v1::GetModelInfoResponse* response) override;

  // Shared by both generate RPCs: authentication, validation, job creation (not yet admitted).
  absl::StatusOr<std::shared_ptr<Job>> make_job(grpc::CallbackServerContext* context,
                                                const flux2::v1::GenerateImageRequest& request,
                                                Clock::time_point arrival,
                                                Job::ProgressCallback on_progress,
                                                Job::DoneCallback on_done,
                                                std::shared_ptr<const ServingModel>* model);
  GenerationHost& host() { return host_; }

 private:
  absl::Status authenticate(const grpc::CallbackServerContext& context) const;
  uint64_t random_seed();

  GenerationHost& host_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;  // guarded by rng_mu_; seeds for requests without one
};

// Image metadata (mime_type, width, height, seed) of `image`; not its bytes.
void set_image_metadata(const EncodedImage& image, flux2::v1::Image* out);

// Fills `response` from a finished job.
void fill_generate_response(const JobSpec& spec, JobResult&& result, const ServingModel& model,
                            Clock::time_point arrival, flux2::v1::GenerateImageResponse* response);

}  // namespace flux2::server
