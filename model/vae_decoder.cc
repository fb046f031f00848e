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
#include "model/vae_layers.h"
#include "model/vae_weights.h"

namespace flux2 {
namespace {

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
    FLUX_ASSIGN_OR_RETURN(load_report_.device_bytes, allocate_device_weights(backend_, table));
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
    return layers_.image(height, width, channels);
  }
  // Upsample2D: nearest-neighbour x2, then a 3x3 convolution.
  absl::StatusOr<Tensor> upsample(const VaeConvWeights& w, const Tensor& x) const;

  Backend& backend_;
  VaeConfig config_;
  VaeLayers layers_{backend_, config_.norm_num_groups};
  VaeWeights weights_;
  LoadReport load_report_;
};

absl::StatusOr<Tensor> BackendVaeDecoder::upsample(const VaeConvWeights& w, const Tensor& x) const {
  FLUX_ASSIGN_OR_RETURN(Tensor up, image(2 * x.dim(0), 2 * x.dim(1), x.dim(2)));
  FLUX_RETURN_IF_ERROR(backend_.upsample_nearest_2x(x, up));  // [2H, 2W, C]
  return layers_.conv(w, up);                                 // [2H, 2W, C]
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
    FLUX_ASSIGN_OR_RETURN(x, layers_.conv(w.post_quant_conv, x));  // [h, w, Cl]
  }
  FLUX_ASSIGN_OR_RETURN(x, layers_.conv(w.conv_in, x));  // [h, w, C_top]
  FLUX_ASSIGN_OR_RETURN(
      x,
      layers_.mid_block(w.mid_resnets, config_.mid_block_add_attention ? &w.mid_attention : nullptr,
                        x));  // [h, w, C_top]
  for (const VaeUpBlockWeights& block : w.up_blocks) {
    for (const VaeResnetWeights& layer : block.resnets) {
      FLUX_ASSIGN_OR_RETURN(x, layers_.resnet(layer, x));  // [h_i, w_i, C_i]
    }
    if (block.has_upsampler) {
      FLUX_ASSIGN_OR_RETURN(x, upsample(block.upsampler, x));  // [2 h_i, 2 w_i, C_i]
    }
  }
  FLUX_ASSIGN_OR_RETURN(x, layers_.group_norm(w.conv_norm_out, x, /*silu=*/true));  // [H, W, C_0]
  return layers_.conv(w.conv_out, x);  // [H, W, out_channels]
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
  FLUX_RETURN_IF_ERROR(f.read("use_quant_conv", &config.use_quant_conv));
  FLUX_RETURN_IF_ERROR(f.read("in_channels", &config.in_channels));
  FLUX_RETURN_IF_ERROR(f.read("act_fn", &act_fn));
  FLUX_RETURN_IF_ERROR(f.read("patch_size", &patch_size));

  if (class_name != "AutoencoderKLFlux2") {
    return config_error(
        source, "_class_name",
        absl::StrCat("is \"", class_name, "\"; only AutoencoderKLFlux2 is supported"));
  }
  if (config.block_out_channels.empty())
    return config_error(source, "block_out_channels", "is empty");
  config.encoder_block_out_channels = config.block_out_channels;
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
  if (config.in_channels <= 0) return config_error(source, "in_channels", "must be positive");
  for (int64_t channels : config.encoder_block_out_channels) {
    if (channels <= 0 || channels % config.norm_num_groups != 0) {
      return config_error(source, "block_out_channels",
                          "entries must be positive multiples of norm_num_groups");
    }
  }
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
  FLUX_RETURN_IF_ERROR(check_string_array(json, source, "down_block_types", "DownEncoderBlock2D",
                                          config.encoder_block_out_channels.size()));
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
