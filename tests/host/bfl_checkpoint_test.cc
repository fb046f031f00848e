// BFL single-file transformer checkpoints (model/bfl_checkpoint.h): the mapping covers the tensor
// table once and agrees with diffusers' convert_flux2_to_diffusers (spelled out again here); the
// tiny dev, FLUX.2-dev and klein transformers survive diffusers -> BFL file -> view byte for byte,
// load to bit-identical forwards that pass their goldens; bad files name the tensors.
//   build/bin/host_tests --gtest_filter='*Bfl*'
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/base/numerics.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/bfl_checkpoint.h"
#include "model/checkpoint.h"
#include "model/flux2_presets.h"
#include "model/flux2_transformer.h"
#include "model/flux2_weights.h"
#include "model/safetensors.h"
#include "server/cli/golden/golden_check.h"
#include "tests/host/bfl_writer.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;

std::string transformer_dir(const std::string& model) {
  return testing::test_data_dir() + "/" + model + "/checkpoint/transformer";
}

Flux2Config config_of(const ComponentWeights& weights) {
  auto config = Flux2Config::from_json(weights.config(), weights.config_path());
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : Flux2Config{};
}

// The tensors' bytes as a string (for equality with a readable failure).
std::string bytes_of(const TensorRef& ref, int64_t first_row = 0, int64_t rows = -1) {
  const int64_t row_bytes = ref.entry->bytes() / ref.entry->shape[0];
  if (rows < 0) rows = ref.entry->shape[0] - first_row;
  return std::string(static_cast<const char*>(ref.data()) + first_row * row_bytes,
                     static_cast<size_t>(rows * row_bytes));
}

// ---- the mapping itself -------------------------------------------------------------------------

class BflMappingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BflMappingTest, CoversEveryTableTensorOnce) {
  auto diffusers = ComponentWeights::open(transformer_dir(GetParam()));
  ASSERT_TRUE(diffusers.ok()) << diffusers.status();
  const Flux2Config config = config_of(*diffusers);
  Flux2Weights weights;
  std::map<std::string, std::vector<int>> covered;  // diffusers name -> times each row is given
  for (const WeightSpec& spec : weights.table(config))
    covered[spec.name].assign(static_cast<size_t>(spec.shape[0]), 0);
  std::set<std::string> bfl_names;
  for (const BflTensor& tensor : bfl_transformer_tensors(config)) {
    EXPECT_TRUE(bfl_names.insert(tensor.name).second) << tensor.name << " twice";
    int64_t next_row = 0;
    for (const BflRows& part : tensor.parts) {
      EXPECT_EQ(part.bfl_row, next_row) << tensor.name << ": parts not in row order";
      next_row += part.rows;
      auto it = covered.find(part.diffusers_name);
      ASSERT_NE(it, covered.end()) << tensor.name << " -> unknown " << part.diffusers_name;
      ASSERT_LE(part.diffusers_row + part.rows, static_cast<int64_t>(it->second.size()));
      for (int64_t r = 0; r < part.rows; ++r) ++it->second[part.diffusers_row + r];
    }
    EXPECT_EQ(next_row, tensor.shape[0]) << tensor.name;
  }
  for (const auto& [name, rows] : covered) {
    EXPECT_EQ(std::count(rows.begin(), rows.end(), 1), static_cast<int64_t>(rows.size()))
        << name << ": some row not given exactly once";
  }
}

