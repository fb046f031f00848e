// The VAE decoder: config parsing and its errors, weight-table errors naming the tensor,
// decode_tokens = latent_unpack + decode (and against the pipeline golden), input checks, and
// image_to_u8 rounding/clamping (against a naive reference and the pipeline's image_u8).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kernels/base/numerics.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/json_util.h"
#include "model/safetensors.h"
#include "model/vae_decoder.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string tiny_vae_dir() {
  return testing::test_data_dir() + "/tiny-klein/checkpoint/vae";
}

nlohmann::json tiny_config() {
  auto config = read_json_file(tiny_vae_dir() + "/config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// ---- config -------------------------------------------------------------------------------------

TEST(VaeConfigTest, ParsesTinyKlein) {
  auto config = VaeConfig::from_json(tiny_config(), "vae/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->block_out_channels, (std::vector<int64_t>{16, 32, 32, 32}));
  EXPECT_EQ(config->layers_per_block, 1);
  EXPECT_EQ(config->latent_channels, 32);
  EXPECT_EQ(config->norm_num_groups, 8);
  EXPECT_EQ(config->out_channels, 3);
  EXPECT_DOUBLE_EQ(config->batch_norm_eps, 1e-4);
  EXPECT_TRUE(config->mid_block_add_attention);
  EXPECT_TRUE(config->use_post_quant_conv);
  EXPECT_EQ(config->scale_factor(), 8);
}

TEST(VaeConfigTest, DefaultsAreThePublishedVae) {
  auto config = VaeConfig::from_json(nlohmann::json::object(), "vae/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(config->norm_num_groups, 32);
  EXPECT_EQ(config->scale_factor(), 8);
}

TEST(VaeConfigTest, DecoderBlockOutChannelsReplaceTheDecoderWidths) {
  nlohmann::json json = tiny_config();
  json["decoder_block_out_channels"] = {8, 16, 16, 24};
  auto config = VaeConfig::from_json(json, "vae/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->block_out_channels, (std::vector<int64_t>{8, 16, 16, 24}));
}

struct BadConfig {
  const char* field;
  nlohmann::json value;
};

TEST(VaeConfigTest, UnsupportedConfigsNameTheField) {
  const BadConfig cases[] = {
      {"_class_name", "AutoencoderKL"},
      {"act_fn", "relu"},
      {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpBlock2D", "UpDecoderBlock2D"}},
      {"up_block_types", {"UpDecoderBlock2D"}},
      {"patch_size", {1, 1}},
      {"block_out_channels", {16, 32, 30, 32}},  // 30 is not a multiple of 8 groups
      {"block_out_channels", nlohmann::json::array()},
      {"decoder_block_out_channels", {16, 32}},
      {"latent_channels", 0},
      {"latent_channels", "32"},
      {"layers_per_block", -1},
      {"out_channels", 0},
      {"batch_norm_eps", -1.0},
      {"mid_block_add_attention", 1},
  };
  for (const BadConfig& bad : cases) {
    nlohmann::json json = tiny_config();
    json[bad.field] = bad.value;
    auto config = VaeConfig::from_json(json, "vae/config.json");
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.field << " = " << bad.value;
    EXPECT_THAT(config.status().message(), HasSubstr("vae/config.json")) << bad.field;
    EXPECT_THAT(config.status().message(), HasSubstr(bad.field)) << bad.value;
  }
  nlohmann::json groups = tiny_config();
  groups["norm_num_groups"] = 5;
  EXPECT_THAT(VaeConfig::from_json(groups, "vae/config.json").status().message(),
              HasSubstr("norm_num_groups 5"));
  EXPECT_FALSE(VaeConfig::from_json(nlohmann::json::array(), "vae/config.json").ok());
}

// ---- weights ------------------------------------------------------------------------------------

class VaeWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vae_dir_ = dir_.path() + "/vae";
    testing::copy_tree(tiny_vae_dir(), vae_dir_);
    weights_path_ = vae_dir_ + "/diffusion_pytorch_model.safetensors";
    tensors_ = testing::read_all_tensors(weights_path_);
  }
  absl::Status load() {
    testing::write_safetensors(weights_path_, tensors_);
    auto weights = ComponentWeights::open(vae_dir_);
    if (!weights.ok()) return weights.status();
    auto vae = VaeDecoder::load(backend_, *weights);
    return vae.ok() ? absl::OkStatus() : vae.status();
  }
  void write_config(const nlohmann::json& config) {
    std::ofstream(vae_dir_ + "/config.json") << config.dump();
  }

  testing::TempDir dir_;
  std::string vae_dir_, weights_path_;
  std::map<std::string, testing::RawTensor> tensors_;
  CpuBackend backend_;
};

TEST_F(VaeWeightsTest, LoadsOnlyTheDecoder) {
  auto weights = ComponentWeights::open(vae_dir_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto vae = VaeDecoder::load(backend_, *weights);
  ASSERT_TRUE(vae.ok()) << vae.status();
  // Device bytes = every decoder-side tensor in f32; the encoder, quant_conv and the BatchNorm
  // counter are not allocated.
  int64_t decoder_elements = 0;
  for (const auto& [name, ref] : weights->tensors()) {
    if (name.rfind("encoder.", 0) == 0 || name.rfind("quant_conv.", 0) == 0 ||
        name == "bn.num_batches_tracked") {
      continue;
    }
    decoder_elements += shape_numel(ref.entry->shape);
  }
  EXPECT_EQ((*vae)->device_bytes(), decoder_elements * 4);
}

TEST_F(VaeWeightsTest, EncoderTensorsAreOptional) {
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    const bool encoder =
        it->first.rfind("encoder.", 0) == 0 || it->first.rfind("quant_conv.", 0) == 0;
    it = encoder ? tensors_.erase(it) : std::next(it);
  }
  EXPECT_TRUE(load().ok()) << load();
}

TEST_F(VaeWeightsTest, MissingDecoderTensorIsNamed) {
  tensors_.erase("decoder.up_blocks.3.resnets.0.conv_shortcut.weight");
  const absl::Status status = load();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("missing tensors: decoder.up_blocks.3.resnets.0.conv_shortcut.weight"));
}

TEST_F(VaeWeightsTest, RenamedDecoderTensorIsMissingAndUnexpected) {
  auto node = tensors_.extract("decoder.mid_block.attentions.0.to_k.bias");
  node.key() = "decoder.mid_block.attentions.0.key.bias";
  tensors_.insert(std::move(node));
  const absl::Status status = load();
  EXPECT_THAT(status.message(),
              HasSubstr("missing tensors: decoder.mid_block.attentions.0.to_k.bias"));
  EXPECT_THAT(status.message(),
              HasSubstr("unexpected tensors: decoder.mid_block.attentions.0.key.bias"));
}

TEST_F(VaeWeightsTest, MissingBatchNormStatisticsAreNamed) {
  tensors_.erase("bn.running_var");
  EXPECT_THAT(load().message(), HasSubstr("missing tensors: bn.running_var"));
}

TEST_F(VaeWeightsTest, ReshapedTensorIsNamed) {
  tensors_["decoder.conv_out.weight"].shape = {3, 16, 1, 9};
  EXPECT_THAT(
      load().message(),
      HasSubstr("wrong shape: decoder.conv_out.weight is [3, 16, 1, 9], expected [3, 16, 3, 3]"));
}

TEST_F(VaeWeightsTest, ConfigWithoutMidAttentionRejectsAttentionTensors) {
  nlohmann::json config = tiny_config();
  config["mid_block_add_attention"] = false;
  write_config(config);
  EXPECT_THAT(load().message(), HasSubstr("unexpected tensors: decoder.mid_block.attentions.0"));
}

TEST_F(VaeWeightsTest, ConfigWithMoreLayersListsTheMissingResnets) {
  nlohmann::json config = tiny_config();
  config["layers_per_block"] = 2;
  write_config(config);
  EXPECT_THAT(load().message(), HasSubstr("decoder.up_blocks.0.resnets.2.norm1.weight"));
}

// ---- decoding -----------------------------------------------------------------------------------

class VaeDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = ComponentWeights::open(tiny_vae_dir());
    ASSERT_TRUE(weights.ok()) << weights.status();
    checkpoint_ = std::make_unique<ComponentWeights>(std::move(*weights));
    auto vae = VaeDecoder::load(backend_, *checkpoint_);
    ASSERT_TRUE(vae.ok()) << vae.status();
    vae_ = std::move(*vae);
  }
  Tensor upload(const std::vector<float>& values, Shape shape) {
    auto tensor = backend_.empty(DType::kF32, std::move(shape));
    EXPECT_TRUE(tensor.ok());
    EXPECT_TRUE(backend_.upload(values.data(), DType::kF32, *tensor).ok());
    return *tensor;
  }
  std::vector<float> download(const Tensor& tensor) {
    std::vector<float> values(static_cast<size_t>(tensor.numel()));
    EXPECT_TRUE(backend_.download(tensor, values.data()).ok());
    return values;
  }
  std::vector<float> checkpoint_f32(const std::string& name) {
    const TensorRef* ref = checkpoint_->find(name);
    EXPECT_NE(ref, nullptr) << name;
    std::vector<float> values(static_cast<size_t>(shape_numel(ref->entry->shape)));
    widen_to_f32(ref->entry->dtype, ref->data(), static_cast<int64_t>(values.size()),
                 values.data());
    return values;
  }

  CpuBackend backend_;
  std::unique_ptr<ComponentWeights> checkpoint_;
  std::unique_ptr<VaeDecoder> vae_;
};

TEST_F(VaeDecodeTest, DecodeTokensIsLatentUnpackThenDecode) {
  const int64_t h = 3, w = 5, packed = 4 * 32;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(h * w * packed));
  for (float& v : values) v = normal(rng);
  const Tensor tokens = upload(values, {h * w, packed});

  auto image = vae_->decode_tokens(tokens, h, w);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->shape(), (Shape{16 * h, 16 * w, 3}));

  // The same two steps by hand, with the checkpoint's BatchNorm statistics.
  const Tensor mean = upload(checkpoint_f32("bn.running_mean"), {packed});
  const Tensor var = upload(checkpoint_f32("bn.running_var"), {packed});
  auto latents = backend_.empty(DType::kF32, {2 * h, 2 * w, 32});
  ASSERT_TRUE(latents.ok());
  ASSERT_TRUE(backend_.latent_unpack(tokens, mean, var, 1e-4f, *latents).ok());
  auto expected = vae_->decode(*latents);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const std::vector<float> ours = download(*image), reference = download(*expected);
  EXPECT_EQ(ours, reference);  // same ops in the same order: bit-identical
  double norm = 0.0;
  for (float v : ours) norm += double{v} * v;
  EXPECT_GT(norm, 1.0);  // not trivially zero
}

