// flux2.v1 messages <-> the serving core's types: a GenerateImageRequest into a GenerateRequest
// (unknown enum values are violations of their field), a finished job into a
// GenerateImageResponse, the model into GetModelInfoResponse (its limits from the one table).
// Tested by tests/server/validate_test.cc and server_test.cc.
#pragma once

#include "absl/status/statusor.h"
#include "flux2/v1/image_generation.pb.h"
#include "server/serving/job.h"
#include "server/serving/request.h"
#include "server/serving/serving_core.h"

namespace flux2::server {

absl::StatusOr<GenerateRequest> request_from_proto(const flux2::v1::GenerateImageRequest& proto);

// Image metadata (mime_type, width, height, seed) of `image`; not its bytes.
void set_image_metadata(const EncodedImage& image, flux2::v1::Image* out);
// Step caching's forwards per list (Timings.cache, Progress.cache).
void cache_to_proto(const StepCacheCounts& counts, flux2::v1::StepCacheUsage* out);

// Fills `response` from a finished job; `total_seconds` since the request arrived.
void fill_generate_response(const JobSpec& spec, JobResult&& result, const ServingModel& model,
                            double total_seconds, flux2::v1::GenerateImageResponse* response);

// GetModelInfo's answer for `model`.
void fill_model_info(const ServingModel& model, flux2::v1::GetModelInfoResponse* response);
// ListLoras' answer: the adapters under --lora-dir (none without it).
void fill_lora_list(const ServingModel& model, flux2::v1::ListLorasResponse* response);

}  // namespace flux2::server
