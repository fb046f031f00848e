// The VAE's shared building blocks on the backend; see vae_layers.h.
// Tested through the VAE goldens (`flux2 check-golden --only vae`, `--only vae_encode`).
#include "model/vae_layers.h"

#include <cmath>

#include "kernels/base/status.h"

namespace flux2 {
namespace {

constexpr float kGroupNormEps = 1e-6f;  // every GroupNorm of the VAE (resnet_eps, conv_norm_out)

}  // namespace

absl::StatusOr<Tensor> VaeLayers::image(int64_t height, int64_t width, int64_t channels) const {
  return backend_.empty(backend_.activation_dtype(), {height, width, channels});
}

absl::StatusOr<Tensor> VaeLayers::conv(const VaeConvWeights& w, const Tensor& x) const {
  FLUX_ASSIGN_OR_RETURN(Tensor out, image(x.dim(0), x.dim(1), w.weight.dim(0)));
  FLUX_RETURN_IF_ERROR(backend_.conv2d(x, w.weight, w.bias, out));
  return out;
}

absl::StatusOr<Tensor> VaeLayers::downsample(const VaeConvWeights& w, const Tensor& x) const {
  FLUX_ASSIGN_OR_RETURN(Tensor out, image(x.dim(0) / 2, x.dim(1) / 2, w.weight.dim(0)));
  FLUX_RETURN_IF_ERROR(backend_.conv2d_downsample(x, w.weight, w.bias, out));
  return out;
}

absl::StatusOr<Tensor> VaeLayers::group_norm(const VaeGroupNormWeights& w, const Tensor& x,
                                             bool silu) const {
  FLUX_ASSIGN_OR_RETURN(Tensor out, image(x.dim(0), x.dim(1), x.dim(2)));
  FLUX_RETURN_IF_ERROR(backend_.group_norm(x, groups_, w.gamma, w.beta, kGroupNormEps, silu, out));
  return out;
}

absl::StatusOr<Tensor> VaeLayers::resnet(const VaeResnetWeights& w, const Tensor& x) const {
  FLUX_ASSIGN_OR_RETURN(Tensor h, group_norm(w.norm1, x, /*silu=*/true));  // [H, W, Cin]
  FLUX_ASSIGN_OR_RETURN(h, conv(w.conv1, h));                              // [H, W, Cout]
  FLUX_ASSIGN_OR_RETURN(h, group_norm(w.norm2, h, /*silu=*/true));         // [H, W, Cout]
  Tensor shortcut = x;                                                     // [H, W, Cin = Cout]
  if (w.conv_shortcut.weight.data() != nullptr) {
    FLUX_ASSIGN_OR_RETURN(shortcut, conv(w.conv_shortcut, x));  // [H, W, Cout]
  }
  const int64_t cout = w.conv2.weight.dim(0);
  FLUX_ASSIGN_OR_RETURN(Tensor out, image(h.dim(0), h.dim(1), cout));
  // [H, W, Cout] = shortcut + conv2(h), one op (fused at quality=high on CUDA)
  FLUX_RETURN_IF_ERROR(backend_.conv2d_add(h, w.conv2.weight, w.conv2.bias, shortcut, out));
  return out;
}

absl::StatusOr<Tensor> VaeLayers::attention(const VaeAttentionWeights& w, const Tensor& x) const {
  Backend& be = backend_;
  const int64_t height = x.dim(0), width = x.dim(1), c = x.dim(2), pixels = height * width;
  const AttentionParams params{/*num_heads=*/1, /*num_kv_heads=*/1, /*head_dim=*/c,
                               static_cast<float>(1.0 / std::sqrt(static_cast<double>(c)))};
  FLUX_ASSIGN_OR_RETURN(Tensor normed, group_norm(w.group_norm, x, /*silu=*/false));  // [H, W, C]
  FLUX_ASSIGN_OR_RETURN(Tensor qkv, be.empty(be.activation_dtype(), {pixels, 3 * c}));
  FLUX_RETURN_IF_ERROR(be.linear(normed, w.qkv_weight, w.qkv_bias, qkv));  // [P, 3C]
  FLUX_ASSIGN_OR_RETURN(Tensor attended, be.empty(be.activation_dtype(), {pixels, c}));
  FLUX_RETURN_IF_ERROR(be.attention(qkv.col_slice(0, c), qkv.col_slice(c, c),
                                    qkv.col_slice(2 * c, c), params, attended));  // [P, C]
  FLUX_ASSIGN_OR_RETURN(Tensor projected, image(height, width, c));
  FLUX_RETURN_IF_ERROR(be.linear(attended, w.out_weight, w.out_bias, projected));  // [H, W, C]
  FLUX_ASSIGN_OR_RETURN(Tensor out, image(height, width, c));
  FLUX_RETURN_IF_ERROR(be.add(x, projected, out));  // [H, W, C]
  return out;
}

absl::StatusOr<Tensor> VaeLayers::mid_block(const VaeResnetWeights (&resnets)[2],
                                            const VaeAttentionWeights* attention_weights,
                                            const Tensor& x) const {
  FLUX_ASSIGN_OR_RETURN(Tensor out, resnet(resnets[0], x));  // [h, w, C_top]
  if (attention_weights != nullptr) {
    FLUX_ASSIGN_OR_RETURN(out, attention(*attention_weights, out));  // [h, w, C_top]
  }
  return resnet(resnets[1], out);  // [h, w, C_top]
}

}  // namespace flux2
