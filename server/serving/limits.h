// The one limits table: what a request may ask for. The model publishes its hard bounds
// (PipelineInfo::hard_limits, model/model_limits.h), the server's flags may only narrow them
// (resolve_limits refuses a flag beyond a bound, naming both numbers), and validate()
// (server/serving/validate.h), GetModelInfo, /v1/models and the `ready` log line all read the same
// Limits. Tested by tests/server/validate_test.cc and the limits round trip of
// tests/server/server_test.cc and http_api_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/pipeline.h"

namespace flux2::server {

// What the requests of the served model may ask for.
struct Limits {
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
  int64_t max_request_bytes = int64_t{48} << 20;    // a whole request (gRPC message, HTTP body)
  int64_t max_response_bytes = int64_t{4} << 20;    // unary GenerateImage worst-case bound
  int64_t max_sequence_length = 512;                // every request's text-encoder length
  bool uses_cfg = false;                            // the model takes a negative prompt
  bool quality_high_enabled = false;                // --enable-quality-high
  bool fast_paths = true;  // --fast-paths: every request's fast-path switch
  // LoRA adapters (--lora-dir; without it max_loras_per_request is 0 and loras are refused).
  bool lora_enabled = false;
  int64_t max_loras_per_request = 0;
  int64_t max_lora_rank = 256;  // a module of higher rank is refused (--max-lora-rank)
  double max_lora_scale = 8.0;  // |scale| bound
};

// The flags that set limits (flux2_server --help); each may only narrow the model's bound.
struct LimitFlags {
  int64_t max_pixels = 4194304;
  int64_t max_steps = 200;
  int64_t max_images = 4;
  int64_t max_prompt_bytes = 8192;
  int64_t max_reference_images = 4;
  int64_t max_reference_bytes = int64_t{10} << 20;
  int64_t max_request_bytes = int64_t{48} << 20;
  int64_t max_response_bytes = int64_t{4} << 20;
  int64_t max_sequence_length = 512;
  bool enable_quality_high = false;
  bool fast_paths = true;
  bool lora_enabled = false;  // --lora-dir given
  int64_t max_loras_per_request = 4;
  int64_t max_lora_rank = 256;
  double max_lora_scale = 8.0;
};

// The limits of `model` narrowed by `flags`; InvalidArgument naming the flag and both numbers
// when a flag exceeds the model's bound ("--max-sequence-length: 1024 exceeds the model's bound
// of 512").
absl::StatusOr<Limits> resolve_limits(const LimitFlags& flags, const PipelineInfo& model);

// One numeric limit by its name in GetModelInfo.limits (and /v1/models' `limits`).
struct LimitEntry {
  std::string name;  // "max_pixels", ...
  double value;      // integers are exact (all are far below 2^53)
};
// Every numeric limit, in GetModelInfo.limits' field order; queue_depth is the caller's.
std::vector<LimitEntry> limit_entries(const Limits& limits);

}  // namespace flux2::server
