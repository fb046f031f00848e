// The FLUX.2 VAE decoder and encoder tensor tables; see vae_weights.h.
// Tested by tests/host/vae_test.cc and `flux2 check-golden --only vae`.
#include "model/vae_weights.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flux2 {
namespace {

// Appends the specs of one module family to a table.
class TableBuilder {
 public:
  explicit TableBuilder(std::vector<WeightSpec>& specs) : specs_(specs) {}

  void tensor(std::string name, Shape shape, Tensor* target, int64_t row = 0) {
    specs_.push_back(WeightSpec{std::move(name), std::move(shape), target, row});
  }
  void group_norm(const std::string& prefix, int64_t channels, VaeGroupNormWeights& w) {
    tensor(prefix + ".weight", {channels}, &w.gamma);
    tensor(prefix + ".bias", {channels}, &w.beta);
  }
  void conv(const std::string& prefix, int64_t in, int64_t out, int64_t kernel, VaeConvWeights& w) {
    specs_.push_back(WeightSpec{
        prefix + ".weight", {out, in, kernel, kernel}, &w.weight, 0, WeightLayout::kConvToOhwi});
    tensor(prefix + ".bias", {out}, &w.bias);
  }
  void resnet(const std::string& prefix, int64_t in, int64_t out, VaeResnetWeights& w) {
    group_norm(prefix + ".norm1", in, w.norm1);
    conv(prefix + ".conv1", in, out, 3, w.conv1);
    group_norm(prefix + ".norm2", out, w.norm2);
    conv(prefix + ".conv2", out, out, 3, w.conv2);
    if (in != out) conv(prefix + ".conv_shortcut", in, out, 1, w.conv_shortcut);
  }
  void attention(const std::string& prefix, int64_t channels, VaeAttentionWeights& w) {
    group_norm(prefix + ".group_norm", channels, w.group_norm);
    const char* const projections[] = {"to_q", "to_k", "to_v"};
    for (int i = 0; i < 3; ++i) {
      tensor(absl::StrCat(prefix, ".", projections[i], ".weight"), {channels, channels},
             &w.qkv_weight, i * channels);
      tensor(absl::StrCat(prefix, ".", projections[i], ".bias"), {channels}, &w.qkv_bias,
             i * channels);
    }
    tensor(prefix + ".to_out.0.weight", {channels, channels}, &w.out_weight);
    tensor(prefix + ".to_out.0.bias", {channels}, &w.out_bias);
  }

 private:
  std::vector<WeightSpec>& specs_;
};

}  // namespace

std::vector<WeightSpec> VaeWeights::table(const VaeConfig& config) {
  std::vector<WeightSpec> specs;
  TableBuilder add(specs);
  const int64_t latent = config.latent_channels;
  const std::vector<int64_t>& channels = config.block_out_channels;
  const int64_t top = channels.back();

  add.tensor("bn.running_mean", {4 * latent}, &bn_mean);
  add.tensor("bn.running_var", {4 * latent}, &bn_var);
  if (config.use_post_quant_conv) add.conv("post_quant_conv", latent, latent, 1, post_quant_conv);
  add.conv("decoder.conv_in", latent, top, 3, conv_in);
  add.resnet("decoder.mid_block.resnets.0", top, top, mid_resnets[0]);
  if (config.mid_block_add_attention) {
    add.attention("decoder.mid_block.attentions.0", top, mid_attention);
  }
  add.resnet("decoder.mid_block.resnets.1", top, top, mid_resnets[1]);

  const size_t num_blocks = channels.size();
  up_blocks.assign(num_blocks, VaeUpBlockWeights{});
  int64_t in = top;
  for (size_t i = 0; i < num_blocks; ++i) {
    VaeUpBlockWeights& block = up_blocks[i];
    const int64_t out = channels[num_blocks - 1 - i];
    const std::string prefix = absl::StrCat("decoder.up_blocks.", i);
    block.resnets.resize(static_cast<size_t>(config.layers_per_block + 1));
    for (size_t r = 0; r < block.resnets.size(); ++r) {
      add.resnet(absl::StrCat(prefix, ".resnets.", r), r == 0 ? in : out, out, block.resnets[r]);
    }
    block.has_upsampler = i + 1 < num_blocks;
    if (block.has_upsampler) add.conv(prefix + ".upsamplers.0.conv", out, out, 3, block.upsampler);
    in = out;
  }
  add.group_norm("decoder.conv_norm_out", channels.front(), conv_norm_out);
  add.conv("decoder.conv_out", channels.front(), config.out_channels, 3, conv_out);
  return specs;
}

std::vector<WeightSpec> VaeEncoderWeights::table(const VaeConfig& config) {
  std::vector<WeightSpec> specs;
  TableBuilder add(specs);
  const int64_t latent = config.latent_channels;
  const std::vector<int64_t>& channels = config.encoder_block_out_channels;
  const int64_t top = channels.back();

  add.tensor("bn.running_mean", {4 * latent}, &bn_mean);
  add.tensor("bn.running_var", {4 * latent}, &bn_var);
  add.conv("encoder.conv_in", config.in_channels, channels.front(), 3, conv_in);
  down_blocks.assign(channels.size(), VaeDownBlockWeights{});
  int64_t in = channels.front();
  for (size_t i = 0; i < channels.size(); ++i) {
    VaeDownBlockWeights& block = down_blocks[i];
    const int64_t out = channels[i];
    const std::string prefix = absl::StrCat("encoder.down_blocks.", i);
    block.resnets.resize(static_cast<size_t>(config.layers_per_block));
    for (size_t r = 0; r < block.resnets.size(); ++r) {
      add.resnet(absl::StrCat(prefix, ".resnets.", r), r == 0 ? in : out, out, block.resnets[r]);
    }
    block.has_downsampler = i + 1 < channels.size();
    if (block.has_downsampler) {
      add.conv(prefix + ".downsamplers.0.conv", out, out, 3, block.downsampler);
    }
    in = out;
  }
  add.resnet("encoder.mid_block.resnets.0", top, top, mid_resnets[0]);
  if (config.mid_block_add_attention) {
    add.attention("encoder.mid_block.attentions.0", top, mid_attention);
  }
  add.resnet("encoder.mid_block.resnets.1", top, top, mid_resnets[1]);
  add.group_norm("encoder.conv_norm_out", top, conv_norm_out);
  add.conv("encoder.conv_out", top, 2 * latent, 3, conv_out);
  if (config.use_quant_conv) add.conv("quant_conv", 2 * latent, 2 * latent, 1, quant_conv);
  return specs;
}

bool vae_encoder_unused_tensor(absl::string_view name) {
  return absl::StartsWith(name, "decoder.") || absl::StartsWith(name, "post_quant_conv.") ||
         name == "bn.num_batches_tracked";
}

bool vae_unused_tensor(absl::string_view name) {
  return absl::StartsWith(name, "encoder.") || absl::StartsWith(name, "quant_conv.") ||
         name == "bn.num_batches_tracked";
}

}  // namespace flux2
