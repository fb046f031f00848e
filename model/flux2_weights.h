// Flux2Weights: the FLUX.2 transformer's parameters on a backend, one typed member per use, and
// the tensor table that maps diffusers checkpoint names onto them. Projections that
// run on the same input are fused along rows at load (q|k|v). The blocks' projections are Weights:
// the table marks them FP8-eligible, and quality=high keeps their low-precision copies there (the
// embedders, modulation and output projection stay bf16). Tested by
// tests/host/checkpoint_test.cc.
#pragma once

#include <vector>

#include "model/flux2_config.h"
#include "model/weight_loader.h"

namespace flux2 {

struct Flux2DoubleBlockWeights {  // transformer_blocks.{i}
  Weight img_qkv;                 // [3D, D]  attn.to_q | to_k | to_v
  Weight txt_qkv;                 // [3D, D]  attn.add_q_proj | add_k_proj | add_v_proj
  Tensor img_norm_q;              // [Dh]     attn.norm_q
  Tensor img_norm_k;              // [Dh]     attn.norm_k
  Tensor txt_norm_q;              // [Dh]     attn.norm_added_q
  Tensor txt_norm_k;              // [Dh]     attn.norm_added_k
  Weight img_out;                 // [D, D]   attn.to_out.0
  Weight txt_out;                 // [D, D]   attn.to_add_out
  Weight img_ff_in;               // [2F, D]  ff.linear_in (gate | up)
  Weight img_ff_out;              // [D, F]   ff.linear_out
  Weight txt_ff_in;               // [2F, D]  ff_context.linear_in
  Weight txt_ff_out;              // [D, F]   ff_context.linear_out
};

struct Flux2SingleBlockWeights {  // single_transformer_blocks.{j}
  Weight qkv_mlp;  // [3D + 2F, D]  attn.to_qkv_mlp_proj: q | k | v | mlp gate | mlp up
  Weight out;      // [D, D + F]    attn.to_out: attention columns, then MLP columns
  Tensor norm_q;   // [Dh]          attn.norm_q
  Tensor norm_k;   // [Dh]          attn.norm_k
};

struct Flux2Weights {
  Tensor x_embedder;         // [D, in_channels]
  Tensor context_embedder;   // [D, J]
  Tensor time_linear_1;      // [D, 256]  time_guidance_embed.timestep_embedder.linear_1
  Tensor time_linear_2;      // [D, D]    .linear_2
  Tensor guidance_linear_1;  // [D, 256]  time_guidance_embed.guidance_embedder.linear_1 (dev only)
  Tensor guidance_linear_2;  // [D, D]    .linear_2 (dev only)
  // The three shared modulations and the final norm, fused along rows since they all read
  // silu(temb): double_stream_modulation_img [6D] | double_stream_modulation_txt [6D] |
  // single_stream_modulation [3D] | norm_out (scale, shift) [2D]
  Tensor modulation;  // [17D, D]
  Tensor proj_out;    // [out_channels, D]
  std::vector<Flux2DoubleBlockWeights> double_blocks;
  std::vector<Flux2SingleBlockWeights> single_blocks;

  // The tensor table for `config` (resizes the block vectors; targets point into *this).
  std::vector<WeightSpec> table(const Flux2Config& config);
};

// Column offsets inside one row of the fused modulation output [17D]: the image and text
// streams' 6D, the single blocks' 3D and norm_out's 2D, each in diffusers' chunk order
// (model/README.md, "Modulation").
struct Flux2ModulationLayout {
  explicit Flux2ModulationLayout(int64_t hidden) : d(hidden) {}
  int64_t d;
  int64_t img(int chunk) const { return chunk * d; }  // shift, scale, gate (msa, mlp)
  int64_t txt(int chunk) const { return (6 + chunk) * d; }
  int64_t single(int chunk) const { return (12 + chunk) * d; }  // shift, scale, gate
  int64_t out_scale() const { return 15 * d; }                  // norm_out: scale first
  int64_t out_shift() const { return 16 * d; }
  int64_t width() const { return 17 * d; }
};

}  // namespace flux2