// The published shapes: dev's BFL file holds 11 top-level tensors (guidance embedder included),
// 12 per double block and 4 per single block, 32,223,281,152 parameters (model/README.md: the
// 64.4 GB of flux2-dev.safetensors in bf16); klein has no guidance embedder.
TEST(BflPresetTest, PublishedShapesHaveTheirParameterCounts) {
  const std::map<std::string, std::pair<size_t, int64_t>> expected = {
      {"dev", {11 + 8 * 12 + 48 * 4, 32223281152}},
      {"klein-4b", {9 + 5 * 12 + 20 * 4, 3875544576}},
      {"klein-9b", {9 + 8 * 12 + 24 * 4, 9078581248}},
  };
  for (const auto& [name, counts] : expected) {
    auto config = flux2_preset(name);
    ASSERT_TRUE(config.ok()) << config.status();
    const std::vector<BflTensor> tensors = bfl_transformer_tensors(*config);
    int64_t parameters = 0;
    for (const BflTensor& tensor : tensors) parameters += shape_numel(tensor.shape);
    EXPECT_EQ(tensors.size(), counts.first) << name;
    EXPECT_EQ(parameters, counts.second) << name;
    EXPECT_EQ(parameters, flux2_parameter_count(*config)) << name;
  }
}

// diffusers' scripts/convert_flux2_to_diffusers.py read as a list, independently of
// bfl_transformer_tensors: (BFL name, its first row, diffusers name, its first row, rows; -1
// rows = the whole diffusers tensor).
struct ConverterRows {
  std::string bfl;
  int64_t bfl_row;
  std::string diffusers;
  int64_t diffusers_row;
  int64_t rows;
};

std::vector<ConverterRows> converter_rows(const Flux2Config& config) {
  const int64_t d = config.hidden();
  std::vector<ConverterRows> out = {
      {"img_in.weight", 0, "x_embedder.weight", 0, -1},
      {"txt_in.weight", 0, "context_embedder.weight", 0, -1},
      {"time_in.in_layer.weight", 0, "time_guidance_embed.timestep_embedder.linear_1.weight", 0,
       -1},
      {"time_in.out_layer.weight", 0, "time_guidance_embed.timestep_embedder.linear_2.weight", 0,
       -1},
      {"double_stream_modulation_img.lin.weight", 0, "double_stream_modulation_img.linear.weight",
       0, -1},
      {"double_stream_modulation_txt.lin.weight", 0, "double_stream_modulation_txt.linear.weight",
       0, -1},
      {"single_stream_modulation.lin.weight", 0, "single_stream_modulation.linear.weight", 0, -1},
      // swap_scale_shift: BFL (shift, scale) -> diffusers (scale, shift).
      {"final_layer.adaLN_modulation.1.weight", 0, "norm_out.linear.weight", d, d},
      {"final_layer.adaLN_modulation.1.weight", d, "norm_out.linear.weight", 0, d},
      {"final_layer.linear.weight", 0, "proj_out.weight", 0, -1},
  };
  if (config.guidance_embeds) {
    out.push_back({"guidance_in.in_layer.weight", 0,
                   "time_guidance_embed.guidance_embedder.linear_1.weight", 0, -1});
    out.push_back({"guidance_in.out_layer.weight", 0,
                   "time_guidance_embed.guidance_embedder.linear_2.weight", 0, -1});
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string b = absl::StrCat("double_blocks.", i, "."),
                      t = absl::StrCat("transformer_blocks.", i, ".");
    const std::vector<ConverterRows> block = {
        {b + "img_attn.qkv.weight", 0, t + "attn.to_q.weight", 0, d},
        {b + "img_attn.qkv.weight", d, t + "attn.to_k.weight", 0, d},
        {b + "img_attn.qkv.weight", 2 * d, t + "attn.to_v.weight", 0, d},
        {b + "img_attn.norm.query_norm.scale", 0, t + "attn.norm_q.weight", 0, -1},
        {b + "img_attn.norm.key_norm.scale", 0, t + "attn.norm_k.weight", 0, -1},
        {b + "img_attn.proj.weight", 0, t + "attn.to_out.0.weight", 0, -1},
        {b + "img_mlp.0.weight", 0, t + "ff.linear_in.weight", 0, -1},
        {b + "img_mlp.2.weight", 0, t + "ff.linear_out.weight", 0, -1},
        {b + "txt_attn.qkv.weight", 0, t + "attn.add_q_proj.weight", 0, d},
        {b + "txt_attn.qkv.weight", d, t + "attn.add_k_proj.weight", 0, d},
        {b + "txt_attn.qkv.weight", 2 * d, t + "attn.add_v_proj.weight", 0, d},
        {b + "txt_attn.norm.query_norm.scale", 0, t + "attn.norm_added_q.weight", 0, -1},
        {b + "txt_attn.norm.key_norm.scale", 0, t + "attn.norm_added_k.weight", 0, -1},
        {b + "txt_attn.proj.weight", 0, t + "attn.to_add_out.weight", 0, -1},
        {b + "txt_mlp.0.weight", 0, t + "ff_context.linear_in.weight", 0, -1},
        {b + "txt_mlp.2.weight", 0, t + "ff_context.linear_out.weight", 0, -1},
    };
    out.insert(out.end(), block.begin(), block.end());
  }
  for (int64_t j = 0; j < config.num_single_layers; ++j) {
    const std::string b = absl::StrCat("single_blocks.", j, "."),
                      t = absl::StrCat("single_transformer_blocks.", j, ".");
    const std::vector<ConverterRows> block = {
        {b + "linear1.weight", 0, t + "attn.to_qkv_mlp_proj.weight", 0, -1},
        {b + "linear2.weight", 0, t + "attn.to_out.weight", 0, -1},
        {b + "norm.query_norm.scale", 0, t + "attn.norm_q.weight", 0, -1},
        {b + "norm.key_norm.scale", 0, t + "attn.norm_k.weight", 0, -1},
    };
    out.insert(out.end(), block.begin(), block.end());
  }
  return out;
}

