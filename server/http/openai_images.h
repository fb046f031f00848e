// The OpenAI Images API as this server speaks it: request bodies of POST /v1/images/generations
// (JSON) and /v1/images/edits (multipart form) into a GenerateRequest (server/serving/request.h),
// validation errors renamed to the API's parameters (`size`, `n`, `image[1]`), OpenAI-shaped error
// bodies with the HTTP status that fits, and the JSON of responses and server-sent events. No I/O
// here: the HTTP server is server/http/http_api.h. Tested by tests/server/openai_images_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/http/form_data.h"
#include "server/serving/job.h"
#include "server/serving/request.h"

namespace flux2::server {

// A parsed images request: the serving core's request it becomes, and whether the client asked
// for server-sent events (`stream: true`).
struct OpenAiImageRequest {
  GenerateRequest request;
  bool stream = false;
};

// JSON bodies nest at most this deep (the API's fields are flat; OpenAI's `user` is a string).
inline constexpr int kMaxJsonDepth = 32;

// POST /v1/images/generations. Fields (docs: the server's /openapi.json): prompt (required),
// model, n, size ("WxH" or "auto"), response_format ("b64_json"; "url" is refused: this server
// stores no images), output_format (png, jpeg, webp), output_compression (1..100: the JPEG / WebP
// encoder quality), quality ("lossless", "high" or "auto"), stream, partial_images (0 only),
// background ("auto" or "opaque"), moderation ("auto" or "low": no moderation is done), user
// (accepted, unused), and the FLUX.2 extensions seed, num_inference_steps, guidance_scale,
// negative_prompt. Unknown fields are refused, as OpenAI does. `served_model`: a `model` other
// than it is NotFound (param `model`). Errors are InvalidArgument with field violations under
// the API's names.
absl::StatusOr<OpenAiImageRequest> parse_generations_body(absl::string_view body,
                                                          absl::string_view served_model);

// POST /v1/images/edits: the same fields as form parts, plus the reference images as file parts
// `image` or `image[]` (in order; `image` parts before `image[]` ones); `mask` is refused.
absl::StatusOr<OpenAiImageRequest> parse_edits_form(const std::vector<http::FormPart>& parts,
                                                    absl::string_view served_model);

// The OpenAI parameter of a GenerateRequest field as validation names it: width and height
// are `size`, num_images `n`, reference_images[i] `image[i]`, output_quality
// `output_compression`, request_id the `X-Request-Id` header; the rest keep their names.
std::string openai_param(absl::string_view field);

// Re-expresses a validation error (InvalidArgument with field violations) under the API's names;
// other statuses are returned as they are.
absl::Status with_openai_params(const absl::Status& status);

// The HTTP status of an error: InvalidArgument / FailedPrecondition / OutOfRange 400,
// Unauthenticated 401, PermissionDenied 403, NotFound 404, ResourceExhausted 429 (a full queue),
// Cancelled 499 (nobody reads it), Unimplemented 501, Unavailable 503, DeadlineExceeded 504, the
// rest 500.
int http_status_of(const absl::Status& status);

// {"error": {"message", "type", "param", "code"}}: `param` is the first violated field (API name)
// or null, `code` the gRPC code name in lower case ("invalid_argument", "resource_exhausted"; a
// wrong model is "model_not_found"), `type` OpenAI's class (invalid_request_error,
// authentication_error, permission_error, rate_limit_error, server_error).
nlohmann::json openai_error_body(const absl::Status& status);

// One generated image as the API returns it: b64_json, seed, size ("WxH"), mime_type.
nlohmann::json openai_image_json(const EncodedImage& image);

// The response body of a finished request: created (Unix seconds), data (one openai_image_json per
// image, in seed order), and this server's additions: model, output_format, quality, size, seed
// (the first image's), request_id and timings (the seconds of every stage, as gRPC's Timings).
nlohmann::json openai_images_response(const JobSpec& spec, const JobResult& result,
                                      absl::string_view model_name, int64_t created,
                                      double total_seconds);

// Server-sent events (text/event-stream) of `stream: true`, named after OpenAI's image streaming:
// "image_generation.progress" after every denoising step, "image_generation.completed" per image
// (with its b64_json), and "error" (an openai_error_body) when the request fails after the stream
// began. Each returns the whole event, "event: <name>\ndata: <json>\n\n".
std::string sse_progress_event(const ProgressEvent& event);
std::string sse_image_event(const EncodedImage& image, int image_index, int num_images,
                            const JobSpec& spec, int64_t created);
std::string sse_error_event(const absl::Status& status);

}  // namespace flux2::server
