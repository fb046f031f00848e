// The FLUX.2 VAE encoder on the backend, NHWC, in diffusers' module order; see vae_encoder.h.
// Tested by `flux2 check-golden --only vae_encode` (tiny-klein/vae_encode.safetensors).
#include "model/vae_encoder.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2 {

absl::StatusOr<std::unique_ptr<VaeEncoder>> VaeEncoder::load(Backend& backend,
                                                             const ComponentWeights& checkpoint) {
  FLUX_ASSIGN_OR_RETURN(VaeConfig config,
                        VaeConfig::from_json(checkpoint.config(), checkpoint.config_path()));
  std::unique_ptr<VaeEncoder> encoder(new VaeEncoder(backend, std::move(config)));
  const std::vector<WeightSpec> table = encoder->weights_.table(encoder->config_);
  FLUX_ASSIGN_OR_RETURN(encoder->load_report_,
                        load_weights(backend, checkpoint, table, vae_encoder_unused_tensor));
  return encoder;
}

absl::StatusOr<std::unique_ptr<VaeEncoder>> VaeEncoder::create_random(Backend& backend,
                                                                      VaeConfig config,
                                                                      uint64_t seed) {
  std::unique_ptr<VaeEncoder> encoder(new VaeEncoder(backend, std::move(config)));
  const std::vector<WeightSpec> table = encoder->weights_.table(encoder->config_);
  FLUX_ASSIGN_OR_RETURN(encoder->load_report_.device_bytes,
                        allocate_device_weights(backend, table));
  FLUX_RETURN_IF_ERROR(fill_random_weights(backend, table, seed));
  // Variances must be positive: the tokens are divided by sqrt(var + eps).
  const std::vector<float> ones(static_cast<size_t>(encoder->weights_.bn_var.numel()), 1.0f);
  FLUX_RETURN_IF_ERROR(backend.upload(ones.data(), DType::kF32, encoder->weights_.bn_var));
  encoder->load_report_.tensors = static_cast<int64_t>(table.size());
  FLUX_RETURN_IF_ERROR(backend.synchronize());
  return encoder;
}

absl::StatusOr<Tensor> VaeEncoder::encode(const Tensor& image) const {
  const int64_t multiple = config_.scale_factor();
  if (image.rank() != 3 || image.dim(0) <= 0 || image.dim(1) <= 0 || image.dim(0) % multiple != 0 ||
      image.dim(1) % multiple != 0 || image.dim(2) != config_.in_channels) {
    return absl::InvalidArgumentError(absl::StrCat("VAE encode: image ", image.describe(),
                                                   " is not [H, W, ", config_.in_channels,
                                                   "] with sides multiples of ", multiple));
  }
  const VaeEncoderWeights& w = weights_;
  FLUX_ASSIGN_OR_RETURN(Tensor x, layers_.conv(w.conv_in, image));  // [H, W, C_0]
  for (const VaeDownBlockWeights& block : w.down_blocks) {
    for (const VaeResnetWeights& layer : block.resnets) {
      FLUX_ASSIGN_OR_RETURN(x, layers_.resnet(layer, x));  // [H_i, W_i, C_i]
    }
    if (block.has_downsampler) {
      FLUX_ASSIGN_OR_RETURN(x, layers_.downsample(block.downsampler, x));  // [H_i / 2, W_i / 2]
    }
  }
  FLUX_ASSIGN_OR_RETURN(
      x,
      layers_.mid_block(w.mid_resnets, config_.mid_block_add_attention ? &w.mid_attention : nullptr,
                        x));                                                        // [h, w, C_top]
  FLUX_ASSIGN_OR_RETURN(x, layers_.group_norm(w.conv_norm_out, x, /*silu=*/true));  // [h, w, C_top]
  FLUX_ASSIGN_OR_RETURN(x, layers_.conv(w.conv_out, x));                            // [h, w, 2 Cl]
  if (config_.use_quant_conv) {
    FLUX_ASSIGN_OR_RETURN(x, layers_.conv(w.quant_conv, x));  // [h, w, 2 Cl]
  }
  return x;
}

absl::StatusOr<Tensor> VaeEncoder::encode_tokens(const Tensor& image) const {
  FLUX_ASSIGN_OR_RETURN(Tensor moments, encode(image));  // [h8, w8, 2 Cl]
  if (moments.dim(0) % 2 != 0 || moments.dim(1) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("VAE encode: image ", image.describe(),
                                                   " is not a multiple of ",
                                                   2 * config_.scale_factor(), " a side"));
  }
  const int64_t h = moments.dim(0) / 2, w = moments.dim(1) / 2;
  FLUX_ASSIGN_OR_RETURN(Tensor tokens, backend_.empty(backend_.activation_dtype(),
                                                      {h * w, 4 * config_.latent_channels}));
  FLUX_RETURN_IF_ERROR(backend_.latent_pack(moments, weights_.bn_mean, weights_.bn_var,
                                            static_cast<float>(config_.batch_norm_eps),
                                            tokens));  // [h w, 4 Cl]
  return tokens;
}

}  // namespace flux2