TEST_P(BflMappingTest, WrittenFileMatchesDiffusersConverter) {
  auto diffusers = ComponentWeights::open(transformer_dir(GetParam()));
  ASSERT_TRUE(diffusers.ok()) << diffusers.status();
  testing::TempDir dir;
  const std::string path = dir.path() + "/flux2.safetensors";
  ASSERT_TRUE(testing::write_bfl_transformer(*diffusers, path).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::set<std::string> expected_names, names;
  for (const ConverterRows& rows : converter_rows(config_of(*diffusers))) {
    expected_names.insert(rows.bfl);
    const SafetensorsEntry* entry = (*file)->find(rows.bfl);
    ASSERT_NE(entry, nullptr) << rows.bfl;
    const TensorRef bfl{file->get(), entry};
    const TensorRef& source = *diffusers->find(rows.diffusers);
    EXPECT_EQ(entry->dtype, source.entry->dtype) << rows.bfl;
    const int64_t count = rows.rows < 0 ? source.entry->shape[0] : rows.rows;
    EXPECT_TRUE(bytes_of(bfl, rows.bfl_row, count) == bytes_of(source, rows.diffusers_row, count))
        << rows.bfl << " rows from " << rows.bfl_row << " != " << rows.diffusers;
  }
  for (const SafetensorsEntry& entry : (*file)->entries()) names.insert(entry.name);
  EXPECT_EQ(names, expected_names);
}

INSTANTIATE_TEST_SUITE_P(TinyTransformers, BflMappingTest,
                         ::testing::Values("tiny-dev", "tiny-flux2-dev", "tiny-klein"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// ---- round trips through a written BFL file -----------------------------------------------------

class BflRoundTripTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto diffusers = ComponentWeights::open(transformer_dir(GetParam()));
    ASSERT_TRUE(diffusers.ok()) << diffusers.status();
    diffusers_ = std::make_unique<ComponentWeights>(std::move(*diffusers));
    bfl_path_ = dir_.path() + "/flux2.safetensors";
    ASSERT_TRUE(testing::write_bfl_transformer(*diffusers_, bfl_path_).ok());
  }
  absl::StatusOr<ComponentWeights> open_view(const std::string& path) const {
    return open_bfl_transformer(path, diffusers_->config(), diffusers_->config_path());
  }
  // Every tensor of the table: same shape, dtype and bytes in `view` as in the directory.
  void expect_same_tensors(const ComponentWeights& view) const {
    Flux2Weights weights;
    const std::vector<WeightSpec> table = weights.table(config_of(*diffusers_));
    EXPECT_EQ(view.tensors().size(), table.size());
    for (const WeightSpec& spec : table) {
      const TensorRef* got = view.find(spec.name);
      ASSERT_NE(got, nullptr) << spec.name;
      const TensorRef& want = *diffusers_->find(spec.name);
      EXPECT_EQ(got->entry->shape, want.entry->shape) << spec.name;
      EXPECT_EQ(got->entry->dtype, want.entry->dtype) << spec.name;
      EXPECT_TRUE(bytes_of(*got) == bytes_of(want)) << spec.name << " differs";
    }
  }

  testing::TempDir dir_;
  std::unique_ptr<ComponentWeights> diffusers_;
  std::string bfl_path_;
};

TEST_P(BflRoundTripTest, ViewIsByteIdentical) {
  auto view = open_view(bfl_path_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->dir(), bfl_path_);
  EXPECT_EQ(view->config_path(), diffusers_->config_path());
  expect_same_tensors(*view);
  // Row splits are views into the mapped file; only the adaLN swap is a copy.
  auto file = SafetensorsFile::open(bfl_path_);
  ASSERT_TRUE(file.ok());
  const TensorRef* to_k = view->find("transformer_blocks.0.attn.to_k.weight");
  const TensorRef* norm_out = view->find("norm_out.linear.weight");
  EXPECT_EQ(to_k->bytes, nullptr);
  EXPECT_EQ(to_k->file->path(), bfl_path_);
  EXPECT_NE(norm_out->bytes, nullptr);
}

// A preset's Flux2Config as config.json: it parses back to the same fields and opens the file.
TEST_P(BflRoundTripTest, OpensWithAConfigGivenAsStruct) {
  const Flux2Config config = config_of(*diffusers_);
  const nlohmann::json json = flux2_config_json(config);
  auto back = Flux2Config::from_json(json, "preset");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(flux2_config_json(*back), json);
  EXPECT_EQ(back->summary(), config.summary());
  auto view = open_bfl_transformer(bfl_path_, json, "preset " + GetParam());
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->config_path(), "preset " + GetParam());
  expect_same_tensors(*view);
}

