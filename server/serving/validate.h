// Request validation before admission: turns a GenerateRequest into a JobSpec, or an
// InvalidArgument naming every bad field (server/serving/field_violations.h), checked against the
// one limits table (server/serving/limits.h) and then the model's own checks (Engine::check).
// Reference images are decoded and prepared here, on the front end's thread, so a bad image is
// refused before admission and never reaches the worker. Also the worst-case size of a unary
// response. Tested by tests/server/validate_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/serving/field_violations.h"
#include "server/serving/job.h"
#include "server/serving/limits.h"
#include "server/serving/request.h"

namespace flux2::server {

// Image side used when width / height is 0: diffusers' default (default_sample_size 128 x the
// VAE's scale factor 8).
constexpr int32_t kDefaultImageSide = 1024;
// request_id bound: ids are logged, so keep them short and printable.
constexpr size_t kMaxRequestIdBytes = 128;

// Validates `request` against `limits`. `random_seed` is the seed used when the request has none.
// Decodes and prepares every reference image (model/reference_image.h, sides cropped to
// limits.pixel_multiple); each bad one is a violation of `reference_images[i]`. The JobSpec's
// width and height are the output size (model/pipeline.h output_size): the request's, else the
// first reference's prepared size, else kDefaultImageSide; limits.max_pixels applies to it.
// CPU-heavy with references (decoding up to limits.max_reference_images images): call it off the
// worker thread.
absl::StatusOr<JobSpec> validate(const GenerateRequest& request, const Limits& limits,
                                 uint64_t random_seed);

// Upper bound in bytes of one encoded width x height image (model/image_encode.h), derived in
// validate.cc: PNG just over 3 bytes per pixel (3 x W x H + H + deflate's stored-block overhead
// + framing), JPEG 6 bytes per pixel + 2048 (libjpeg-turbo's tjBufSize for 4:4:4).
int64_t encoded_image_bound_bytes(ImageFormat format, int64_t width, int64_t height);

// Upper bound in bytes of the serialized GenerateImageResponse for `spec`: num_images x
// encoded_image_bound_bytes plus the metadata (per-image fields, step timings for `max_steps`
// steps when spec.params.num_inference_steps is 0, and kResponseMetadataBytes).
int64_t unary_response_bound_bytes(const JobSpec& spec, int64_t max_steps);

// Everything of a GenerateImageResponse besides its images and step timings: the other timings,
// model_name, request_id (at most 128 bytes) and the fast-path usage (a few dozen registered paths
// of under 100 bytes each with their fallback reasons). Generous: a few KiB in practice.
constexpr int64_t kResponseMetadataBytes = int64_t{64} << 10;
// The smallest --max-response-bytes: one small image (64 KiB, a 128 x 128 PNG's bound is 49 KiB)
// beside the other fields.
constexpr int64_t kMinMaxResponseBytes = kResponseMetadataBytes + (int64_t{64} << 10);

// OK when the unary response for `spec` fits limits.max_response_bytes; else InvalidArgument
// naming num_images with the bound and what to do instead. Called before admission by
// GenerateImage only: GenerateImageStream sends one image per message.
absl::Status check_unary_response_size(const JobSpec& spec, const Limits& limits);

}  // namespace flux2::server
