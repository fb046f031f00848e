// ModelLimits: the hard bounds a pipeline puts on a request (PipelineInfo::hard_limits;
// Pipeline::check refuses beyond them), and the model-independent ones as constants, so a server
// can refuse a flag beyond them at start-up, before a model loads. Tested by
// tests/host/pipeline_test.cc (ModelLimits*).
#pragma once

#include <cstdint>

namespace flux2 {

// num_inference_steps and guidance_scale: generous bounds that keep a request finite.
inline constexpr int64_t kMaxInferenceSteps = 200;
inline constexpr double kMaxGuidanceScale = 100.0;

// Text-encoder tokens per prompt: diffusers' max_sequence_length default for the FLUX.2
// pipelines, which every pipeline here serves as its bound.
inline constexpr int64_t kMaxSequenceLength = 512;

// Image tokens (one per 2x2 patch of VAE latents: 16 x 16 pixels for every FLUX.2 VAE). Nothing
// in the pipeline is sized for a largest image: shapes are int64, position ids and RoPE angles
// (float64, model/rope.h) are exact far beyond, and the CUDA element-wise launches switch to
// 64-bit indices past 2^31 items (kernels/cuda/launch.cuh); memory runs out first, per request (the
// memory plan reserves working memory for 1024 x 1024 only: model/memory_plan.h). The one
// arithmetic bound is the schedule's: past 4300 tokens diffusers' empirical mu is 0.00016927 n +
// 0.45666666, and make_schedule (model/scheduler.cc) takes float(exp(mu)), which overflows to
// inf, making every sigma NaN, past n = 521451 (mu > ln(FLT_MAX) = 88.7228). The
// schedule degenerates long before: at 4096 x 4096 (65536 tokens) every sigma of 4 or 50 steps is
// within 5e-4 of 1, and from 131072 tokens (8192 x 4096) on all are 1.0f but the final 0, so all
// the denoising happens in the last step (tests/host/pipeline_test.cc measures both ends).
inline constexpr int64_t kMaxImageTokens = 521451;
inline constexpr int64_t kTokenPixels = 16 * 16;  // pixels per image token (pixel multiple 16)
// width x height at 16 x 16 pixels a token: 133491456 (11552 x 11552 fits).
inline constexpr int64_t kMaxImagePixels = kMaxImageTokens * kTokenPixels;

// What a loaded pipeline accepts at most; a server's limits may only narrow these.
struct ModelLimits {
  int64_t max_steps = kMaxInferenceSteps;   // num_inference_steps in 1..max_steps (0: default)
  double max_guidance = kMaxGuidanceScale;  // guidance_scale in 0..max_guidance (< 0: default)
  int64_t pixel_multiple = 16;              // width and height: positive multiples of this
  int64_t max_sequence_length = kMaxSequenceLength;  // max_sequence_length in 1..this (0: default)
  // width x height: kMaxImageTokens tokens of pixel_multiple² pixels (kMaxImagePixels at 16).
  int64_t max_pixels = kMaxImagePixels;
};

}  // namespace flux2
