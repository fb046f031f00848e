// The flux2.v1.ImageGeneration RPC handlers on gRPC's callback API over the serving core
// (server/serving/serving_core.h): authenticate, convert (server/grpc/request_conversion.h),
// validate and admit, then answer from the job's events: its end (unary) or one message per
// event (server streaming). No gRPC thread blocks on a job: a queued request only holds its
// reactor, and a cancel or an expired deadline withdraws it at once. A unary request whose
// worst-case response exceeds --max-response-bytes is refused before admission.
// Tested by tests/server/server_test.cc (fake engine) and the end-to-end tests.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "flux2/v1/image_generation.grpc.pb.h"
#include "server/serving/serving_core.h"

namespace flux2::server {

// The four RPCs are registered raw (their messages as bytes) so the service parses each request
// itself: a body that does not parse gets INVALID_ARGUMENT, logged and counted (raw_messages.h),
// instead of gRPC's own empty UNIMPLEMENTED.
using RawImageGenerationService = flux2::v1::ImageGeneration::WithRawCallbackMethod_GenerateImage<
    flux2::v1::ImageGeneration::WithRawCallbackMethod_GenerateImageStream<
        flux2::v1::ImageGeneration::WithRawCallbackMethod_GetModelInfo<
            flux2::v1::ImageGeneration::WithRawCallbackMethod_ListLoras<
                flux2::v1::ImageGeneration::CallbackService>>>>;

class ImageGenerationService final : public RawImageGenerationService {
 public:
  // `auth_token`: the bearer token every RPC must carry; empty for none.
  ImageGenerationService(ServingCore& core, std::string auth_token);

  grpc::ServerUnaryReactor* GenerateImage(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateImageStream(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListLoras(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

  ServingCore& core() { return core_; }
  // Parses `raw`, authenticates and creates the job (not yet admitted) whose events go to
  // `events`: shared by both generation RPCs.
  absl::StatusOr<std::shared_ptr<Job>> make_job(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer& raw,
                                                Clock::time_point arrival,
                                                std::shared_ptr<JobEvents> events,
                                                std::string* request_id,
                                                std::shared_ptr<const ServingModel>* model);

  // Generation calls whose reactor gRPC has not released yet (counted from creation to OnDone).
  void call_started();
  void call_done();
  // Waits until no generation call is open or `deadline` passes; true when none is. The drain
  // waits here, then shuts gRPC down at once: a reply still being written gets its grace, and
  // idle client connections do not hold the exit (gRPC would wait the whole shutdown deadline).
  bool wait_for_no_calls(Clock::time_point deadline);

 private:
  absl::Status authenticate(const grpc::CallbackServerContext& context) const;

  ServingCore& core_;
  const std::string auth_token_;
  std::mutex calls_mu_;
  std::condition_variable calls_cv_;
  int open_calls_ = 0;  // guarded by calls_mu_
};

}  // namespace flux2::server
