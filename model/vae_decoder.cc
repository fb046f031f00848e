// The FLUX.2 VAE decoder on the backend, NHWC, in diffusers' module order; see vae_decoder.h.
// Tested by `flux2 check-golden --only vae` (tiny-klein/vae_decode.safetensors) and
// tests/host/vae_test.cc (config and weight-table errors, decode_tokens, image_to_u8).
#include "model/vae_decoder.h"

#include "kernels/base/postprocess.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status.h"
#include "model/json_util.h"
#include "model/vae_weights.h"

namespace flux2 {
namespace {

constexpr float kGroupNormEps =
    1e-6f;                     // every GroupNorm of the decoder (resnet_eps, conv_norm_out)
constexpr int64_t kPatch = 2;  // latent patchify 2x2: packed channels = 4 x latent_channels

class BackendVaeDecoder final : public VaeDecoder {
 public:
  BackendVaeDecoder(Backend& backend, VaeConfig config)
      : backend_(backend), config_(std::move(config)) {}

  const VaeConfig& config() const override { return config_; }
  int64_t device_bytes() const override { return load_report_.device_bytes; }
  absl::StatusOr<Tensor> decode(const Tensor& latents) const override;
  absl::StatusOr<Tensor> decode_tokens(const Tensor& tokens, int64_t h, int64_t w) const override;

  absl::Status fill_random(uint64_t seed) {
    const std::vector<WeightSpec> table = weights_.table(config_);
    FLUX_ASSIGN_OR_RETURN(load_report_.device_bytes, allocate_weights(backend_, table));
    FLUX_RETURN_IF_ERROR(fill_random_weights(backend_, table, seed));
    // Variances must be positive: sqrt(var + eps) de-normalises the latents.
    const std::vector<float> ones(static_cast<size_t>(weights_.bn_var.numel()), 1.0f);
    FLUX_RETURN_IF_ERROR(backend_.upload(ones.data(), DType::kF32, weights_.bn_var));
    load_report_.tensors = static_cast<int64_t>(table.size());
    return backend_.synchronize();
  }