TEST_P(BflRoundTripTest, DetectsNaming) {
  auto bfl = is_bfl_transformer_file(bfl_path_);
  ASSERT_TRUE(bfl.ok()) << bfl.status();
  EXPECT_TRUE(*bfl);
  auto plain =
      is_bfl_transformer_file(transformer_dir(GetParam()) + "/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(*plain);
  EXPECT_FALSE(is_bfl_transformer_file(dir_.path() + "/absent.safetensors").ok());
}

TEST_P(BflRoundTripTest, ModelPrefixIsStripped) {
  const std::string path = dir_.path() + "/comfy.safetensors";
  ASSERT_TRUE(testing::write_bfl_transformer(*diffusers_, path, kBflModelPrefix).ok());
  auto bfl = is_bfl_transformer_file(path);
  ASSERT_TRUE(bfl.ok() && *bfl);
  auto view = open_view(path);
  ASSERT_TRUE(view.ok()) << view.status();
  expect_same_tensors(*view);
}

// One forward per case of the part's golden (transformer.safetensors, as `flux2 check-golden`
// runs it), returned per case.
std::vector<std::vector<float>> golden_forwards(Backend& be, const Flux2Transformer& model,
                                                const SafetensorsFile& vectors) {
  std::vector<std::vector<float>> outputs;
  auto read = [&](const std::string& name) {
    auto values = read_f32(vectors, name);
    EXPECT_TRUE(values.ok()) << values.status();
    return values.ok() ? *values : std::vector<float>{};
  };
  const Flux2Config& config = model.config();
  for (int c = 0; vectors.find(absl::StrCat("case", c, ".hidden_states")) != nullptr; ++c) {
    const std::string p = absl::StrCat("case", c, ".");
    const std::vector<float> hidden = read(p + "hidden_states"),
                             text = read(p + "encoder_hidden_states"),
                             timestep = read(p + "timestep"), img = read(p + "img_ids"),
                             txt = read(p + "txt_ids");
    const std::vector<float> guidance =
        vectors.find(p + "guidance") != nullptr ? read(p + "guidance") : std::vector<float>{};
    const std::vector<int64_t> img_ids(img.begin(), img.end()), txt_ids(txt.begin(), txt.end());
    const int64_t n = static_cast<int64_t>(hidden.size()) / config.in_channels;
    const int64_t l = static_cast<int64_t>(text.size()) / config.joint_attention_dim;
    auto prompt = upload_values(be, text, {l, config.joint_attention_dim});
    auto x = upload_values(be, hidden, {n, config.in_channels});
    auto out = be.empty(be.activation_dtype(), {n, config.out_channels});
    EXPECT_TRUE(prompt.ok() && x.ok() && out.ok());
    auto cond = model.prepare(*prompt, txt_ids, img_ids, timestep, guidance);
    EXPECT_TRUE(cond.ok()) << cond.status();
    const absl::Status status = model.forward(*cond, 0, *x, *out);
    EXPECT_TRUE(status.ok()) << status;
    auto values = download_values(be, *out);
    EXPECT_TRUE(values.ok()) << values.status();
    outputs.push_back(values.ok() ? *values : std::vector<float>{});
  }
  return outputs;
}

// The model loaded through the BFL view computes bit for bit what the directory's does (same
// backend, same weights, same order of operations), and both pass the golden at the float32 CPU
// bar of tests/data/README.md (1e-4 relative L2 against diffusers' float32 forward).
TEST_P(BflRoundTripTest, ForwardIsBitIdenticalAndPassesGolden) {
  auto view = open_view(bfl_path_);
  ASSERT_TRUE(view.ok()) << view.status();
  CpuBackend be;
  auto from_bfl = Flux2Transformer::load(be, *view);
  ASSERT_TRUE(from_bfl.ok()) << from_bfl.status();
  auto from_dir = Flux2Transformer::load(be, *diffusers_);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  EXPECT_EQ((*from_bfl)->load_report().tensors, (*from_dir)->load_report().tensors);

  auto vectors = SafetensorsFile::open(testing::test_data_dir() + "/" + GetParam() +
                                       "/transformer.safetensors");
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  const RequestScope request(be, {Quality::kLossless});
  const auto bfl_outputs = golden_forwards(be, **from_bfl, **vectors);
  const auto dir_outputs = golden_forwards(be, **from_dir, **vectors);
  ASSERT_EQ(bfl_outputs.size(), 3u);
  ASSERT_EQ(dir_outputs.size(), bfl_outputs.size());
  for (size_t c = 0; c < bfl_outputs.size(); ++c) {
    ASSERT_EQ(bfl_outputs[c].size(), dir_outputs[c].size());
    EXPECT_EQ(std::memcmp(bfl_outputs[c].data(), dir_outputs[c].data(),
                          bfl_outputs[c].size() * sizeof(float)),
              0)
        << "case" << c << ": the BFL-loaded forward differs from the directory's";
    auto reference = read_f32(**vectors, absl::StrCat("case", c, ".output"));
    ASSERT_TRUE(reference.ok());
    ASSERT_EQ(reference->size(), bfl_outputs[c].size());
    EXPECT_GT(std::sqrt(std::inner_product(reference->begin(), reference->end(), reference->begin(),
                                           0.0)),
              1.0)
        << "case" << c << ": the golden output is trivially small";
    EXPECT_LE(relative_l2_error(bfl_outputs[c], *reference), 1e-4) << "case" << c;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyTransformers, BflRoundTripTest,
                         ::testing::Values("tiny-dev", "tiny-flux2-dev", "tiny-klein"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// ---- errors -------------------------------------------------------------------------------------

class BflErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto diffusers = ComponentWeights::open(transformer_dir("tiny-dev"));
    ASSERT_TRUE(diffusers.ok()) << diffusers.status();
    config_ = diffusers->config();
    path_ = dir_.path() + "/flux2.safetensors";
    ASSERT_TRUE(testing::write_bfl_transformer(*diffusers, path_).ok());
    tensors_ = testing::read_all_tensors(path_);
  }
  absl::Status open() {
    testing::write_safetensors(path_, tensors_);
    auto view = open_bfl_transformer(path_, config_, "dev/config.json");
    return view.ok() ? absl::OkStatus() : view.status();
  }

  testing::TempDir dir_;
  nlohmann::json config_;
  std::string path_;
  std::map<std::string, testing::RawTensor> tensors_;
};

TEST_F(BflErrorTest, MissingTensorNamesItsDiffusersTensors) {
  tensors_.erase("double_blocks.1.txt_attn.qkv.weight");
  tensors_.erase("single_blocks.0.norm.key_norm.scale");
  const absl::Status status = open();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path_ + ": Black Forest Labs checkpoint does not match "
                                                  "dev/config.json"));
  EXPECT_THAT(status.message(),
              HasSubstr("missing tensors (diffusers names): double_blocks.1.txt_attn.qkv.weight "
                        "(transformer_blocks.1.attn.add_q_proj.weight, "
                        "transformer_blocks.1.attn.add_k_proj.weight, "
                        "transformer_blocks.1.attn.add_v_proj.weight), "
                        "single_blocks.0.norm.key_norm.scale "
                        "(single_transformer_blocks.0.attn.norm_k.weight)"));
}