// The pipeline golden's last latents, decoded through decode_tokens, give its image: BatchNorm
// de-normalisation, unpatchify and vae.decode as diffusers does them (1e-4 relative, README).
TEST_F(VaeDecodeTest, DecodeTokensMatchesPipelineGolden) {
  auto file = SafetensorsFile::open(testing::test_data_dir() + "/tiny-klein/pipeline.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto tokens = read_f32(**file, "case0.latents_after_step3");  // [1, 16, 128], h = w = 4
  auto reference = read_f32(**file, "case0.image");             // [1, 3, 64, 64] in [0, 1]
  ASSERT_TRUE(tokens.ok() && reference.ok());
  auto image = vae_->decode_tokens(upload(*tokens, {16, 128}), 4, 4);
  ASSERT_TRUE(image.ok()) << image.status();
  const std::vector<float> hwc = download(*image);
  std::vector<float> chw(hwc.size());
  for (int64_t p = 0; p < 64 * 64; ++p) {
    for (int64_t c = 0; c < 3; ++c)
      chw[c * 64 * 64 + p] = std::clamp(hwc[p * 3 + c] / 2.0f + 0.5f, 0.0f, 1.0f);
  }
  EXPECT_LE(relative_l2_error(chw, *reference), 1e-4);
}

TEST_F(VaeDecodeTest, RejectsMismatchedInputs) {
  const Tensor wrong_channels = upload(std::vector<float>(4 * 4 * 16), {4, 4, 16});
  EXPECT_EQ(vae_->decode(wrong_channels).status().code(), absl::StatusCode::kInvalidArgument);
  const Tensor flat = upload(std::vector<float>(16 * 32), {16, 32});
  EXPECT_EQ(vae_->decode(flat).status().code(), absl::StatusCode::kInvalidArgument);
  const Tensor tokens = upload(std::vector<float>(15 * 128), {15, 128});
  EXPECT_EQ(vae_->decode_tokens(tokens, 4, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(vae_->decode_tokens(tokens, 0, 15).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(vae_->decode_tokens(tokens, 3, 5).ok());
}

// ---- image_to_u8 --------------------------------------------------------------------------------

TEST(ImageToU8Test, ClampsAndRoundsHalfToEven) {
  const std::vector<float> image = {-1.0f, 1.0f, -3.0f, 7.5f, 0.0f, NAN, -INFINITY, INFINITY};
  const std::vector<uint8_t> expected = {0,   255, 0, 255,
                                         128, 0,   0, 255};  // 0 -> 127.5 -> 128 (even)
  EXPECT_EQ(image_to_u8(image), expected);

  // Against a naive reference on a dense sweep: the float32 value v = (x / 2 + 0.5) * 255 after
  // clamping, rounded to the nearest integer, ties to the even one (numpy round).
  std::vector<float> sweep;
  for (int i = -120000; i <= 120000; ++i) sweep.push_back(static_cast<float>(i) / 100000.0f);
  int ties = 0;
  const std::vector<uint8_t> ours = image_to_u8(sweep);
  for (size_t i = 0; i < sweep.size(); ++i) {
    float unit = sweep[i] / 2.0f + 0.5f;
    unit = unit < 0.0f ? 0.0f : (unit > 1.0f ? 1.0f : unit);
    const float v = unit * 255.0f;
    const double below = std::floor(double{v});
    int expected_level = static_cast<int>(v - below < 0.5 ? below : below + 1);
    if (v - below == 0.5) {
      ++ties;
      expected_level =
          static_cast<int>(below) % 2 == 0 ? static_cast<int>(below) : static_cast<int>(below) + 1;
    }
    ASSERT_EQ(ours[i], expected_level) << "x = " << sweep[i];
  }
  EXPECT_GT(ties, 0);  // the sweep does exercise exact ties (e.g. x = 0)
}

// The pipeline goldens' image_u8 is diffusers' postprocess of its image (stored in [0, 1]).
// Mapping it back to [-1, 1] with 2 y - 1 round-trips through / 2 + 0.5 up to one float32
// rounding, so the levels must agree up to the README's bar (<= 1 level on <= 0.5% of values).
TEST(ImageToU8Test, MatchesPipelineImageU8) {
  auto file = SafetensorsFile::open(testing::test_data_dir() + "/tiny-klein/pipeline.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  for (const char* name : {"case0", "case1"}) {
    auto image = read_f32(**file, std::string(name) + ".image");
    auto u8 = read_f32(**file, std::string(name) + ".image_u8");
    ASSERT_TRUE(image.ok() && u8.ok());
    std::vector<float> signed_image(image->size());
    for (size_t i = 0; i < image->size(); ++i) signed_image[i] = 2.0f * (*image)[i] - 1.0f;
    const std::vector<uint8_t> ours = image_to_u8(signed_image);
    int64_t off_by_one = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      const int diff = std::abs(int{ours[i]} - static_cast<int>((*u8)[i]));
      ASSERT_LE(diff, 1) << name << " value " << i;
      off_by_one += diff;
    }
    EXPECT_LE(off_by_one, static_cast<int64_t>(ours.size()) / 200) << name;
  }
}

}  // namespace
}  // namespace flux2