  absl::Status load_weights_from(const ComponentWeights& checkpoint) {
    const std::vector<WeightSpec> table = weights_.table(config_);
    FLUX_ASSIGN_OR_RETURN(load_report_,
                          load_weights(backend_, checkpoint, table, vae_unused_tensor));
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<Tensor> image(int64_t height, int64_t width, int64_t channels) const {
    return backend_.empty(backend_.activation_dtype(), {height, width, channels});
  }
  // Each returns a fresh [H', W', C'] tensor; the input is left untouched.
  absl::StatusOr<Tensor> conv(const VaeConvWeights& w, const Tensor& x) const;
  absl::StatusOr<Tensor> group_norm(const VaeGroupNormWeights& w, const Tensor& x, bool silu) const;
  absl::StatusOr<Tensor> resnet(const VaeResnetWeights& w, const Tensor& x) const;
  absl::StatusOr<Tensor> attention(const VaeAttentionWeights& w, const Tensor& x) const;
  absl::StatusOr<Tensor> upsample(const VaeConvWeights& w, const Tensor& x) const;

  Backend& backend_;
  VaeConfig config_;
  VaeWeights weights_;
  LoadReport load_report_;
};

absl::StatusOr<Tensor> BackendVaeDecoder::conv(const VaeConvWeights& w, const Tensor& x) const {
  FLUX_ASSIGN_OR_RETURN(Tensor out, image(x.dim(0), x.dim(1), w.weight.dim(0)));
  FLUX_RETURN_IF_ERROR(backend_.conv2d(x, w.weight, w.bias, out));
  return out;
}

absl::StatusOr<Tensor> BackendVaeDecoder::group_norm(const VaeGroupNormWeights& w, const Tensor& x,
                                                     bool silu) const {
  FLUX_ASSIGN_OR_RETURN(Tensor out, image(x.dim(0), x.dim(1), x.dim(2)));
  FLUX_RETURN_IF_ERROR(
      backend_.group_norm(x, config_.norm_num_groups, w.gamma, w.beta, kGroupNormEps, silu, out));
  return out;
}

// ResnetBlock2D: x + conv2(silu(gn2(conv1(silu(gn1(x)))))), x through the 1x1 shortcut when
// the channel count changes.
absl::StatusOr<Tensor> BackendVaeDecoder::resnet(const VaeResnetWeights& w, const Tensor& x) const {
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

// The mid block's attention: x + to_out(attention(q, k, v)) over the H x W pixels as tokens,
// one head of width C, q|k|v = linear(GroupNorm(x)) with biases, scale 1 / sqrt(C).
absl::StatusOr<Tensor> BackendVaeDecoder::attention(const VaeAttentionWeights& w,
                                                    const Tensor& x) const {
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

// Upsample2D: nearest-neighbour x2, then a 3x3 convolution.
absl::StatusOr<Tensor> BackendVaeDecoder::upsample(const VaeConvWeights& w, const Tensor& x) const {
  FLUX_ASSIGN_OR_RETURN(Tensor up, image(2 * x.dim(0), 2 * x.dim(1), x.dim(2)));
  FLUX_RETURN_IF_ERROR(backend_.upsample_nearest_2x(x, up));  // [2H, 2W, C]
  return conv(w, up);                                         // [2H, 2W, C]
}

absl::StatusOr<Tensor> BackendVaeDecoder::decode(const Tensor& latents) const {
  if (latents.rank() != 3 || latents.dim(0) <= 0 || latents.dim(1) <= 0 ||
      latents.dim(2) != config_.latent_channels) {
    return absl::InvalidArgumentError(absl::StrCat("VAE decode: latents ", latents.describe(),
                                                   " are not [h, w, ", config_.latent_channels,
                                                   "]"));
  }
  const VaeWeights& w = weights_;
  Tensor x = latents;  // [h, w, Cl]
  if (config_.use_post_quant_conv) {
    FLUX_ASSIGN_OR_RETURN(x, conv(w.post_quant_conv, x));  // [h, w, Cl]
  }
  FLUX_ASSIGN_OR_RETURN(x, conv(w.conv_in, x));           // [h, w, C_top]
  FLUX_ASSIGN_OR_RETURN(x, resnet(w.mid_resnets[0], x));  // [h, w, C_top]
  if (config_.mid_block_add_attention) {
    FLUX_ASSIGN_OR_RETURN(x, attention(w.mid_attention, x));  // [h, w, C_top]
  }
  FLUX_ASSIGN_OR_RETURN(x, resnet(w.mid_resnets[1], x));  // [h, w, C_top]
  for (const VaeUpBlockWeights& block : w.up_blocks) {
    for (const VaeResnetWeights& layer : block.resnets) {
      FLUX_ASSIGN_OR_RETURN(x, resnet(layer, x));  // [h_i, w_i, C_i]
    }
    if (block.has_upsampler) {
      FLUX_ASSIGN_OR_RETURN(x, upsample(block.upsampler, x));  // [2 h_i, 2 w_i, C_i]
    }
  }
  FLUX_ASSIGN_OR_RETURN(x, group_norm(w.conv_norm_out, x, /*silu=*/true));  // [H, W, C_0]
  return conv(w.conv_out, x);                                               // [H, W, out_channels]
}

absl::StatusOr<Tensor> BackendVaeDecoder::decode_tokens(const Tensor& tokens, int64_t h,
                                                        int64_t w) const {
  const int64_t latent = config_.latent_channels;
  if (h <= 0 || w <= 0 || tokens.rows() != h * w || tokens.cols() != kPatch * kPatch * latent) {
    return absl::InvalidArgumentError(absl::StrCat("VAE decode: tokens ", tokens.describe(),
                                                   " are not [", h, " x ", w, ", ",
                                                   kPatch * kPatch * latent, "]"));
  }
  FLUX_ASSIGN_OR_RETURN(Tensor latents, image(kPatch * h, kPatch * w, latent));
  FLUX_RETURN_IF_ERROR(backend_.latent_unpack(tokens, weights_.bn_mean, weights_.bn_var,
                                              static_cast<float>(config_.batch_norm_eps),
                                              latents));  // [2h, 2w, Cl]
  return decode(latents);                                 // [16h, 16w, 3]
}

// A clear error naming `field` of `source`.
absl::Status config_error(const std::string& source, absl::string_view field,
                          absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", field, "\" ", what));
}

// Every entry of the string array `field` (when present) must equal `expected`; `count` entries.
absl::Status check_string_array(const nlohmann::json& json, const std::string& source,
                                const char* field, const char* expected, size_t count) {
  if (!json.contains(field) || json[field].is_null()) return absl::OkStatus();
  const nlohmann::json& value = json[field];
  if (!value.is_array()) return config_error(source, field, "is not an array of strings");
  if (value.size() != count) {
    return config_error(source, field,
                        absl::StrCat("has ", value.size(), " entries, block_out_channels ", count));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string() || value[i].get<std::string>() != expected) {
      return config_error(
          source, field,
          absl::StrCat("entry ", i, " is ", value[i].dump(), "; only ", expected, " is supported"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t VaeConfig::scale_factor() const {
  return int64_t{1} << (block_out_channels.size() - 1);
}

absl::StatusOr<VaeConfig> VaeConfig::from_json(const nlohmann::json& json,
                                               const std::string& source) {
  if (!json.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  VaeConfig config;
  JsonFields f(json, source);
  std::string class_name = "AutoencoderKLFlux2";
  std::string act_fn = "silu";
  std::vector<int64_t> decoder_channels;
  std::vector<int64_t> patch_size = {kPatch, kPatch};
  FLUX_RETURN_IF_ERROR(f.read("_class_name", &class_name));
  FLUX_RETURN_IF_ERROR(f.read("block_out_channels", &config.block_out_channels));
  FLUX_RETURN_IF_ERROR(f.read("decoder_block_out_channels", &decoder_channels));
  FLUX_RETURN_IF_ERROR(f.read("layers_per_block", &config.layers_per_block));
  FLUX_RETURN_IF_ERROR(f.read("latent_channels", &config.latent_channels));
  FLUX_RETURN_IF_ERROR(f.read("norm_num_groups", &config.norm_num_groups));
  FLUX_RETURN_IF_ERROR(f.read("out_channels", &config.out_channels));
  FLUX_RETURN_IF_ERROR(f.read("batch_norm_eps", &config.batch_norm_eps));
  FLUX_RETURN_IF_ERROR(f.read("mid_block_add_attention", &config.mid_block_add_attention));
  FLUX_RETURN_IF_ERROR(f.read("use_post_quant_conv", &config.use_post_quant_conv));
  FLUX_RETURN_IF_ERROR(f.read("act_fn", &act_fn));
  FLUX_RETURN_IF_ERROR(f.read("patch_size", &patch_size));

  if (class_name != "AutoencoderKLFlux2") {
    return config_error(
        source, "_class_name",
        absl::StrCat("is \"", class_name, "\"; only AutoencoderKLFlux2 is supported"));
  }
  if (config.block_out_channels.empty())
    return config_error(source, "block_out_channels", "is empty");
  if (!decoder_channels.empty()) {
    // A smaller decoder paired with the standard encoder: the decoder is built from these.
    if (decoder_channels.size() != config.block_out_channels.size()) {
      return config_error(source, "decoder_block_out_channels",
                          "must have as many entries as block_out_channels");
    }
    config.block_out_channels = decoder_channels;
  }
  const char* channels_field =
      decoder_channels.empty() ? "block_out_channels" : "decoder_block_out_channels";
  for (int64_t channels : config.block_out_channels) {
    if (channels <= 0 || config.norm_num_groups <= 0 || channels % config.norm_num_groups != 0) {
      return config_error(
          source, channels_field,
          absl::StrCat("[", absl::StrJoin(config.block_out_channels, ", "),
                       "] must be positive multiples of norm_num_groups ", config.norm_num_groups));
    }
  }
  if (config.layers_per_block < 0) return config_error(source, "layers_per_block", "is negative");
  if (config.latent_channels <= 0)
    return config_error(source, "latent_channels", "must be positive");
  if (config.out_channels <= 0) return config_error(source, "out_channels", "must be positive");
  if (!(config.batch_norm_eps >= 0.0) || !std::isfinite(config.batch_norm_eps)) {
    return config_error(source, "batch_norm_eps", "must be a finite number >= 0");
  }
  if (act_fn != "silu") {
    return config_error(source, "act_fn",
                        absl::StrCat("is \"", act_fn, "\"; only silu is supported"));
  }
  if (patch_size != std::vector<int64_t>{kPatch, kPatch}) {
    return config_error(
        source, "patch_size",
        absl::StrCat("is [", absl::StrJoin(patch_size, ", "), "]; only [2, 2] is supported"));
  }
  FLUX_RETURN_IF_ERROR(check_string_array(json, source, "up_block_types", "UpDecoderBlock2D",
                                          config.block_out_channels.size()));
  return config;
}

absl::StatusOr<std::unique_ptr<VaeDecoder>> VaeDecoder::load(Backend& backend,
                                                             const ComponentWeights& checkpoint) {
  FLUX_ASSIGN_OR_RETURN(VaeConfig config,
                        VaeConfig::from_json(checkpoint.config(), checkpoint.config_path()));
  auto decoder = std::make_unique<BackendVaeDecoder>(backend, std::move(config));
  FLUX_RETURN_IF_ERROR(decoder->load_weights_from(checkpoint));
  return std::unique_ptr<VaeDecoder>(std::move(decoder));
}

absl::StatusOr<std::unique_ptr<VaeDecoder>> VaeDecoder::create_random(Backend& backend,
                                                                      VaeConfig config,
                                                                      uint64_t seed) {
  auto decoder = std::make_unique<BackendVaeDecoder>(backend, std::move(config));
  FLUX_RETURN_IF_ERROR(decoder->fill_random(seed));
  return std::unique_ptr<VaeDecoder>(std::move(decoder));
}

std::vector<uint8_t> image_to_u8(std::span<const float> image) {
  std::vector<uint8_t> out(image.size());
  // Float32 steps as in diffusers: (x / 2 + 0.5).clamp(0, 1), then numpy (x * 255).round().
  for (size_t i = 0; i < image.size(); ++i) out[i] = unit_to_u8(image[i] / 2.0f + 0.5f);
  return out;
}

}  // namespace flux2
