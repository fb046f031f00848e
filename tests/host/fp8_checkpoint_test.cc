// FP8 transformer checkpoints (model/fp8_checkpoint.h, model/transformer_checkpoint.h): every
// golden layout opens with its format and dequantizes to float(W8) * scale; per-row scales follow
// their rows through BFL's qkv split and final adaLN swap; each refusal names what it refuses.
//   build-cpu/bin/host_tests --gtest_filter='Fp8*'
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/bfl_checkpoint.h"
#include "model/fp8_checkpoint.h"
#include "model/json_util.h"
#include "model/pipeline.h"
#include "model/safetensors.h"
#include "model/transformer_checkpoint.h"
#include "tests/fuzz/fuzz_configs.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;
using testing::RawTensor;

std::string klein() {
  return testing::test_data_dir() + "/tiny-klein";
}
std::string config_path() {
  return klein() + "/checkpoint/transformer/config.json";
}
std::string bfl_file() {
  return klein() + "/fp8/bfl_fp8.safetensors";
}

absl::StatusOr<TransformerCheckpoint> open_file(const std::string& path) {
  auto config = read_json_file(config_path());
  if (!config.ok()) return config.status();
  return open_transformer_file(path, *config, config_path());
}

// The BFL FP8 golden file's tensors and metadata, to edit and write again.
struct EditableFile {
  std::map<std::string, RawTensor> tensors = testing::read_all_tensors(bfl_file());
  std::map<std::string, std::string> metadata = (*SafetensorsFile::open(bfl_file()))->metadata();

  // Writes the file into `dir` and opens it; the error message, or "" when it opened.
  std::string open_error(const testing::TempDir& dir) const {
    const std::string path = dir.path() + "/edited.safetensors";
    testing::write_safetensors(path, tensors, metadata);
    auto opened = open_file(path);
    return opened.ok() ? "" : std::string(opened.status().message());
  }
  void set_format(const std::string& layer, const std::string& format) {
    nlohmann::json json = nlohmann::json::parse(metadata.at("_quantization_metadata"));
    json["layers"][layer] = {{"format", format}};
    metadata["_quantization_metadata"] = json.dump();
  }
};

RawTensor f32_scalar(float value) {
  return testing::f32_tensor({}, {value});
}

std::vector<float> f32_values(const RawTensor& t) {
  std::vector<float> values(t.bytes.size() / 4);
  std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
  return values;
}

// ---- the golden layouts ------------------------------------------------------------------------

struct LayoutCase {
  std::string path;    // under tests/data/tiny-klein
  std::string format;  // what must be detected
  int64_t fp8_tensors;
};

class Fp8LayoutTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(Fp8LayoutTest, OpensWithItsFormatAndEveryScale) {
  auto checkpoint = open_file(klein() + "/" + GetParam().path);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->format, GetParam().format);
  EXPECT_EQ(checkpoint->fp8_tensors, GetParam().fp8_tensors);
  EXPECT_THAT(checkpoint->describe(), HasSubstr(GetParam().format));
  // Exactly the tensors of the bf16 checkpoint, by name and shape.
  auto bf16 = open_transformer_folder(klein() + "/checkpoint/transformer");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->format, "diffusers");
  ASSERT_EQ(checkpoint->weights.tensors().size(), bf16->weights.tensors().size());
  for (const auto& [name, ref] : bf16->weights.tensors()) {
    const TensorRef* found = checkpoint->weights.find(name);
    ASSERT_NE(found, nullptr) << name;
    EXPECT_EQ(found->entry->shape, ref.entry->shape) << name;
    EXPECT_EQ(found->fp8 != nullptr, found->entry->dtype == DType::kF8E4M3) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Golden, Fp8LayoutTest,
    ::testing::Values(LayoutCase{"fp8/bfl_fp8.safetensors", "bfl_fp8", 30},
                      LayoutCase{"fp8/comfy_fp8mixed.safetensors", "comfy_fp8", 18},
                      LayoutCase{"fp8/comfy_scaled_fp8.safetensors", "comfy_scaled_fp8", 30},
                      LayoutCase{"fp8/modelopt/transformer", "modelopt_fp8", 30}),
    [](const auto& info) { return std::string(info.param.format); });

