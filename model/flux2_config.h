// Flux2Config: the FLUX.2 transformer's hyper-parameters, read from transformer/config.json
// (diffusers' Flux2Transformer2DModel fields; defaults are FLUX.2-dev, the other published shapes
// are in model/README.md). Tested by tests/host/checkpoint_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace flux2 {

struct Flux2Config {
  int64_t patch_size = 1;                    // latent patch size inside the transformer (always 1)
  int64_t in_channels = 128;                 // packed latent channels: 32 VAE channels x 2x2 patch
  int64_t out_channels = 128;                // null in config.json means in_channels
  int64_t num_layers = 8;                    // double-stream blocks (dev 8, klein-4B 5, klein-9B 8)
  int64_t num_single_layers = 48;            // single-stream blocks (dev 48, klein 20 / 24)
  int64_t attention_head_dim = 128;          // per-head width Dh
  int64_t num_attention_heads = 48;          // H; hidden D = H x Dh (dev 6144, klein-4B 3072)
  int64_t joint_attention_dim = 15360;       // text embedding width J = 3 x text-encoder hidden
  int64_t timestep_guidance_channels = 256;  // sinusoidal embedding width
  double mlp_ratio = 3.0;                    // FFN width F = mlp_ratio x D
  std::vector<int64_t> axes_dims_rope = {32, 32, 32, 32};  // RoPE dims per position axis; sum = Dh
  double rope_theta = 2000.0;                              // RoPE base
  double eps = 1e-6;                                       // LayerNorm and QK RMSNorm epsilon
  bool guidance_embeds = true;  // dev: embedded guidance MLP; klein: none

  int64_t hidden() const { return num_attention_heads * attention_head_dim; }        // D
  int64_t mlp_hidden() const { return static_cast<int64_t>(hidden() * mlp_ratio); }  // F

  // Parses and checks a transformer config.json; `source` names it in errors.
  static absl::StatusOr<Flux2Config> from_json(const nlohmann::json& json,
                                               const std::string& source);
  // One line for logs: "FLUX.2 transformer: 5 double + 20 single blocks, 24 heads x 128 ...".
  std::string summary() const;
};

}  // namespace flux2
