// Tests of model/lora_adapter.h: diffusers' own conversion of four adapters reproduced bit for bit
// (tests/data/tiny-klein/lora_converted), every other layout against its equivalent, and refusals.
#include "model/lora_adapter.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/base/dtype.h"
#include "model/json_util.h"
#include "model/lora_targets.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_configs.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using testing::RawTensor;

std::string tiny_klein() {
  return testing::test_data_dir() + "/tiny-klein";
}

// The tiny-klein transformer config, optionally with its heads multiplied (a bigger variant).
// The tiny klein's config, with `head_factor` times its heads and `extra_blocks` more blocks of
// each kind (another variant, as klein-9B is to klein-4B).
Flux2Config tiny_config(int64_t head_factor = 1, int64_t extra_blocks = 0) {
  auto json = read_json_file(tiny_klein() + "/checkpoint/transformer/config.json");
  EXPECT_TRUE(json.ok()) << json.status();
  (*json)["num_attention_heads"] = (*json)["num_attention_heads"].get<int64_t>() * head_factor;
  for (const char* blocks : {"num_layers", "num_single_layers"}) {
    (*json)[blocks] = (*json)[blocks].get<int64_t>() + extra_blocks;
  }
  auto config = Flux2Config::from_json(*json, "config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<uint32_t> bits(const std::vector<float>& values) {
  std::vector<uint32_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
  return out;
}

std::vector<float> random_values(int64_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = uniform(generator);
  return values;
}

std::vector<float> bf16_values(std::vector<float> values) {
  for (float& value : values) value = round_to_bf16(value);
  return values;
}

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of a row-major [*, width] matrix.
std::vector<float> block(const std::vector<float>& matrix, int64_t width, int64_t row0,
                         int64_t rows, int64_t col0, int64_t cols) {
  std::vector<float> out;
  for (int64_t r = row0; r < row0 + rows; ++r) {
    for (int64_t c = col0; c < col0 + cols; ++c) out.push_back(matrix[r * width + c]);
  }
  return out;
}

// An adapter file built in memory.
class AdapterFile {
 public:
  AdapterFile& add(const std::string& name, std::vector<int64_t> shape,
                   const std::vector<float>& values, DType dtype = DType::kF32) {
    RawTensor tensor;
    tensor.dtype = std::string(dtype_name(dtype));
    tensor.shape = std::move(shape);
    for (float value : values) {
      if (dtype == DType::kBF16) {
        const uint16_t half = f32_to_bf16_bits(value);
        tensor.bytes.insert(tensor.bytes.end(),
                            {static_cast<uint8_t>(half & 0xff), static_cast<uint8_t>(half >> 8)});
      } else {
        const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
        tensor.bytes.insert(tensor.bytes.end(), bytes, bytes + sizeof(float));
      }
    }
    tensors_[name] = std::move(tensor);
    return *this;
  }
  AdapterFile& raw(const std::string& name, RawTensor tensor) {
    tensors_[name] = std::move(tensor);
    return *this;
  }
  AdapterFile& metadata(const std::string& key, const std::string& value) {
    metadata_[key] = value;
    return *this;
  }
  std::vector<uint8_t> bytes() const {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::vector<uint8_t> data;
    for (const auto& [name, tensor] : tensors_) {
      header[name] = {{"dtype", tensor.dtype},
                      {"shape", tensor.shape},
                      {"data_offsets", {data.size(), data.size() + tensor.bytes.size()}}};
      data.insert(data.end(), tensor.bytes.begin(), tensor.bytes.end());
    }
    const std::string text = header.dump();
    const uint64_t length = text.size();
    std::string file(sizeof(length), '\0');
    std::memcpy(file.data(), &length, sizeof(length));
    file += text;
    file.append(data.begin(), data.end());
    return std::vector<uint8_t>(file.begin(), file.end());
  }

 private:
  std::map<std::string, RawTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

LoraAdapter parse_ok(const std::vector<uint8_t>& bytes, const Flux2Config& config) {
  auto adapter = parse_lora_adapter(bytes, config);
  EXPECT_TRUE(adapter.ok()) << adapter.status();
  return adapter.ok() ? *std::move(adapter) : LoraAdapter{};
}

const LoraModule* find_module(const LoraAdapter& adapter, const std::string& name) {
  for (const LoraModule& module : adapter.modules) {
    if (module.module == name) return &module;
  }
  ADD_FAILURE() << "no module " << name;
  return nullptr;
}

bool has_deviation(const LoraAdapter& adapter, const std::string& tag) {
  for (const std::string& phrase : adapter.deviations) {
    if (phrase.find(tag) != std::string::npos) return true;
  }
  return false;
}

// Same modules with the same ranks and bit-identical A and B.
void expect_same_values(const LoraAdapter& x, const LoraAdapter& y) {
  ASSERT_EQ(x.modules.size(), y.modules.size());
  for (size_t i = 0; i < x.modules.size(); ++i) {
    SCOPED_TRACE(x.modules[i].module);
    EXPECT_EQ(x.modules[i].module, y.modules[i].module);
    EXPECT_EQ(x.modules[i].rank, y.modules[i].rank);
    EXPECT_EQ(bits(x.modules[i].a), bits(y.modules[i].a));
    EXPECT_EQ(bits(x.modules[i].b), bits(y.modules[i].b));
  }
}

// ---------------------------------------------------------------------------------------------

TEST(LoraAdapterGolden, EveryAdapterMatchesDiffusersBitExactly) {
  const Flux2Config config = tiny_config();
  auto cases = read_json_file(tiny_klein() + "/lora_cases.json");
  ASSERT_TRUE(cases.ok()) << cases.status();
  auto golden = SafetensorsFile::open(tiny_klein() + "/lora_converted.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::map<std::string, LoraLayout> layouts = {{"style", LoraLayout::kDiffusers},
                                                     {"bfl", LoraLayout::kBfl},
                                                     {"fal", LoraLayout::kFal},
                                                     {"kohya", LoraLayout::kKohya}};
  ASSERT_EQ((*cases)["adapters"].size(), layouts.size());
  for (const auto& [name, entry] : (*cases)["adapters"].items()) {
    SCOPED_TRACE(name);
    const LoraAdapter adapter =
        parse_ok(read_bytes(tiny_klein() + "/" + entry["file"].get<std::string>()), config);
    EXPECT_EQ(adapter.layout, layouts.at(name));
    std::set<std::string> expected, parsed;
    for (const SafetensorsEntry& tensor : (*golden)->entries()) {
      const std::string prefix = name + ".";
      if (tensor.name.rfind(prefix, 0) == 0 && tensor.name.ends_with(".A")) {
        expected.insert(tensor.name.substr(prefix.size(), tensor.name.size() - prefix.size() - 2));
      }
    }
    for (const LoraModule& module : adapter.modules) {
      SCOPED_TRACE(module.module);
      parsed.insert(module.module);
      const std::string key = name + "." + module.module;
      auto a = read_f32(**golden, key + ".A");
      auto b = read_f32(**golden, key + ".B");
      ASSERT_TRUE(a.ok() && b.ok()) << key;
      EXPECT_EQ(bits(module.a), bits(*a));
      EXPECT_EQ(bits(module.b), bits(*b));
      const auto& scaling = (*cases)["scalings"][key];
      EXPECT_EQ(module.rank, scaling["r"].get<int64_t>());
      EXPECT_EQ(module.alpha, scaling["lora_alpha"].get<double>());
      EXPECT_EQ(module.scaling(), static_cast<float>(scaling["scaling"].get<double>()));
      EXPECT_EQ(module.a.size(), static_cast<size_t>(module.rank * module.in_features));
      EXPECT_EQ(module.b.size(), static_cast<size_t>(module.out_features * module.rank));
    }
    EXPECT_FALSE(expected.empty());
    EXPECT_EQ(parsed, expected);
    EXPECT_TRUE(adapter.deviations.empty());  // none of the golden adapters needs one
  }
}

// ---------------------------------------------------------------------------------------------
// Synthetic layouts against their equivalents. Tiny klein: D 96, F 288, 2 double, 3 single blocks.

constexpr int64_t kD = 96, kF = 288;

// A BFL-named adapter: fused qkv, a single block's linear2 and img_in at rank 4.
AdapterFile bfl_adapter(const std::string& prefix, bool down_up, float alpha = 0.0f) {
  const char* a = down_up ? ".lora_down.weight" : ".lora_A.weight";
  const char* b = down_up ? ".lora_up.weight" : ".lora_B.weight";
  AdapterFile file;
  const std::map<std::string, std::pair<int64_t, int64_t>> shapes = {
      {"double_blocks.0.img_attn.qkv", {3 * kD, kD}},
      {"single_blocks.1.linear2", {kD, kD + kF}},
      {"img_in", {kD, 128}}};
  uint32_t seed = 1;
  for (const auto& [name, shape] : shapes) {
    file.add(prefix + name + a, {4, shape.second}, random_values(4 * shape.second, seed++));
    file.add(prefix + name + b, {shape.first, 4}, random_values(shape.first * 4, seed++));
    if (alpha != 0.0f) file.add(prefix + name + ".alpha", {}, {alpha});
  }
  return file;
}

TEST(LoraAdapterLayouts, BflDownUpEqualsBflWithAlphaThroughScaling) {
  const Flux2Config config = tiny_config();
  const LoraAdapter bfl = parse_ok(bfl_adapter("diffusion_model.", false).bytes(), config);
  const LoraAdapter down_up = parse_ok(bfl_adapter("diffusion_model.", true, 3.0f).bytes(), config);
  EXPECT_EQ(bfl.layout, LoraLayout::kBfl);
  EXPECT_EQ(down_up.layout, LoraLayout::kBflDownUp);
  expect_same_values(bfl, down_up);
  EXPECT_EQ(bfl.modules.size(), 5u);  // to_q, to_k, to_v, to_out, x_embedder
  for (size_t i = 0; i < bfl.modules.size(); ++i) {
    EXPECT_EQ(bfl.modules[i].alpha, 4.0);
    EXPECT_EQ(bfl.modules[i].scaling(), 1.0f);
    EXPECT_EQ(down_up.modules[i].alpha, 3.0);
    EXPECT_EQ(down_up.modules[i].scaling(), 0.75f);
  }
  EXPECT_TRUE(has_deviation(down_up, "(Q2)"));
  // diffusers' qkv split: one A shared by q, k, v; B's row thirds in q, k, v order.
  const std::vector<float> qkv_b = random_values(3 * kD * 4, 2);
  const char* parts[] = {"to_q", "to_k", "to_v"};
  for (int64_t i = 0; i < 3; ++i) {
    const LoraModule* module =
        find_module(bfl, absl::StrCat("transformer_blocks.0.attn.", parts[i]));
    ASSERT_NE(module, nullptr);
    EXPECT_EQ(bits(module->a), bits(random_values(4 * kD, 1)));
    EXPECT_EQ(bits(module->b), bits(block(qkv_b, 4, i * kD, kD, 0, 4)));
  }
}

TEST(LoraAdapterLayouts, FalBareBflAndAlphaKeysEqualBfl) {
  const Flux2Config config = tiny_config();
  const LoraAdapter bfl = parse_ok(bfl_adapter("diffusion_model.", false).bytes(), config);
  const LoraAdapter fal = parse_ok(bfl_adapter("base_model.model.", false).bytes(), config);
  const LoraAdapter bare = parse_ok(bfl_adapter("", false).bytes(), config);
  const LoraAdapter with_alpha =
      parse_ok(bfl_adapter("diffusion_model.", false, 2.0f).bytes(), config);
  EXPECT_EQ(fal.layout, LoraLayout::kFal);
  EXPECT_EQ(bare.layout, LoraLayout::kBareBfl);
  expect_same_values(bfl, fal);
  expect_same_values(bfl, bare);
  expect_same_values(bfl, with_alpha);
  EXPECT_TRUE(has_deviation(bare, "(Q4)"));
  EXPECT_TRUE(has_deviation(with_alpha, "(Q3)"));
  EXPECT_EQ(with_alpha.modules[0].scaling(), 0.5f);
}

// A diffusers-named adapter under `prefix`.
AdapterFile diffusers_adapter(const std::string& prefix, const Flux2Config& config) {
  const auto targets = flux2_lora_targets(config);
  AdapterFile file;
  uint32_t seed = 10;
  for (const char* name :
       {"transformer_blocks.1.attn.to_q", "single_transformer_blocks.2.attn.to_out", "x_embedder",
        "norm_out.linear", "transformer_blocks.0.ff.linear_in"}) {
    const LoraTarget& target = targets.at(name);
    file.add(prefix + name + ".lora_A.weight", {2, target.in_features},
             random_values(2 * target.in_features, seed++));
    file.add(prefix + name + ".lora_B.weight", {target.out_features, 2},
             random_values(target.out_features * 2, seed++));
  }
  return file;
}

TEST(LoraAdapterLayouts, DiffusersNamesAndBareDiffusersEqualDiffusers) {
  const Flux2Config config = tiny_config();
  const LoraAdapter diffusers = parse_ok(diffusers_adapter("transformer.", config).bytes(), config);
  const LoraAdapter names = parse_ok(diffusers_adapter("diffusion_model.", config).bytes(), config);
  const LoraAdapter bare = parse_ok(diffusers_adapter("", config).bytes(), config);
  EXPECT_EQ(diffusers.layout, LoraLayout::kDiffusers);
  EXPECT_EQ(names.layout, LoraLayout::kDiffusersNames);
  EXPECT_EQ(bare.layout, LoraLayout::kBareDiffusers);
  expect_same_values(diffusers, names);
  expect_same_values(diffusers, bare);
  EXPECT_TRUE(diffusers.deviations.empty());
  EXPECT_TRUE(has_deviation(bare, "(Q4)"));
  EXPECT_EQ(diffusers.modules.size(), 5u);
  EXPECT_EQ(diffusers.max_rank(), 2);
  EXPECT_EQ(diffusers.modules[0].module, "norm_out.linear");  // sorted by name
}

TEST(LoraAdapterLayouts, FinalAdaLnHalvesSwappedToScaleShift) {
  const Flux2Config config = tiny_config();
  const std::vector<float> a = random_values(3 * kD, 1), b = random_values(2 * kD * 3, 2);
  std::vector<float> swapped = block(b, 3, kD, kD, 0, 3);
  const std::vector<float> shift = block(b, 3, 0, kD, 0, 3);
  swapped.insert(swapped.end(), shift.begin(), shift.end());
  for (const auto& [prefix, a_suffix, b_suffix] :
       {std::tuple{"diffusion_model.final_layer.adaLN_modulation.1", ".lora_A.weight",
                   ".lora_B.weight"},
        std::tuple{"lora_unet_final_layer_adaLN_modulation_1", ".lora_down.weight",
                   ".lora_up.weight"}}) {
    SCOPED_TRACE(prefix);
    AdapterFile file;
    file.add(std::string(prefix) + a_suffix, {3, kD}, a);
    file.add(std::string(prefix) + b_suffix, {2 * kD, 3}, b);
    const LoraAdapter adapter = parse_ok(file.bytes(), config);
    ASSERT_EQ(adapter.modules.size(), 1u);
    EXPECT_EQ(adapter.modules[0].module, "norm_out.linear");
    EXPECT_EQ(bits(adapter.modules[0].a), bits(a));
    EXPECT_EQ(bits(adapter.modules[0].b), bits(swapped));
    EXPECT_TRUE(has_deviation(adapter, "(Q1)"));
    EXPECT_EQ(has_deviation(adapter, "(Q5)"), adapter.layout == LoraLayout::kKohya);
  }
}

// A kohya qkv with rank 6 and alpha 2 (f32): diffusers' scale_down 2/3 (f32), scale_up 1/2.
AdapterFile kohya_qkv(const std::vector<float>& down, const std::vector<float>& up) {
  AdapterFile file;
  file.add("lora_unet_double_blocks_1_txt_attn_qkv.lora_down.weight", {6, kD}, down);
  file.add("lora_unet_double_blocks_1_txt_attn_qkv.lora_up.weight", {3 * kD, 6}, up);
  file.add("lora_unet_double_blocks_1_txt_attn_qkv.alpha", {}, {2.0f});
  return file;
}

TEST(LoraAdapterLayouts, KohyaSplitQkvGivesRankThirds) {
  const Flux2Config config = tiny_config();
  const std::vector<float> down = random_values(6 * kD, 3);
  std::vector<float> up = random_values(3 * kD * 6, 4);
  for (int64_t row = 0; row < 3 * kD; ++row) {
    for (int64_t col = 0; col < 6; ++col) {
      if (row / kD != col / 2) up[row * 6 + col] = 0.0f;
    }
  }
  const float scale_down = 2.0f / 6.0f * 2.0f;  // exact in float: doubling
  const char* parts[] = {"add_q_proj", "add_k_proj", "add_v_proj"};
  const LoraAdapter split = parse_ok(kohya_qkv(down, up).bytes(), config);
  ASSERT_EQ(split.modules.size(), 3u);
  for (int64_t i = 0; i < 3; ++i) {
    const LoraModule* module =
        find_module(split, absl::StrCat("transformer_blocks.1.attn.", parts[i]));
    ASSERT_NE(module, nullptr);
    EXPECT_EQ(module->rank, 2);
    EXPECT_EQ(module->alpha, 2.0);
    std::vector<float> a = block(down, kD, 2 * i, 2, 0, kD), b = block(up, 6, i * kD, kD, 2 * i, 2);
    for (float& value : a) value *= scale_down;
    for (float& value : b) value *= 0.5f;
    EXPECT_EQ(bits(module->a), bits(a));
    EXPECT_EQ(bits(module->b), bits(b));
  }
  up[5] = 0.25f;  // an off-diagonal value: all three share the whole down at rank 6
  const LoraAdapter shared = parse_ok(kohya_qkv(down, up).bytes(), config);
  ASSERT_EQ(shared.modules.size(), 3u);
  for (const LoraModule& module : shared.modules) {
    EXPECT_EQ(module.rank, 6);
    EXPECT_EQ(module.alpha, 6.0);
    EXPECT_EQ(module.scaling(), 1.0f);
    EXPECT_EQ(module.a.size(), static_cast<size_t>(6 * kD));
  }
}

TEST(LoraAdapterLayouts, KohyaQkvScaleIsComputedInTheAlphaDtype) {
  const Flux2Config config = tiny_config();
  const std::vector<float> down = bf16_values(random_values(3 * kD, 5));
  const std::vector<float> up = bf16_values(random_values(3 * kD * 3, 6));
  const std::vector<float> in_down = bf16_values(random_values(3 * 128, 7));
  const std::vector<float> in_up = bf16_values(random_values(kD * 3, 8));
  AdapterFile file;
  file.add("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", {3, kD}, down, DType::kBF16);
  file.add("lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", {3 * kD, 3}, up, DType::kBF16);
  file.add("lora_unet_double_blocks_0_img_attn_qkv.alpha", {}, {1.0f}, DType::kBF16);
  file.add("lora_unet_img_in.lora_down.weight", {3, 128}, in_down, DType::kBF16);
  file.add("lora_unet_img_in.lora_up.weight", {kD, 3}, in_up, DType::kBF16);
  file.add("lora_unet_img_in.alpha", {}, {1.0f}, DType::kBF16);
  const LoraAdapter adapter = parse_ok(file.bytes(), config);
  // qkv: bf16(1 / 3) = 0.333984375, doubled once; img_in: (1.0 / 3) * 2 in double, then float.
  const float qkv_scale = 0.66796875f, double_scale = static_cast<float>(1.0 / 3 * 2);
  const LoraModule* to_k = find_module(adapter, "transformer_blocks.0.attn.to_k");
  const LoraModule* x_embedder = find_module(adapter, "x_embedder");
  ASSERT_TRUE(to_k != nullptr && x_embedder != nullptr);
  int differing = 0;
  for (size_t i = 0; i < down.size(); ++i) {
    EXPECT_EQ(to_k->a[i], round_to_bf16(down[i] * qkv_scale)) << i;
    differing += round_to_bf16(down[i] * qkv_scale) != round_to_bf16(down[i] * double_scale);
  }
  EXPECT_GT(differing, 0);  // the test tells the two scales apart
  for (size_t i = 0; i < in_down.size(); ++i) {
    EXPECT_EQ(x_embedder->a[i], round_to_bf16(in_down[i] * double_scale)) << i;
  }
  const std::vector<float> k_rows = block(up, 3, kD, kD, 0, 3);
  for (size_t i = 0; i < k_rows.size(); ++i) {
    EXPECT_EQ(to_k->b[i], round_to_bf16(k_rows[i] * 0.5f)) << i;
  }
  EXPECT_EQ(to_k->scaling(), 1.0f);
}

TEST(LoraAdapterLayouts, MetadataPatternsAndRsLora) {
  const Flux2Config config = tiny_config();
  AdapterFile file;
  for (const auto& [module, rank, in, out] :
       {std::tuple{"transformer_blocks.0.attn.to_q", 4, kD, kD},
        std::tuple{"transformer_blocks.0.attn.to_k", 4, kD, kD},
        std::tuple{"proj_out", 2, kD, int64_t{128}}}) {
    file.add(absl::StrCat("transformer.", module, ".lora_A.weight"), {rank, in},
             random_values(rank * in, 1));
    file.add(absl::StrCat("transformer.", module, ".lora_B.weight"), {out, rank},
             random_values(out * rank, 2));
  }
  file.metadata("lora_adapter_metadata",
                R"({"transformer.r": 4, "transformer.lora_alpha": 8,
                    "transformer.rank_pattern": {"proj_out": 2},
                    "transformer.alpha_pattern": {"attn.to_q": 3},
                    "transformer.use_rslora": true, "transformer.use_dora": false})");
  const LoraAdapter adapter = parse_ok(file.bytes(), config);
  const LoraModule* to_q = find_module(adapter, "transformer_blocks.0.attn.to_q");
  const LoraModule* to_k = find_module(adapter, "transformer_blocks.0.attn.to_k");
  const LoraModule* proj_out = find_module(adapter, "proj_out");
  ASSERT_TRUE(to_q != nullptr && to_k != nullptr && proj_out != nullptr);
  EXPECT_EQ(to_q->alpha, 3.0);
  EXPECT_EQ(to_k->alpha, 8.0);
  EXPECT_EQ(proj_out->alpha, 8.0);
  EXPECT_TRUE(to_q->rslora);
  EXPECT_EQ(to_q->scaling(), 1.5f);
  EXPECT_EQ(to_k->scaling(), 4.0f);
  EXPECT_EQ(proj_out->scaling(), static_cast<float>(8.0 / std::sqrt(2.0)));
  EXPECT_EQ(proj_out->scaling(0.7), static_cast<float>((0.7 * 8.0) / std::sqrt(2.0)));
}

TEST(LoraAdapterLayouts, ScalingIsPeftsDoubleExpression) {
  LoraModule module;
  module.rank = 3;
  module.alpha = 2.0;
  EXPECT_EQ(module.scaling(), static_cast<float>(2.0 / 3));
  EXPECT_EQ(module.scaling(0.3), static_cast<float>((0.3 * 2.0) / 3));
  EXPECT_EQ(module.scaling(-1.5), static_cast<float>((-1.5 * 2.0) / 3));
}

// ---------------------------------------------------------------------------------------------
// Refusals, each with its exact message.

struct RefusalCase {
  std::string name;
  std::vector<uint8_t> bytes;
  std::string message;
  int64_t max_rank = 256;
  double max_scale = 8.0;
};

// x_embedder at rank 4 under `prefix` (valid), for cases that add one bad thing.
AdapterFile x_embedder(const std::string& prefix = "transformer.", int64_t a_rank = 4,
                       int64_t b_rank = 4) {
  AdapterFile file;
  file.add(prefix + "x_embedder.lora_A.weight", {a_rank, 128}, random_values(a_rank * 128, 1));
  file.add(prefix + "x_embedder.lora_B.weight", {kD, b_rank}, random_values(kD * b_rank, 2));
  return file;
}

RawTensor tensor_of(const std::string& dtype, std::vector<int64_t> shape, size_t bytes) {
  RawTensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.bytes.assign(bytes, 0);
  return tensor;
}

// Every module of the transformer of `config` at rank 2, diffusers layout.
AdapterFile full_adapter(const Flux2Config& config) {
  AdapterFile file;
  for (const auto& [module, target] : flux2_lora_targets(config)) {
    file.add("transformer." + module + ".lora_A.weight", {2, target.in_features},
             std::vector<float>(2 * target.in_features, 0.5f));
    file.add("transformer." + module + ".lora_B.weight", {target.out_features, 2},
             std::vector<float>(target.out_features * 2, 0.5f));
  }
  return file;
}

std::vector<RefusalCase> refusal_cases() {
  const std::vector<float> one(4 * kD, 0.5f);
  std::vector<RefusalCase> cases;
  cases.push_back(
      {"empty", AdapterFile().metadata("format", "pt").bytes(), "no LoRA tensors in the file"});
  cases.push_back({"unknown key",
                   x_embedder()
                       .add("transformer.foo.lora_A.weight", {4, kD}, one)
                       .add("transformer.foo.lora_B.weight", {kD, 4}, one)
                       .bytes(),
                   "unknown key 'transformer.foo.lora_A.weight' (and 1 more): no FLUX.2 module "
                   "'foo'"});
  cases.push_back({"not a LoRA tensor",
                   x_embedder().add("transformer.x_embedder.weight", {1}, {1}).bytes(),
                   "unknown key 'transformer.x_embedder.weight': not a LoRA tensor (lora_A, "
                   "lora_B, lora_down, lora_up or alpha)"});
  cases.push_back({"block beyond the model",
                   x_embedder("diffusion_model.")
                       .add("diffusion_model.double_blocks.7.img_mlp.0.lora_A.weight", {4, kD}, one)
                       .bytes(),
                   "unknown key 'diffusion_model.double_blocks.7.img_mlp.0.lora_A.weight': no "
                   "FLUX.2 module 'double_blocks.7.img_mlp.0' (this model has 2 double and 3 "
                   "single blocks: an adapter for another FLUX.2 variant?)"});
  cases.push_back({"single block beyond the model, kohya",
                   AdapterFile()
                       .add("lora_unet_single_blocks_3_linear2.lora_down.weight", {4, kD}, one)
                       .add("lora_unet_single_blocks_3_linear2.lora_up.weight", {kD, 4}, one)
                       .bytes(),
                   "unknown key 'lora_unet_single_blocks_3_linear2.lora_down.weight' (and 1 more): "
                   "no FLUX.2 module 'single_blocks_3_linear2' (this model has 2 double and 3 "
                   "single blocks: an adapter for another FLUX.2 variant?)"});
  // A larger variant's adapter (klein-9B's on klein-4B: more blocks, wider matrices) is refused
  // by the shapes of the modules both have, naming both shapes, not by its extra blocks' keys.
  cases.push_back({"a larger variant", full_adapter(tiny_config(2, 1)).bytes(),
                   "context_embedder: lora_A [2, 96] / lora_B [192, 2] do not fit [96, 96] (an "
                   "adapter for another FLUX.2 variant?)"});
  cases.push_back(
      {"more blocks of the same width", full_adapter(tiny_config(1, 1)).bytes(),
       "unknown key 'transformer.single_transformer_blocks.3.attn.to_out.lora_A.weight' "
       "(and 27 more): no FLUX.2 module 'single_transformer_blocks.3.attn.to_out' (this "
       "model has 2 double and 3 single blocks: an adapter for another FLUX.2 "
       "variant?)"});
  cases.push_back(
      {"FLUX.1",
       AdapterFile()
           .add("transformer.transformer_blocks.0.ff.net.0.proj.lora_A.weight", {4, kD}, one)
           .add("transformer.transformer_blocks.0.norm1.linear.lora_A.weight", {4, kD}, one)
           .bytes(),
       "keys look like FLUX.1 (ff.net.0.proj, norm1.linear): not a FLUX.2 adapter"});
  cases.push_back(
      {"FLUX.1 kohya",
       AdapterFile()
           .add("lora_unet_single_blocks_0_modulation_lin.lora_down.weight", {4, kD}, one)
           .bytes(),
       "keys look like FLUX.1 (modulation.lin): not a FLUX.2 adapter"});
  const std::string dora = "DoRA (lora_magnitude_vector / dora_scale) is not supported";
  cases.push_back(
      {"DoRA magnitude",
       x_embedder()
           .add("transformer.x_embedder.lora_magnitude_vector", {kD}, std::vector<float>(kD, 1))
           .bytes(),
       dora});
  cases.push_back({"DoRA scale",
                   AdapterFile()
                       .add("lora_unet_img_in.dora_scale", {1, 128}, std::vector<float>(128, 1))
                       .bytes(),
                   dora});
  cases.push_back(
      {"DoRA metadata",
       x_embedder().metadata("lora_adapter_metadata", R"({"transformer.use_dora": true})").bytes(),
       dora});
  const std::string lokr = "LoKr/LoHa (lokr_w1 / hada_w1_a) is not supported";
  cases.push_back(
      {"LoKr",
       AdapterFile().add("lora_unet_img_in.lokr_w1", {4, 4}, std::vector<float>(16, 1)).bytes(),
       lokr});
  cases.push_back(
      {"LoHa",
       AdapterFile().add("lora_unet_img_in.hada_w1_a", {4, 4}, std::vector<float>(16, 1)).bytes(),
       lokr});
  cases.push_back(
      {"text encoder",
       AdapterFile()
           .add("lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight", {4, 8},
                std::vector<float>(32, 1))
           .add("lora_unet_img_in.lora_down.weight", {4, 128}, std::vector<float>(512, 1))
           .bytes(),
       "text-encoder keys (lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight) "
       "are not supported: FLUX.2 adapters apply to the transformer only"});
  cases.push_back(
      {"text encoder (diffusers)",
       x_embedder()
           .add("text_encoder.q_proj.lora_A.weight", {4, 8}, std::vector<float>(32, 1))
           .bytes(),
       "text-encoder keys (text_encoder.q_proj.lora_A.weight) are not supported: FLUX.2 "
       "adapters apply to the transformer only"});
  cases.push_back({"lora_B bias",
                   x_embedder()
                       .add("transformer.x_embedder.lora_B.bias", {kD}, std::vector<float>(kD, 1))
                       .bytes(),
                   "lora_B bias is not supported"});
  cases.push_back(
      {"lora_bias metadata",
       x_embedder().metadata("lora_adapter_metadata", R"({"transformer.lora_bias": true})").bytes(),
       "lora_B bias is not supported"});
  cases.push_back(
      {"A without B",
       AdapterFile()
           .add("transformer.x_embedder.lora_A.weight", {4, 128}, std::vector<float>(512, 1))
           .bytes(),
       "x_embedder: lora_A without lora_B"});
  cases.push_back({"up without down",
                   AdapterFile()
                       .add("lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", {3 * kD, 4},
                            std::vector<float>(3 * kD * 4, 1))
                       .bytes(),
                   "transformer_blocks.0.attn.to_q/to_k/to_v: lora_up without lora_down"});
  cases.push_back({"alpha alone",
                   x_embedder().add("transformer.proj_out.alpha", {}, {1.0f}).bytes(),
                   "proj_out: alpha without lora_A / lora_B"});
  cases.push_back({"rank mismatch", x_embedder("transformer.", 16, 32).bytes(),
                   "lora_A rank 16 != lora_B rank 32 at x_embedder"});
  cases.push_back({"another variant", full_adapter(tiny_config(2)).bytes(),
                   "context_embedder: lora_A [2, 96] / lora_B [192, 2] do not fit [96, 96] (an "
                   "adapter for another FLUX.2 variant?)"});
  cases.push_back({"qkv of another variant",
                   AdapterFile()
                       .add("diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight",
                            {4, 2 * kD}, std::vector<float>(8 * kD, 1))
                       .add("diffusion_model.double_blocks.0.img_attn.qkv.lora_B.weight",
                            {6 * kD, 4}, std::vector<float>(24 * kD, 1))
                       .bytes(),
                   "transformer_blocks.0.attn.to_q/to_k/to_v: lora_A [4, 192] / lora_B [576, 4] do "
                   "not fit [288, 96] (an adapter for another FLUX.2 variant?)"});
  cases.push_back({"rank 0", x_embedder("transformer.", 0, 0).bytes(),
                   "rank 0 at x_embedder: an adapted module needs rank >= 1"});
  cases.push_back({"rank above the limit", x_embedder("transformer.", 8, 8).bytes(),
                   "rank 8 at x_embedder exceeds --max-lora-rank 4", 4});
  std::vector<float> nan_values(kD * 4, 0.5f);
  nan_values[7] = std::nanf("");
  cases.push_back(
      {"non-finite",
       x_embedder().add("transformer.x_embedder.lora_B.weight", {kD, 4}, nan_values).bytes(),
       "non-finite values in transformer.x_embedder.lora_B.weight"});
  cases.push_back({"non-finite alpha",
                   x_embedder().add("transformer.x_embedder.alpha", {}, {INFINITY}).bytes(),
                   "non-finite values in transformer.x_embedder.alpha"});
  cases.push_back(
      {"integer dtype",
       x_embedder()
           .raw("transformer.x_embedder.lora_A.weight", tensor_of("I64", {4, 128}, 4 * 128 * 8))
           .bytes(),
       "'transformer.x_embedder.lora_A.weight' has dtype I64: LoRA tensors must be F32, "
       "BF16 or F16"});
  cases.push_back({"alpha not a scalar",
                   x_embedder().add("transformer.x_embedder.alpha", {2}, {1, 2}).bytes(),
                   "'transformer.x_embedder.alpha' is [2]: alpha must be a scalar"});
  // Found by fuzz_lora_adapter: kohya's baking of alpha <= 0 never ended.
  for (const float alpha : {0.0f, -2.0f}) {
    cases.push_back(
        {"alpha not positive",
         AdapterFile()
             .add("lora_unet_img_in.lora_down.weight", {4, 128}, std::vector<float>(512, 1))
             .add("lora_unet_img_in.lora_up.weight", {kD, 4}, std::vector<float>(kD * 4, 1))
             .add("lora_unet_img_in.alpha", {}, {alpha})
             .bytes(),
         absl::StrCat("'lora_unet_img_in.alpha' is ", alpha, ": alpha must be positive")});
  }
  // Found by fuzz_lora_adapter: finite factors whose baked product overflows float.
  cases.push_back(
      {"baked alpha overflows",
       AdapterFile()
           .add("lora_unet_img_in.lora_down.weight", {4, 128}, std::vector<float>(512, 3e38f))
           .add("lora_unet_img_in.lora_up.weight", {kD, 4}, std::vector<float>(kD * 4, 1))
           .add("lora_unet_img_in.alpha", {}, {3e38f})
           .bytes(),
       "non-finite values in x_embedder once its alpha is baked in"});
  cases.push_back(
      {"mixes layouts",
       x_embedder()
           .add("diffusion_model.img_in.lora_A.weight", {4, 128}, std::vector<float>(512, 1))
           .add("diffusion_model.img_in.lora_B.weight", {kD, 4}, std::vector<float>(kD * 4, 1))
           .bytes(),
       "mixes layouts: 'diffusion_model.img_in' (bfl) and 'transformer.x_embedder' "
       "(diffusers)"});
  cases.push_back(
      {"module twice",
       x_embedder("diffusion_model.")
           .add("diffusion_model.sformer_blocks.0.attn.to_q.lora_A.weight", {4, kD}, one)
           .add("diffusion_model.sformer_blocks.0.attn.to_q.lora_B.weight", {kD, 4}, one)
           .add("diffusion_model.transformer_blocks.0.attn.to_q.lora_A.weight", {4, kD}, one)
           .add("diffusion_model.transformer_blocks.0.attn.to_q.lora_B.weight", {kD, 4}, one)
           .bytes(),
       "transformer_blocks.0.attn.to_q given twice ('diffusion_model.sformer_blocks.0.attn.to_q', "
       "'diffusion_model.transformer_blocks.0.attn.to_q')"});
  // A scaling beyond float32 at the largest |scale| a request may give (inf x 0: black images).
  cases.push_back({"lora_alpha beyond float32",
                   x_embedder()
                       .metadata("lora_adapter_metadata",
                                 R"({"transformer.r": 4, "transformer.lora_alpha": 1e300})")
                       .bytes(),
                   "x_embedder: lora_alpha 1e+300 over rank 4 at |scale| 8 is not a finite "
                   "float32 scaling"});
  cases.push_back({"alpha_pattern beyond float32 at the largest scale",
                   x_embedder()
                       .metadata("lora_adapter_metadata",
                                 R"({"transformer.r": 4, "transformer.use_rslora": true,
                                     "transformer.alpha_pattern": {"x_embedder": 5e37}})")
                       .bytes(),
                   "x_embedder: lora_alpha 5e+37 over rank 4's square root (rsLoRA) at |scale| 16 "
                   "is not a finite float32 scaling",
                   256, 16.0});
  cases.push_back(
      {"metadata rank",
       x_embedder().metadata("lora_adapter_metadata", R"({"transformer.r": 8})").bytes(),
       "x_embedder: rank 4 differs from lora_adapter_metadata's rank 8"});
  cases.push_back(
      {"down/up under transformer.",
       AdapterFile()
           .add("transformer.x_embedder.lora_down.weight", {4, 128}, std::vector<float>(512, 1))
           .bytes(),
       "unknown key 'transformer.x_embedder.lora_down.weight': lora_down / lora_up are "
       "read with BFL names under 'diffusion_model.'"});
  return cases;
}

