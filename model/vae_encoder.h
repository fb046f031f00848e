// The FLUX.2 VAE encoder (the encoder half of AutoencoderKLFlux2) on the backend,
// NHWC: conv_in, down blocks (resnets, stride-2 downsampling), mid block (resnet, single-head
// attention, resnet), GroupNorm + SiLU, conv_out, quant_conv -> the posterior's mean | logvar; and
// the editing pipeline's reference tokens (mean, patchify 2x2, BatchNorm normalisation, pack).
// Tested by `flux2 check-golden --only vae_encode` (tiny-klein/vae_encode.safetensors).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/checkpoint.h"
#include "model/vae_decoder.h"
#include "model/vae_layers.h"
#include "model/vae_weights.h"

namespace flux2 {

class VaeEncoder {
 public:
  // Loads the encoder half (and bn.*, quant_conv) of `checkpoint` (vae/); the decoder's tensors
  // are left unread.
  static absl::StatusOr<std::unique_ptr<VaeEncoder>> load(Backend& backend,
                                                          const ComponentWeights& checkpoint);
  // The encoder of `config` with reproducible random weights (positive BatchNorm variances), for
  // `flux2 bench --e2e --references N`.
  static absl::StatusOr<std::unique_ptr<VaeEncoder>> create_random(Backend& backend,
                                                                   VaeConfig config, uint64_t seed);

  const VaeConfig& config() const { return config_; }
  int64_t device_bytes() const { return load_report_.device_bytes; }

  // vae.encode's moments: image [H, W, in_channels] in [-1, 1] (H, W multiples of the scale
  // factor) -> [H / 8, W / 8, 2 x latent_channels], the posterior's mean then its log-variance.
  absl::StatusOr<Tensor> encode(const Tensor& image) const;
  // The editing pipeline's reference tokens: encode, the mean (argmax, no sampling), patchify 2x2,
  // (z - bn_mean) / sqrt(bn_var + eps), packed -> [(H / 16) x (W / 16), 4 x latent_channels].
  absl::StatusOr<Tensor> encode_tokens(const Tensor& image) const;

 private:
  VaeEncoder(Backend& backend, VaeConfig config) : backend_(backend), config_(std::move(config)) {}

  Backend& backend_;
  VaeConfig config_;
  VaeLayers layers_{backend_, config_.norm_num_groups};
  VaeEncoderWeights weights_;
  LoadReport load_report_;
};

}  // namespace flux2
