// The flux2.v1.ImageGeneration RPC handlers on gRPC's callback API: authenticate, validate, admit
// to the bounded queue, then answer from the job's completion (unary) or stream one event per
// denoising step and the result (server streaming). No gRPC thread blocks on a job: a queued
// request only holds its reactor, and a cancel or an expired deadline withdraws it at once. A unary
// request whose worst-case response exceeds --max-response-bytes is refused before admission; the
// stream sends each image in its own message as soon as it is encoded.
// The only layer that maps absl::Status to grpc::Status (server/grpc/rpc_status.h).
// Tested by tests/server/server_test.cc (fake engine) and the end-to-end tests.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "flux2/v1/image_generation.grpc.pb.h"
#include "kernels/backend_options.h"
#include "server/ops/metrics.h"
#include "server/serving/engine.h"
#include "server/serving/generation_host.h"
#include "server/serving/job.h"
#include "server/serving/request_validation.h"

namespace flux2::server {

// The three RPCs are registered raw (their messages as bytes) so the service parses each request
// itself: a body that does not parse gets INVALID_ARGUMENT, logged and counted (raw_messages.h),
// instead of gRPC's own empty UNIMPLEMENTED.
using RawImageGenerationService = flux2::v1::ImageGeneration::WithRawCallbackMethod_GenerateImage<
    flux2::v1::ImageGeneration::WithRawCallbackMethod_GenerateImageStream<
        flux2::v1::ImageGeneration::WithRawCallbackMethod_GetModelInfo<
            flux2::v1::ImageGeneration::CallbackService>>>;

class ImageGenerationService final : public RawImageGenerationService {
 public:
  explicit ImageGenerationService(GenerationHost& host);

  grpc::ServerUnaryReactor* GenerateImage(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateImageStream(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

  // Shared by both generate RPCs: authentication, then create_job (not yet admitted).
  absl::StatusOr<std::shared_ptr<Job>> make_job(grpc::CallbackServerContext* context,
                                                const flux2::v1::GenerateImageRequest& request,
                                                Clock::time_point arrival,
                                                Job::ProgressCallback on_progress,
                                                Job::DoneCallback on_done,
                                                std::shared_ptr<const ServingModel>* model);
  GenerationHost& host() { return host_; }

  // Generation calls whose reactor gRPC has not released yet (counted from creation to OnDone).
  void call_started();
  void call_done();
  // Waits until no generation call is open or `deadline` passes; true when none is. The drain
  // waits here, then shuts gRPC down at once: a reply still being written gets its grace, and
  // idle client connections do not hold the exit (gRPC would wait the whole shutdown deadline).
  bool wait_for_no_calls(Clock::time_point deadline);

 private:
  absl::Status authenticate(const grpc::CallbackServerContext& context) const;

  GenerationHost& host_;
  std::mutex calls_mu_;
  std::condition_variable calls_cv_;
  int open_calls_ = 0;  // guarded by calls_mu_
};

// Image metadata (mime_type, width, height, seed) of `image`; not its bytes.
void set_image_metadata(const EncodedImage& image, flux2::v1::Image* out);

// Fills `response` from a finished job.
void fill_generate_response(const JobSpec& spec, JobResult&& result, const ServingModel& model,
                            Clock::time_point arrival, flux2::v1::GenerateImageResponse* response);

}  // namespace flux2::server
