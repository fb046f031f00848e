// The published FLUX.2 transformer shapes (model/README.md, "Published shapes") by name, for
// benchmarks and GPU tests that run the real shapes with random weights, and the per-step FLOP
// accounting they report. Tested by tests/host/flux2_presets_test.cc (published parameter counts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/flux2_config.h"

namespace flux2 {

// "klein-4b", "klein-9b" or "dev"; an unknown name is InvalidArgument listing the known ones.
absl::StatusOr<Flux2Config> flux2_preset(const std::string& name);
std::vector<std::string> flux2_preset_names();

// Transformer parameters of `config` (no biases; the formula in model/README.md).
int64_t flux2_parameter_count(const Flux2Config& config);

struct StepFlops {
  double linear = 0.0;     // GEMM FLOPs actually executed per step (2·M·N·K summed)
  double attention = 0.0;  // 4·S²·D per block
};
// FLOPs of one transformer forward over `image_tokens` + `text_tokens` (modulation and the text
// projection are precomputed per request and not counted).
StepFlops flux2_step_flops(const Flux2Config& config, int64_t image_tokens, int64_t text_tokens);

// The floor of one step in milliseconds: linear 2 x (block parameters) x S at 870 TFLOP/s plus
// attention at 655 TFLOP/s (H200, bf16; model/README.md, "Work per step and the floor").
double flux2_floor_ms(const Flux2Config& config, int64_t image_tokens, int64_t text_tokens);

}  // namespace flux2
