// Request validation before admission (service.md "Clear validation errors that name the field"):
// turns a flux2.v1.GenerateImageRequest into a JobSpec, or an InvalidArgument status whose message
// names every bad field and whose payload carries a google.rpc.BadRequest (the RPC layer copies it
// into the grpc-status-details-bin trailer). Reference images are decoded and prepared here, on
// the RPC thread, so a bad image is refused before admission and never reaches the worker.
// Tested by tests/server/request_validation_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "flux2/v1/image_generation.pb.h"
#include "server/serving/job.h"

namespace flux2::server {

// What the server accepts; built from the flags and the loaded model.
struct RequestLimits {
  int64_t pixel_multiple = 16;   // width and height must be positive multiples of this
  int64_t max_pixels = 4194304;  // width x height budget
  int64_t max_steps = 200;       // num_inference_steps upper bound
  int64_t default_steps = 0;     // what num_inference_steps 0 means (the model's; 0: left to it)
  double min_guidance = 0.0;     // guidance_scale range (inclusive)
  double max_guidance = 100.0;
  int64_t max_images = 4;            // num_images upper bound
  int64_t max_prompt_bytes = 8192;   // prompt / negative_prompt bound
  int64_t max_reference_images = 4;  // reference_images upper bound; 0: editing is off
  int64_t max_reference_bytes = int64_t{10} << 20;  // one reference's encoded bytes
  int64_t max_request_bytes = int64_t{48} << 20;    // gRPC's receive limit (GetModelInfo only)
  int64_t max_response_bytes = int64_t{4} << 20;    // unary GenerateImage worst-case bound
  int64_t max_sequence_length = 512;                // every request's text-encoder length
  bool uses_cfg = false;                            // the model takes a negative prompt
  bool quality_high_enabled = false;                // --enable-quality-high
  bool fast_paths = true;  // --fast-paths: every request's fast-path switch
};

// Image side used when width / height is 0 (issue 4).
constexpr int32_t kDefaultImageSide = 1024;
// request_id bound: ids are logged, so keep them short and printable.
constexpr size_t kMaxRequestIdBytes = 128;
// Type URL of google.rpc.BadRequest in absl::Status payloads and google.protobuf.Any.
inline constexpr char kBadRequestTypeUrl[] = "type.googleapis.com/google.rpc.BadRequest";

struct FieldViolation {
  std::string field;        // request field name, e.g. "width"
  std::string description;  // why it is invalid
};

// Validates `request` against `limits`. `random_seed` is the seed used when the request has none.
// Decodes and prepares every reference image (model/reference_image.h, sides cropped to
// limits.pixel_multiple); each bad one is a violation of `reference_images[i]`. The JobSpec's
// width and height are the output size (model/pipeline.h output_size): the request's, else the
// first reference's prepared size, else kDefaultImageSide; limits.max_pixels applies to it.
// CPU-heavy with references (decoding up to limits.max_reference_images images): call it off the
// worker thread.
absl::StatusOr<JobSpec> validate_generate_request(const flux2::v1::GenerateImageRequest& request,
                                                  const RequestLimits& limits,
                                                  uint64_t random_seed);

// Upper bound in bytes of one encoded width x height image (model/image_encode.h), derived in
// request_validation.cc: PNG just over 3 bytes per pixel (3 x W x H + H + deflate's stored-block
// overhead + framing), JPEG 6 bytes per pixel + 2048 (libjpeg-turbo's tjBufSize for 4:4:4).
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
// naming num_images (BadRequest payload) with the bound and what to do instead. Called before
// admission by GenerateImage only: GenerateImageStream sends one image per message.
absl::Status check_unary_response_size(const JobSpec& spec, const RequestLimits& limits);

// InvalidArgument naming every violation, with a serialized google.rpc.BadRequest payload under
// kBadRequestTypeUrl.
absl::Status invalid_argument_status(const std::vector<FieldViolation>& violations);

// Re-expresses an engine validation error ("field: reason", model/pipeline.h) as a field violation.
absl::Status engine_validation_status(const absl::Status& engine_status);

// The violations carried by a status built by invalid_argument_status (empty when none).
std::vector<FieldViolation> field_violations_of(const absl::Status& status);

}  // namespace flux2::server