TEST_F(BflErrorTest, TensorWithoutCounterpartIsNamed) {
  tensors_["double_blocks.0.img_attn.qkv.bias"] =
      testing::f32_tensor({192}, std::vector<float>(192));
  tensors_["vae.decoder.conv_in.weight"] = testing::f32_tensor({1}, {0.0f});
  const absl::Status status = open();
  EXPECT_THAT(status.message(), HasSubstr("tensors with no diffusers counterpart: "
                                          "double_blocks.0.img_attn.qkv.bias, "
                                          "vae.decoder.conv_in.weight"));
}

TEST_F(BflErrorTest, WrongShapeIsNamed) {
  testing::RawTensor& linear2 = tensors_["single_blocks.1.linear2.weight"];
  linear2.shape = {linear2.shape[1], linear2.shape[0]};
  const absl::Status status = open();
  EXPECT_THAT(status.message(),
              HasSubstr("wrong shape: single_blocks.1.linear2.weight is [256, 64], "
                        "expected [64, 256]"));
}

TEST_F(BflErrorTest, ConfigWithoutGuidanceLeavesTheGuidanceEmbedderUnmatched) {
  config_["guidance_embeds"] = false;
  const absl::Status status = open();
  EXPECT_THAT(status.message(), HasSubstr("tensors with no diffusers counterpart: "
                                          "guidance_in.in_layer.weight, "
                                          "guidance_in.out_layer.weight"));
}

TEST_F(BflErrorTest, ConfigWithMoreBlocksNamesTheMissingOnes) {
  config_["num_single_layers"] = 3;
  const absl::Status status = open();
  EXPECT_THAT(status.message(), HasSubstr("single_blocks.2.linear1.weight "
                                          "(single_transformer_blocks.2.attn.to_qkv_mlp_proj."
                                          "weight)"));
}

TEST_F(BflErrorTest, DiffusersFileIsRefused) {
  auto view = open_bfl_transformer(
      transformer_dir("tiny-dev") + "/diffusion_pytorch_model.safetensors", config_, "c.json");
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(view.status().message(),
              HasSubstr("not a FLUX.2 transformer in Black Forest Labs naming"));
}

TEST_F(BflErrorTest, BadConfigIsNamed) {
  config_["num_attention_heads"] = 0;
  const absl::Status status = open();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("dev/config.json"));
}

}  // namespace
}  // namespace flux2
