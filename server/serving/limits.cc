// The limits table; see limits.h. Tested by tests/server/validate_test.cc.
#include "server/serving/limits.h"

#include "absl/strings/str_cat.h"

namespace flux2::server {
namespace {

absl::Status beyond_bound(const char* flag, int64_t value, int64_t bound, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": ", value, " exceeds ", what, " of ", bound));
}

}  // namespace

absl::StatusOr<Limits> resolve_limits(const LimitFlags& flags, const PipelineInfo& model) {
  const ModelLimits& bounds = model.hard_limits;
  if (flags.max_steps > bounds.max_steps) {
    return beyond_bound("--max-steps", flags.max_steps, bounds.max_steps,
                        "the pipeline's step bound");
  }
  if (flags.max_pixels > bounds.max_pixels) {
    return beyond_bound("--max-pixels", flags.max_pixels, bounds.max_pixels,
                        "the pipeline's pixel bound");
  }
  if (flags.max_sequence_length > model.max_sequence_length) {
    return beyond_bound("--max-sequence-length", flags.max_sequence_length,
                        model.max_sequence_length,
                        absl::StrCat(model.model_name, "'s sequence-length bound"));
  }
  Limits limits;
  limits.pixel_multiple = model.pixel_multiple;
  limits.max_pixels = flags.max_pixels;
  limits.max_steps = flags.max_steps;
  limits.default_steps = model.default_steps;
  limits.min_guidance = 0.0;
  limits.max_guidance = bounds.max_guidance;
  limits.max_images = flags.max_images;
  limits.max_prompt_bytes = flags.max_prompt_bytes;
  limits.max_reference_images = flags.max_reference_images;
  limits.max_reference_bytes = flags.max_reference_bytes;
  limits.max_request_bytes = flags.max_request_bytes;
  limits.max_response_bytes = flags.max_response_bytes;
  limits.max_sequence_length = flags.max_sequence_length;
  limits.uses_cfg = model.uses_cfg;
  limits.quality_high_enabled = flags.enable_quality_high && model.quality_high;
  limits.fast_paths = flags.fast_paths;
  limits.lora_enabled = flags.lora_enabled;
  limits.max_loras_per_request = flags.lora_enabled ? flags.max_loras_per_request : 0;
  limits.max_lora_rank = flags.max_lora_rank;
  limits.max_lora_scale = flags.max_lora_scale;
  return limits;
}

std::vector<LimitEntry> limit_entries(const Limits& limits) {
  const auto n = [](int64_t value) { return static_cast<double>(value); };
  return {
      {"pixel_multiple", n(limits.pixel_multiple)},
      {"max_pixels", n(limits.max_pixels)},
      {"max_steps", n(limits.max_steps)},
      {"min_guidance", limits.min_guidance},
      {"max_guidance", limits.max_guidance},
      {"max_images", n(limits.max_images)},
      {"max_prompt_bytes", n(limits.max_prompt_bytes)},
      {"max_sequence_length", n(limits.max_sequence_length)},
      {"max_reference_images", n(limits.max_reference_images)},
      {"max_reference_bytes", n(limits.max_reference_bytes)},
      {"max_request_bytes", n(limits.max_request_bytes)},
      {"max_response_bytes", n(limits.max_response_bytes)},
      {"max_loras_per_request", n(limits.max_loras_per_request)},
      {"max_lora_rank", n(limits.max_lora_rank)},
      {"max_lora_scale", limits.max_lora_scale},
  };
}

}  // namespace flux2::server