TEST(Fp8CheckpointTest, DequantizesToTheStoredCodesTimesTheScale) {
  auto checkpoint = open_file(bfl_file());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const EditableFile file;
  const RawTensor& qkv = file.tensors.at("double_blocks.1.txt_attn.qkv.weight");
  const float scale = f32_values(file.tensors.at("double_blocks.1.txt_attn.qkv.weight_scale"))[0];
  const TensorRef* k = checkpoint->weights.find("transformer_blocks.1.attn.add_k_proj.weight");
  ASSERT_NE(k, nullptr);
  ASSERT_NE(k->fp8, nullptr);
  EXPECT_EQ(k->fp8->weight, std::vector<float>{scale});
  EXPECT_TRUE(k->fp8->input.has_value());
  auto values = dequantize_fp8(*k);
  ASSERT_TRUE(values.ok()) << values.status();
  const int64_t d = 96;  // add_k_proj is rows [D, 2D) of the fused qkv
  ASSERT_EQ(values->size(), static_cast<size_t>(d * d));
  double norm = 0.0;
  for (int64_t i = 0; i < d * d; ++i) {
    EXPECT_EQ((*values)[i], e4m3_to_f32(qkv.bytes[d * d + i]) * scale) << i;
    norm += (*values)[i] * (*values)[i];
  }
  EXPECT_GT(norm, 0.0);  // not trivially zero
}

TEST(Fp8CheckpointTest, PerRowScalesFollowTheirRowsThroughTheQkvSplit) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{288}, std::vector<int64_t>{288, 1}}) {
    EditableFile file;
    std::vector<float> scales(288);
    for (size_t r = 0; r < scales.size(); ++r) scales[r] = 1e-3f * static_cast<float>(r + 1);
    file.tensors["double_blocks.0.img_attn.qkv.weight_scale"] = testing::f32_tensor(shape, scales);
    testing::TempDir dir;
    testing::write_safetensors(dir.path() + "/rows.safetensors", file.tensors, file.metadata);
    auto checkpoint = open_file(dir.path() + "/rows.safetensors");
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    const TensorRef* v = checkpoint->weights.find("transformer_blocks.0.attn.to_v.weight");
    ASSERT_NE(v, nullptr);
    ASSERT_EQ(v->fp8->weight.size(), 96u);
    EXPECT_EQ(v->fp8->weight.front(), scales[192]);
    auto values = dequantize_fp8(*v);
    ASSERT_TRUE(values.ok()) << values.status();
    const RawTensor& qkv = file.tensors.at("double_blocks.0.img_attn.qkv.weight");
    for (int64_t r = 0; r < 96; r += 17) {
      EXPECT_EQ((*values)[r * 96 + 5],
                e4m3_to_f32(qkv.bytes[(192 + r) * 96 + 5]) * scales[192 + r]);
    }
  }
}