TEST(LoraAdapterRefusals, EachWithItsMessage) {
  const Flux2Config config = tiny_config();
  for (const RefusalCase& refusal : refusal_cases()) {
    SCOPED_TRACE(refusal.name);
    LoraParseOptions options;
    options.max_rank = refusal.max_rank;
    options.max_scale = refusal.max_scale;
    auto adapter = parse_lora_adapter(refusal.bytes, config, options);
    ASSERT_FALSE(adapter.ok());
    EXPECT_EQ(adapter.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(adapter.status().message()), refusal.message);
  }
}

// The scaling bound follows --max-lora-scale: a scaling finite at |scale| 8 but not at 16 loads
// under the default limit (the refusal at 16 is a case above).
TEST(LoraAdapterRefusals, TheScalingBoundIsTheLargestScaleARequestMayGive) {
  const std::vector<uint8_t> bytes =
      x_embedder()
          .metadata("lora_adapter_metadata",
                    R"({"transformer.r": 4, "transformer.use_rslora": true,
                        "transformer.alpha_pattern": {"x_embedder": 5e37}})")
          .bytes();
  auto adapter = parse_lora_adapter(bytes, tiny_config(), LoraParseOptions{});
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->modules[0].scaling(8.0), static_cast<float>(5e37 * 8 / 2));
}

