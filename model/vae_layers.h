// The building blocks the FLUX.2 VAE encoder and decoder share (diffusers' ResnetBlock2D, the mid
// block's single-head attention, convolutions and GroupNorm), NHWC on the backend.
// Tested through the VAE goldens: `flux2 check-golden --only vae` and `--only vae_encode`.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/vae_weights.h"

namespace flux2 {

class VaeLayers {
 public:
  VaeLayers(Backend& backend, int64_t groups) : backend_(backend), groups_(groups) {}

  // Each returns a fresh [H', W', C'] tensor in the activation dtype; the input is left untouched.
  absl::StatusOr<Tensor> image(int64_t height, int64_t width, int64_t channels) const;
  // nn.Conv2d, stride 1, padding k / 2.
  absl::StatusOr<Tensor> conv(const VaeConvWeights& w, const Tensor& x) const;
  // Downsample2D (padding 0): zero row and column appended at the bottom and right, then a 3x3
  // convolution with stride 2: [H, W, C] -> [H / 2, W / 2, C'].
  absl::StatusOr<Tensor> downsample(const VaeConvWeights& w, const Tensor& x) const;
  // nn.GroupNorm(groups, C, eps 1e-6), then SiLU when `silu`.
  absl::StatusOr<Tensor> group_norm(const VaeGroupNormWeights& w, const Tensor& x, bool silu) const;
  // ResnetBlock2D: x + conv2(silu(gn2(conv1(silu(gn1(x)))))), x through the 1x1 shortcut when the
  // channel count changes.
  absl::StatusOr<Tensor> resnet(const VaeResnetWeights& w, const Tensor& x) const;
  // The mid block's attention: x + to_out(attention(q, k, v)) over the H x W pixels as tokens, one
  // head of width C, q|k|v = linear(GroupNorm(x)) with biases, scale 1 / sqrt(C).
  absl::StatusOr<Tensor> attention(const VaeAttentionWeights& w, const Tensor& x) const;
  // UNetMidBlock2D: resnet, attention (when the weights have one), resnet.
  absl::StatusOr<Tensor> mid_block(const VaeResnetWeights (&resnets)[2],
                                   const VaeAttentionWeights* attention, const Tensor& x) const;

 private:
  Backend& backend_;
  int64_t groups_;
};

}  // namespace flux2