TEST(Fp8CheckpointTest, FinalAdaLnHalvesSwapWithTheirScales) {
  // final_layer.adaLN_modulation.1 quantized per row: BFL's (shift, scale) rows and their scales
  // become diffusers' (scale, shift).
  EditableFile file;
  const std::string name = "final_layer.adaLN_modulation.1";
  RawTensor& weight = file.tensors.at(name + ".weight");
  std::vector<float> bf16(weight.bytes.size() / 2);
  widen_to_f32(DType::kBF16, weight.bytes.data(), static_cast<int64_t>(bf16.size()), bf16.data());
  std::vector<float> scales(192);
  weight.dtype = "F8_E4M3";
  weight.bytes.resize(bf16.size());
  for (int64_t r = 0; r < 192; ++r) {
    scales[r] = 0.01f + 1e-4f * static_cast<float>(r);
    for (int64_t c = 0; c < 96; ++c)
      weight.bytes[r * 96 + c] = f32_to_e4m3(bf16[r * 96 + c] / scales[r]);
  }
  file.tensors[name + ".weight_scale"] = testing::f32_tensor({192}, scales);
  file.set_format(name, "float8_e4m3fn");
  testing::TempDir dir;
  testing::write_safetensors(dir.path() + "/final.safetensors", file.tensors, file.metadata);
  auto checkpoint = open_file(dir.path() + "/final.safetensors");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const TensorRef* norm_out = checkpoint->weights.find("norm_out.linear.weight");
  ASSERT_NE(norm_out, nullptr);
  ASSERT_NE(norm_out->fp8, nullptr);
  auto values = dequantize_fp8(*norm_out);
  ASSERT_TRUE(values.ok()) << values.status();
  for (int64_t r = 0; r < 192; r += 13) {
    const int64_t bfl_row = r < 96 ? r + 96 : r - 96;
    EXPECT_EQ(norm_out->fp8->weight[r], scales[bfl_row]) << r;
    EXPECT_EQ((*values)[r * 96 + 3], e4m3_to_f32(weight.bytes[bfl_row * 96 + 3]) * scales[bfl_row]);
  }
}

TEST(Fp8CheckpointTest, ScalesOfBf16LayersAreIgnoredAndCounted) {
  EditableFile file;
  file.tensors["final_layer.linear.weight_scale"] = f32_scalar(0.5f);
  testing::TempDir dir;
  testing::write_safetensors(dir.path() + "/orphan.safetensors", file.tensors, file.metadata);
  auto checkpoint = open_file(dir.path() + "/orphan.safetensors");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->ignored_scales, 1);
  EXPECT_EQ(checkpoint->weights.find("proj_out.weight")->fp8, nullptr);
  EXPECT_THAT(checkpoint->describe(), HasSubstr("1 scales of bf16 layers ignored"));
}

// ---- refusals ----------------------------------------------------------------------------------

TEST(Fp8RefusalTest, E5M2WeightIsRefusedByName) {
  EditableFile file;
  file.tensors["single_blocks.1.linear2.weight"].dtype = "F8_E5M2";
  testing::TempDir dir;
  const std::string error = file.open_error(dir);
  EXPECT_THAT(error, HasSubstr("single_blocks.1.linear2.weight"));
  EXPECT_THAT(error, HasSubstr("E5M2"));
}

TEST(Fp8RefusalTest, E5M2AndUnknownFormatsAreRefusedByName) {
  for (const std::string format : {"float8_e5m2", "nvfp4", "mxfp8"}) {
    EditableFile file;
    file.set_format("single_blocks.0.linear1", format);
    testing::TempDir dir;
    const std::string error = file.open_error(dir);
    EXPECT_THAT(error, HasSubstr("single_blocks.0.linear1")) << format;
    EXPECT_THAT(error, HasSubstr(format == "float8_e5m2" ? "E5M2" : "\"" + format + "\""));
    EXPECT_THAT(error, HasSubstr("not supported"));
  }
}

TEST(Fp8RefusalTest, MixedLayoutsAreRefused) {
  EditableFile comfy;  // _quantization_metadata plus a comfy_quant tensor
  comfy.tensors["single_blocks.0.linear1.comfy_quant"] = RawTensor{"U8", {2}, {'{', '}'}};
  testing::TempDir dir;
  EXPECT_THAT(comfy.open_error(dir), HasSubstr("mixes FP8 layouts"));
  EXPECT_THAT(comfy.open_error(dir), HasSubstr("single_blocks.0.linear1.comfy_quant"));

  EditableFile legacy;  // _quantization_metadata plus ComfyUI's legacy scale names
  legacy.tensors["single_blocks.0.linear1.scale_weight"] = f32_scalar(1.0f);
  EXPECT_THAT(legacy.open_error(dir), HasSubstr("mixes FP8 layouts"));

  // The legacy file with a modern weight_scale.
  auto scaled = testing::read_all_tensors(klein() + "/fp8/comfy_scaled_fp8.safetensors");
  scaled["single_blocks.2.linear1.weight_scale"] = f32_scalar(1.0f);
  testing::write_safetensors(dir.path() + "/scaled.safetensors", scaled);
  auto opened = open_file(dir.path() + "/scaled.safetensors");
  ASSERT_FALSE(opened.ok());
  EXPECT_THAT(opened.status().message(), HasSubstr("mixes FP8 layouts"));
  EXPECT_THAT(opened.status().message(), HasSubstr("single_blocks.2.linear1.weight_scale"));
}