TEST(LoraAdapterRefusals, NotASafetensorsFile) {
  const Flux2Config config = tiny_config();
  const std::string text = "GIF89a: not an adapter at all";
  auto adapter = parse_lora_adapter(std::vector<uint8_t>(text.begin(), text.end()), config);
  ASSERT_FALSE(adapter.ok());
  EXPECT_EQ(adapter.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StartsWith(adapter.status().message(), "not a safetensors file (header length "))
      << adapter.status();
  auto tiny = parse_lora_adapter(std::vector<uint8_t>(3, 0), config);
  EXPECT_EQ(tiny.status().message(),
            "not a safetensors file (file of 3 bytes is too short for a header)");
}

// The fuzz target's seeds (tests/fuzz/corpus/lora_adapter, the tiny config of
// tests/fuzz/fuzz_configs.h) parse, so the fuzzer starts from valid files of each family.
TEST(LoraAdapterTest, FuzzSeedsParse) {
  const Flux2Config c = fuzzing::lora_fuzz_config();
  const std::string dir = testing::test_data_dir() + "/../fuzz/corpus/lora_adapter/";
  for (const char* name : {"diffusers", "bfl", "kohya"}) {
    std::ifstream file(dir + name + ".safetensors", std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                                     std::istreambuf_iterator<char>());
    ASSERT_FALSE(bytes.empty()) << name;
    const absl::StatusOr<LoraAdapter> adapter = parse_lora_adapter(bytes, c, {.max_rank = 16});
    EXPECT_TRUE(adapter.ok()) << name << ": " << adapter.status();
  }
}

}  // namespace
}  // namespace flux2
