// The FLUX.2 VAE decoder (AutoencoderKLFlux2; model/README.md, "VAE") on the backend, NHWC:
// BatchNorm de-normalisation + unpatchify, post_quant_conv, conv_in, mid block (resnet,
// single-head attention, resnet), up blocks, GroupNorm + SiLU, conv_out; and the diffusers
// post-processing to uint8. Tested by `flux2 check-golden --only vae` and tests/host/vae_test.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/checkpoint.h"
#include "nlohmann/json.hpp"

namespace flux2 {

struct VaeConfig {
  // The decoder's channels (decoder_block_out_channels when the checkpoint has them), encoder
  // order; the decoder reverses them.
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  std::vector<int64_t> encoder_block_out_channels = {128, 256, 512, 512};  // block_out_channels
  int64_t in_channels = 3;       // image channels the encoder reads
  int64_t layers_per_block = 2;  // decoder up blocks have layers_per_block + 1 resnets
  int64_t latent_channels = 32;
  int64_t norm_num_groups = 32;
  int64_t out_channels = 3;
  double batch_norm_eps = 1e-4;  // latent BatchNorm statistics epsilon
  bool mid_block_add_attention = true;
  bool use_post_quant_conv = true;
  bool use_quant_conv = true;    // the encoder's 1x1 convolution over mean | logvar
  int64_t scale_factor() const;  // 2^(len(block_out_channels) - 1): 8 for the real VAE

  static absl::StatusOr<VaeConfig> from_json(const nlohmann::json& json, const std::string& source);
};

class VaeDecoder {
 public:
  // Loads the decoder half (and bn.*, post_quant_conv) of `checkpoint` (vae/); encoder tensors
  // are left unread.
  static absl::StatusOr<std::unique_ptr<VaeDecoder>> load(Backend& backend,
                                                          const ComponentWeights& checkpoint);
  // The decoder of `config` with reproducible random weights (positive BatchNorm variances), for
  // `flux2 bench --e2e`.
  static absl::StatusOr<std::unique_ptr<VaeDecoder>> create_random(Backend& backend,
                                                                   VaeConfig config, uint64_t seed);
  virtual ~VaeDecoder() = default;

  virtual const VaeConfig& config() const = 0;
  virtual int64_t device_bytes() const = 0;

  // vae.decode: latents [h8, w8, latent_channels] (NHWC, already de-normalised and unpatchified)
  // -> image [8 h8, 8 w8, 3] in about [-1, 1].
  virtual absl::StatusOr<Tensor> decode(const Tensor& latents) const = 0;
  // The pipeline's decode: packed tokens [h x w, 4 x latent_channels] of an h x w token grid
  // -> BatchNorm de-normalisation -> unpatchify -> decode -> image [16 h, 16 w, 3].
  virtual absl::StatusOr<Tensor> decode_tokens(const Tensor& tokens, int64_t h,
                                               int64_t w) const = 0;
};

// diffusers' post-processing of an image [H, W, 3] (HWC floats in [-1, 1]):
// round(clamp(x / 2 + 0.5, 0, 1) x 255) as uint8, HWC.
std::vector<uint8_t> image_to_u8(std::span<const float> image);

}  // namespace flux2