TEST(Fp8RefusalTest, Fp8WithoutAnyMarkerIsAnUnknownLayout) {
  EditableFile file;
  file.metadata.clear();
  testing::TempDir dir;
  EXPECT_THAT(file.open_error(dir), HasSubstr("unknown FP8 layout"));
}

TEST(Fp8RefusalTest, ScaleProblemsNameTheScale) {
  const std::string scale = "double_blocks.0.img_mlp.2.weight_scale";
  struct Bad {
    RawTensor tensor;
    std::string says;
  };
  for (const Bad& bad :
       {Bad{testing::f32_tensor({2}, {1.0f, 1.0f}), "is [2]; a weight scale"},
        Bad{testing::f32_tensor({96, 2}, std::vector<float>(192, 1.0f)), "[96] or [96, 1]"},
        Bad{f32_scalar(0.0f), "must be finite and > 0"},
        Bad{f32_scalar(-2.0f), "must be finite and > 0"},
        Bad{f32_scalar(std::nanf("")), "must be finite and > 0"},
        Bad{RawTensor{"I32", {}, {1, 0, 0, 0}}, "has dtype I32"}}) {
    EditableFile file;
    file.tensors[scale] = bad.tensor;
    testing::TempDir dir;
    const std::string error = file.open_error(dir);
    EXPECT_THAT(error, HasSubstr(scale)) << bad.says;
    EXPECT_THAT(error, HasSubstr(bad.says));
  }
  EditableFile missing;
  missing.tensors.erase(scale);
  testing::TempDir dir;
  EXPECT_THAT(missing.open_error(dir), HasSubstr("has no " + scale));
  EditableFile input;
  input.tensors["double_blocks.0.img_mlp.2.input_scale"] = testing::f32_tensor({2}, {1.0f, 1.0f});
  EXPECT_THAT(input.open_error(dir), HasSubstr("an input scale is one value"));
}

TEST(Fp8RefusalTest, QuantizedLayersThatDoNotMatchTheModelAreNamed) {
  testing::TempDir dir;
  EditableFile extra;  // a block the model does not have
  extra.tensors["double_blocks.2.img_attn.proj.weight"] =
      extra.tensors.at("double_blocks.1.img_attn.proj.weight");
  extra.tensors["double_blocks.2.img_attn.proj.weight_scale"] = f32_scalar(0.01f);
  extra.set_format("double_blocks.2.img_attn.proj", "float8_e4m3fn");
  EXPECT_THAT(extra.open_error(dir),
              HasSubstr("no diffusers counterpart: double_blocks.2.img_attn.proj.weight"));

  EditableFile shape;  // a quantized weight of the wrong shape
  shape.tensors["double_blocks.0.img_attn.proj.weight"].shape = {48, 192};
  EXPECT_THAT(shape.open_error(dir),
              HasSubstr("double_blocks.0.img_attn.proj.weight is [48, 192]"));

  EditableFile bf16;  // listed as FP8 but stored bf16
  bf16.set_format("final_layer.linear", "float8_e4m3fn");
  bf16.tensors["final_layer.linear.weight_scale"] = f32_scalar(0.01f);
  EXPECT_THAT(bf16.open_error(dir), HasSubstr("final_layer.linear.weight is BF16[128, 96]"));

  EditableFile unlisted;  // an FP8 weight its metadata does not list
  nlohmann::json json = nlohmann::json::parse(unlisted.metadata.at("_quantization_metadata"));
  json["layers"].erase("single_blocks.2.linear2");
  unlisted.metadata["_quantization_metadata"] = json.dump();
  EXPECT_THAT(unlisted.open_error(dir), HasSubstr("single_blocks.2.linear2.weight is F8_E4M3"));

  EditableFile orphan;  // a scale of no tensor at all
  orphan.tensors["double_blocks.0.img_attn.nothing.weight_scale"] = f32_scalar(1.0f);
  EXPECT_THAT(orphan.open_error(dir),
              HasSubstr("double_blocks.0.img_attn.nothing.weight_scale scales no weight"));
}

