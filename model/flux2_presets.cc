// Published FLUX.2 shapes and FLOP accounting; see flux2_presets.h.
#include "model/flux2_presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flux2 {
namespace {

// Ceilings measured alone on the H200 (TFLOP/s): cuBLASLt bf16 GEMMs at FLUX.2 shapes (810-910,
// mean about 870) and cuDNN's fused SDPA, head_dim 128, 4608 tokens (653-661).
constexpr double kGemmTflops = 870.0;
constexpr double kAttentionTflops = 655.0;

}  // namespace

std::vector<std::string> flux2_preset_names() {
  return {"klein-4b", "klein-9b", "dev"};
}

absl::StatusOr<Flux2Config> flux2_preset(const std::string& name) {
  Flux2Config config;  // defaults are FLUX.2-dev
  if (name == "dev") return config;
  config.guidance_embeds = false;
  if (name == "klein-4b") {
    config.num_layers = 5;
    config.num_single_layers = 20;
    config.num_attention_heads = 24;
    config.joint_attention_dim = 7680;
    return config;
  }
  if (name == "klein-9b") {
    config.num_layers = 8;
    config.num_single_layers = 24;
    config.num_attention_heads = 32;
    config.joint_attention_dim = 12288;
    return config;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model \"", name, "\" (known: ", absl::StrJoin(flux2_preset_names(), ", "), ")"));
}

int64_t flux2_parameter_count(const Flux2Config& c) {
  const int64_t d = c.hidden(), j = c.joint_attention_dim, t = c.timestep_guidance_channels;
  const int64_t dh = c.attention_head_dim;
  const int64_t double_block = 26 * d * d + 4 * dh;  // q,k,v,out x2 streams + FFs; 4 norm vectors
  const int64_t single_block = 13 * d * d + 2 * dh;
  int64_t top =
      c.in_channels * d + j * d + (t * d + d * d) + 15 * d * d + 2 * d * d + d * c.out_channels;
  if (c.guidance_embeds) top += t * d + d * d;
  return top + c.num_layers * double_block + c.num_single_layers * single_block;
}

StepFlops flux2_step_flops(const Flux2Config& c, int64_t image_tokens, int64_t text_tokens) {
  const double d = static_cast<double>(c.hidden()), f = static_cast<double>(c.mlp_hidden());
  const double s = static_cast<double>(image_tokens + text_tokens),
               n = static_cast<double>(image_tokens);
  const double blocks = static_cast<double>(c.num_layers + c.num_single_layers);
  StepFlops flops;
  // Every token of every block goes through q|k|v, out, FF in and FF out (double blocks per stream;
  // single blocks through the fused [3D+2F] and [D+F] projections): 2·S·(4D² + 3FD) per block.
  flops.linear = blocks * 2.0 * s * (4.0 * d * d + 3.0 * f * d) +
                 2.0 * n * static_cast<double>(c.in_channels) * d +
                 2.0 * n * d * static_cast<double>(c.out_channels);
  flops.attention = blocks * 4.0 * s * s * d;
  return flops;
}

double flux2_floor_ms(const Flux2Config& c, int64_t image_tokens, int64_t text_tokens) {
  const double d = static_cast<double>(c.hidden()),
               s = static_cast<double>(image_tokens + text_tokens);
  const double block_parameters = static_cast<double>(c.num_layers) * 26.0 * d * d +
                                  static_cast<double>(c.num_single_layers) * 13.0 * d * d;
  const double linear = 2.0 * block_parameters * s;
  const double attention =
      static_cast<double>(c.num_layers + c.num_single_layers) * 4.0 * s * s * d;
  return 1e3 * (linear / (kGemmTflops * 1e12) + attention / (kAttentionTflops * 1e12));
}

}  // namespace flux2
