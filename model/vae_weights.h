// VaeWeights: the FLUX.2 VAE decoder's parameters on a backend (model/README.md, "VAE") and the
// tensor table mapping diffusers checkpoint names onto them. Convolutions are stored
// [O, kh, kw, I] for the NHWC conv2d; the mid attention's q|k|v are fused along rows at load.
// Tested by tests/host/vae_test.cc (weight-table errors) and `flux2 check-golden --only vae`.
#pragma once

#include <vector>

#include "absl/strings/string_view.h"
#include "model/vae_decoder.h"
#include "model/weight_loader.h"

namespace flux2 {

struct VaeGroupNormWeights {  // nn.GroupNorm(groups, C, eps 1e-6, affine)
  Tensor gamma;               // [C]  .weight
  Tensor beta;                // [C]  .bias
};

struct VaeConvWeights {  // nn.Conv2d, stride 1, padding k / 2, with bias
  Tensor weight;         // [O, k, k, I]  .weight ([O, I, k, k] in the checkpoint)
  Tensor bias;           // [O]           .bias
};

struct VaeResnetWeights {        // ResnetBlock2D without time embedding
  VaeGroupNormWeights norm1;     // [Cin]
  VaeConvWeights conv1;          // 3x3 Cin -> Cout
  VaeGroupNormWeights norm2;     // [Cout]
  VaeConvWeights conv2;          // 3x3 Cout -> Cout
  VaeConvWeights conv_shortcut;  // 1x1 Cin -> Cout, only when Cin != Cout (else undefined)
};

struct VaeAttentionWeights {       // mid_block.attentions.0: one head of width C
  VaeGroupNormWeights group_norm;  // [C]
  Tensor qkv_weight;               // [3C, C]  to_q | to_k | to_v
  Tensor qkv_bias;                 // [3C]
  Tensor out_weight;               // [C, C]   to_out.0
  Tensor out_bias;                 // [C]
};

struct VaeUpBlockWeights {                // decoder.up_blocks.{i} (UpDecoderBlock2D)
  std::vector<VaeResnetWeights> resnets;  // layers_per_block + 1
  bool has_upsampler = false;             // every up block but the last
  VaeConvWeights upsampler;               // upsamplers.0.conv: 3x3 after nearest x2
};

struct VaeWeights {
  Tensor bn_mean;                   // [4 x latent_channels]  bn.running_mean (packed channels)
  Tensor bn_var;                    // [4 x latent_channels]  bn.running_var
  VaeConvWeights post_quant_conv;   // 1x1 latent -> latent (when use_post_quant_conv)
  VaeConvWeights conv_in;           // decoder.conv_in: 3x3 latent -> C_top
  VaeResnetWeights mid_resnets[2];  // decoder.mid_block.resnets.{0,1} at C_top
  VaeAttentionWeights
      mid_attention;  // decoder.mid_block.attentions.0 (when mid_block_add_attention)
  std::vector<VaeUpBlockWeights> up_blocks;  // C_top first (block_out_channels reversed)
  VaeGroupNormWeights conv_norm_out;         // [block_out_channels[0]]
  VaeConvWeights conv_out;                   // 3x3 block_out_channels[0] -> out_channels

  // The tensor table for `config` (resizes up_blocks; targets point into *this).
  std::vector<WeightSpec> table(const VaeConfig& config);
};

struct VaeDownBlockWeights {              // encoder.down_blocks.{i} (DownEncoderBlock2D)
  std::vector<VaeResnetWeights> resnets;  // layers_per_block
  bool has_downsampler = false;           // every down block but the last
  VaeConvWeights downsampler;             // downsamplers.0.conv: 3x3, stride 2, padding (0,1,0,1)
};

// The encoder half: conv_in, down blocks, mid block, GroupNorm + SiLU,
// conv_out to mean | logvar, quant_conv; and the latent BatchNorm statistics.
struct VaeEncoderWeights {
  Tensor bn_mean;                                // [4 x latent_channels]  bn.running_mean
  Tensor bn_var;                                 // [4 x latent_channels]  bn.running_var
  VaeConvWeights conv_in;                        // encoder.conv_in: 3x3 in_channels -> C_0
  std::vector<VaeDownBlockWeights> down_blocks;  // C_0 first
  VaeResnetWeights mid_resnets[2];               // encoder.mid_block.resnets.{0,1} at C_top
  VaeAttentionWeights mid_attention;             // encoder.mid_block.attentions.0
  VaeGroupNormWeights conv_norm_out;             // [C_top]
  VaeConvWeights conv_out;                       // 3x3 C_top -> 2 x latent_channels
  VaeConvWeights quant_conv;                     // 1x1 2 x latent -> 2 x latent (use_quant_conv)

  std::vector<WeightSpec> table(const VaeConfig& config);
};

// Checkpoint tensors the encoder leaves unread: the decoder, post_quant_conv and the BatchNorm's
// num_batches_tracked counter.
bool vae_encoder_unused_tensor(absl::string_view name);

// Checkpoint tensors the decoder leaves unread: the encoder, quant_conv and the BatchNorm's
// num_batches_tracked counter.
bool vae_unused_tensor(absl::string_view name);

}  // namespace flux2