TEST(Fp8RefusalTest, LegacyE5M2MarkerAndNonModelOptConfigsAreRefused) {
  testing::TempDir dir;
  auto scaled = testing::read_all_tensors(klein() + "/fp8/comfy_scaled_fp8.safetensors");
  scaled["scaled_fp8"].dtype = "F8_E5M2";
  testing::write_safetensors(dir.path() + "/e5m2.safetensors", scaled);
  auto opened = open_file(dir.path() + "/e5m2.safetensors");
  ASSERT_FALSE(opened.ok());
  EXPECT_THAT(opened.status().message(), HasSubstr("scaled_fp8 is F8_E5M2"));

  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"quant_algo", "NVFP4"}, {"quant_method", "bitsandbytes"}}) {
    nlohmann::json config = *read_json_file(config_path());
    config["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}};
    config["quantization_config"][key] = value;
    auto result = modelopt_quantization(config, "x/config.json");
    ASSERT_FALSE(result.ok()) << key;
    EXPECT_THAT(result.status().message(), HasSubstr("quantization_config." + key + " \"" + value));
  }
}

TEST(Fp8RefusalTest, NanCodesAreRefusedAtDequantization) {
  EditableFile file;
  file.tensors["single_blocks.0.linear2.weight"].bytes[7] = 0x7f;
  testing::TempDir dir;
  testing::write_safetensors(dir.path() + "/nan.safetensors", file.tensors, file.metadata);
  auto checkpoint = open_file(dir.path() + "/nan.safetensors");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  CpuBackend cpu;
  auto model = Pipeline::load(cpu, klein() + "/checkpoint", [&] {
    PipelineOptions options;
    options.transformer_file = dir.path() + "/nan.safetensors";
    return options;
  }());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("single_transformer_blocks.0.attn.to_out.weight: element [0, 7]"));
  EXPECT_THAT(model.status().message(), HasSubstr("NaN"));
}

TEST(Fp8RefusalTest, DequantizationRefusesNanCodesAndOverflowingScales) {
  SafetensorsEntry entry{"w.weight", DType::kF8E4M3, {2, 3}, 0, 6};
  const uint8_t codes[6] = {0x38, 0xb8, 0x7e, 0x01, 0xff, 0x00};  // 1, -1, 448, 2^-9, NaN, 0
  Fp8Scales scales{{0.5f, 4.0f}, std::nullopt, false};
  TensorRef ref{nullptr, &entry, codes, &scales};
  auto nan = dequantize_fp8(ref);
  ASSERT_FALSE(nan.ok());
  EXPECT_THAT(nan.status().message(), HasSubstr("w.weight: element [1, 1] is an E4M3 NaN code"));
  const uint8_t finite[6] = {0x38, 0xb8, 0x7e, 0x01, 0x80, 0x00};
  ref.bytes = finite;
  auto values = dequantize_fp8(ref);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<float>{0.5f, -0.5f, 224.0f, 4.0f / 512, -0.0f, 0.0f}));
  scales.weight = {1.0f, 1e38f};
  auto overflow = dequantize_fp8(ref);
  ASSERT_FALSE(overflow.ok());
  EXPECT_THAT(overflow.status().message(), HasSubstr("w.weight: row 1's scale"));
}

// A weight large enough for several threads: the rows are dequantized in parallel chunks, and the
// error names the first bad row in row order, whichever chunk finishes first.
TEST(Fp8RefusalTest, ParallelDequantizationNamesTheFirstBadRow) {
  constexpr int64_t kRows = 40000, kCols = 16;
  SafetensorsEntry entry{"big.weight", DType::kF8E4M3, {kRows, kCols}, 0, kRows * kCols};
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kCols), 0x38);  // 1.0
  Fp8Scales scales{{0.25f}, std::nullopt, false};
  TensorRef ref{nullptr, &entry, codes.data(), &scales};
  auto values = dequantize_fp8(ref);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, std::vector<float>(static_cast<size_t>(kRows * kCols), 0.25f));
  codes[static_cast<size_t>(35000 * kCols + 2)] = 0x7f;
  codes[static_cast<size_t>(9000 * kCols + 5)] = 0xff;
  auto nan = dequantize_fp8(ref);
  ASSERT_FALSE(nan.ok());
  EXPECT_THAT(nan.status().message(), HasSubstr("big.weight: element [9000, 5] is an E4M3 NaN"));
}

// The fuzz target's seeds (tests/fuzz/corpus/fp8_checkpoint, the tiny config of
// tests/fuzz/fuzz_configs.h) open with their formats, so the fuzzer starts from valid
// files.
TEST(Fp8CheckpointTest, FuzzSeedsOpenWithTheirFormats) {
  const Flux2Config tiny = fuzzing::fp8_fuzz_config();
  const std::string dir = testing::test_data_dir() + "/../fuzz/corpus/fp8_checkpoint/";
  for (const auto& [file, format, fp8_tensors] :
       std::vector<std::tuple<std::string, std::string, int64_t>>{
           {"bfl_fp8.safetensors", "bfl_fp8", 14},
           {"comfy_fp8mixed.safetensors", "comfy_fp8", 2},
           {"comfy_scaled_fp8.safetensors", "comfy_scaled_fp8", 14}}) {
    auto checkpoint = open_transformer_file(dir + file, flux2_config_json(tiny), "tiny");
    ASSERT_TRUE(checkpoint.ok()) << file << ": " << checkpoint.status();
    EXPECT_EQ(checkpoint->format, format);
    EXPECT_EQ(checkpoint->fp8_tensors, fp8_tensors) << file;
    for (const auto& [name, ref] : checkpoint->weights.tensors()) {
      if (ref.fp8 != nullptr) {
        EXPECT_TRUE(dequantize_fp8(ref).ok()) << file << " " << name;
      }
    }
  }
}

// ---- the pipeline ------------------------------------------------------------------------------

TEST(Fp8PipelineTest, ReportsTheFormatAndLogsIt) {
  CpuBackend cpu;
  PipelineOptions options;
  options.transformer_file = klein() + "/fp8/comfy_fp8mixed.safetensors";
  std::vector<std::string> log;
  options.on_progress = [&](const LoadProgress& progress) { log.push_back(describe(progress)); };
  auto pipeline = Pipeline::load(cpu, klein() + "/checkpoint", options);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ((*pipeline)->info().transformer_format, "comfy_fp8");
  EXPECT_GT((*pipeline)->info().transformer_checkpoint_bytes, 0);
  EXPECT_THAT((*pipeline)->info().load_summary(), HasSubstr("from comfy_fp8"));
  bool logged = false;
  for (const std::string& line : log)
    logged |= line.find("transformer") != std::string::npos &&
              line.find("comfy_fp8 (18 FP8") != std::string::npos;
  EXPECT_TRUE(logged);

  options.transformer_file = klein() + "/fp8/modelopt/transformer";  // a folder
  auto modelopt = Pipeline::load(cpu, klein() + "/checkpoint", options);
  ASSERT_TRUE(modelopt.ok()) << modelopt.status();
  EXPECT_EQ((*modelopt)->info().transformer_format, "modelopt_fp8");
}

}  // namespace
}  // namespace flux2
