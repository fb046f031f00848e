// FP8 checkpoints kept as stored (Weight::stored_fp8, --fp8-lossless): the klein FP8 file served
// per_layer and resident gives the same pixels, per_layer holding fewer transformer bytes (the
// memory plan's and GetModelInfo's numbers); a random transformer in FP8 form (bench --weights
// fp8) runs both plans to the same bits; every new refusal names what it refuses.
//   build-cpu/bin/host_tests --gtest_filter='Fp8Stored*'
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "model/flux2_transformer.h"
#include "model/flux2_weights.h"
#include "model/fp8_checkpoint.h"
#include "model/json_util.h"
#include "model/pipeline.h"
#include "model/transformer_checkpoint.h"
#include "model/weight_loader.h"
#include "tests/fuzz/fuzz_configs.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;

std::string klein() {
  return testing::test_data_dir() + "/tiny-klein";
}

// The klein checkpoint with its transformer from BFL's FP8 file, served as `plan` says.
std::unique_ptr<Pipeline> load_bfl_fp8(Backend& be, Fp8Lossless plan, bool quality_high,
                                       std::vector<std::string>* log = nullptr) {
  PipelineOptions options;
  options.transformer_file = klein() + "/fp8/bfl_fp8.safetensors";
  options.fp8_lossless = plan;
  options.enable_quality_high = quality_high;
  if (log != nullptr)
    options.on_progress = [log](const LoadProgress& p) { log->push_back(describe(p)); };
  auto pipeline = Pipeline::load(be, klein() + "/checkpoint", options);
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  return pipeline.ok() ? std::move(*pipeline) : nullptr;
}

// fp8_cases.json's pipeline case (64x64, 4 steps, seed 700).
std::vector<uint8_t> generate(const Pipeline& pipeline) {
  GenerateParams params;
  params.prompt = "a red fox in the snow, from an FP8 file";
  params.height = params.width = 64;
  params.num_inference_steps = 4;
  params.seed = 700;
  params.max_sequence_length = 64;
  auto image = pipeline.generate(params);
  EXPECT_TRUE(image.ok()) << image.status();
  return image.ok() ? image->rgb : std::vector<uint8_t>{};
}

const ComponentInfo* component(const PipelineInfo& info, const std::string& name) {
  for (const ComponentInfo& c : info.components)
    if (c.name == name) return &c;
  return nullptr;
}

TEST(Fp8StoredTest, PerLayerAndResidentServeTheSamePixels) {
  CpuBackend cpu;
  std::vector<std::string> log;
  auto resident = load_bfl_fp8(cpu, Fp8Lossless::kResident, false, &log);
  auto per_layer = load_bfl_fp8(cpu, Fp8Lossless::kPerLayer, false);
  ASSERT_NE(resident, nullptr);
  ASSERT_NE(per_layer, nullptr);
  const std::vector<uint8_t> a = generate(*resident), b = generate(*per_layer);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the two --fp8-lossless plans gave different pixels";

  // per_layer holds the 30 quantized projections at 1 byte a value (+ a scale per row) instead
  // of the CPU's 4: the rest of the transformer is the same.
  const PipelineInfo& r = resident->info();
  const PipelineInfo& p = per_layer->info();
  EXPECT_LT(p.transformer_bytes, r.transformer_bytes);
  EXPECT_EQ(r.fp8_lossless, Fp8Lossless::kResident);
  EXPECT_EQ(p.fp8_lossless, Fp8Lossless::kPerLayer);
  ASSERT_NE(component(p, "transformer"), nullptr);
  EXPECT_EQ(component(p, "transformer")->format, "bfl_fp8 (stored fp8)");
  EXPECT_EQ(component(p, "transformer")->device_bytes, p.transformer_bytes);
  EXPECT_EQ(component(r, "transformer")->format, "bfl_fp8");
  EXPECT_EQ(component(r, "text_encoder")->format, "diffusers");
  EXPECT_GT(component(r, "transformer")->checkpoint_bytes, 0);
  bool dequantized = false;  // the start-up log says what happened to the codes
  for (const std::string& line : log)
    dequantized |= line.find("--fp8-lossless=resident") != std::string::npos;
  EXPECT_TRUE(dequantized);
}

TEST(Fp8StoredTest, QualityHighKeepsTheCodesBesideResidentValues) {
  CpuBackend cpu;
  auto resident = load_bfl_fp8(cpu, Fp8Lossless::kResident, true);
  auto plain = load_bfl_fp8(cpu, Fp8Lossless::kResident, false);
  ASSERT_NE(resident, nullptr);
  ASSERT_NE(plain, nullptr);
  // The values as without quality=high; the codes and the CPU's emulated copies on top.
  EXPECT_EQ(resident->info().transformer_bytes, plain->info().transformer_bytes);
  EXPECT_GT(resident->info().fp8_bytes, 0);
  ASSERT_NE(component(resident->info(), "fp8_weights"), nullptr);
}

TEST(Fp8StoredTest, RandomFp8TransformerRunsBothPlansToTheSameBits) {
  CpuBackend cpu;
  const Flux2Config config = fuzzing::fp8_fuzz_config();
  auto stored = Flux2Transformer::create_random(cpu, config, 5, /*stored_fp8=*/true);
  auto resident = Flux2Transformer::create_random(cpu, config, 5, /*stored_fp8=*/true);
  auto dense = Flux2Transformer::create_random(cpu, config, 5);
  ASSERT_TRUE(stored.ok() && resident.ok() && dense.ok());
  EXPECT_LT((*stored)->load_report().device_bytes, (*dense)->load_report().device_bytes);
  auto moved = (*resident)->dequantize_stored_weights();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_GT(moved->values, moved->stored);  // f32 values for 1-byte codes

  const int64_t n = 16, l = 8;
  Tensor x = cpu.empty(DType::kF32, {n, config.in_channels}).value();
  Tensor prompt = cpu.empty(DType::kF32, {l, config.joint_attention_dim}).value();
  ASSERT_TRUE(cpu.fill_uniform(x, 1, 1.0f).ok());
  ASSERT_TRUE(cpu.fill_uniform(prompt, 2, 1.0f).ok());
  std::vector<int64_t> txt_ids(static_cast<size_t>(l * 4), 0), img_ids(static_cast<size_t>(n * 4));
  for (int64_t i = 0; i < n; ++i) {
    img_ids[static_cast<size_t>(i * 4 + 1)] = i / 4;
    img_ids[static_cast<size_t>(i * 4 + 2)] = i % 4;
  }
  std::vector<std::vector<float>> outputs;
  for (Flux2Transformer* model : {stored->get(), resident->get()}) {
    std::vector<float> guidance;
    if (config.guidance_embeds) guidance = {4.0f};
    auto cond = model->prepare(prompt, txt_ids, img_ids, std::vector<float>{0.5f}, guidance);
    ASSERT_TRUE(cond.ok()) << cond.status();
    Tensor out = cpu.empty(DType::kF32, {n, config.out_channels}).value();
    ASSERT_TRUE(model->forward(*cond, 0, x, out).ok());
    outputs.push_back(testing::download(cpu, out));
  }
  ASSERT_EQ(outputs[0].size(), outputs[1].size());
  EXPECT_EQ(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * 4), 0);
  double norm = 0.0;
  for (float v : outputs[0]) norm += double{v} * v;
  EXPECT_GT(norm, 0.0);  // not trivially zero
}

// A mixed file's bf16 layers stay bf16: ComfyUI's fp8mixed golden keeps double block 0 in bf16,
// so its projections are not stored; the memory plan counts the stored ones at 1 byte a value
// plus a 4-byte scale per row.
TEST(Fp8StoredTest, MixedFilesKeepTheirBf16LayersAndThePlanCountsFp8Bytes) {
  auto config_json = read_json_file(klein() + "/checkpoint/transformer/config.json");
  ASSERT_TRUE(config_json.ok());
  auto checkpoint =
      open_transformer_file(klein() + "/fp8/comfy_fp8mixed.safetensors", *config_json, "config");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto config = Flux2Config::from_json(*config_json, "config");
  ASSERT_TRUE(config.ok());
  Flux2Weights weights;
  const std::vector<WeightSpec> table = weights.table(*config);
  const std::set<const Weight*> stored = stored_fp8_weights(checkpoint->weights, table);
  ASSERT_GE(weights.double_blocks.size(), 2u);
  EXPECT_EQ(stored.count(&weights.double_blocks[0].img_qkv), 0u);
  EXPECT_EQ(stored.count(&weights.double_blocks[0].txt_ff_out), 0u);
  EXPECT_EQ(stored.count(&weights.double_blocks[1].img_qkv), 1u);
  EXPECT_EQ(stored.count(&weights.single_blocks[0].qkv_mlp), 1u);
  int64_t expected_fp8 = 0, values = 0;
  for (const WeightSpec& spec : table) {
    const bool fp8 = spec.fp8 != nullptr && stored.count(spec.fp8) != 0;
    (fp8 ? expected_fp8 : values) +=
        fp8 ? shape_numel(spec.shape) + 4 * spec.shape[0] : 2 * shape_numel(spec.shape);
  }
  EXPECT_GT(expected_fp8, 0);
  EXPECT_EQ(planned_weight_bytes(table, stored, 2).device, expected_fp8 + values);
  EXPECT_EQ(planned_weight_bytes(table, {}, 2).device, planned_weight_bytes(table, 2).device);
}

TEST(Fp8StoredTest, RefusalsNameWhatTheyRefuse) {
  EXPECT_THAT(parse_fp8_lossless("lazy").status().message(),
              HasSubstr("--fp8-lossless \"lazy\": expected resident or per_layer"));
  CpuBackend cpu;
  Weight bad;
  bad.tensor = cpu.empty(DType::kF8E4M3, {4, 16}).value();
  bad.row_scales = cpu.empty(DType::kF32, {3}).value();  // one scale short
  auto values = cpu.weight_values(bad);
  ASSERT_FALSE(values.ok());
  EXPECT_THAT(values.status().message(), HasSubstr("f32 row scales [N]"));
  Tensor x = cpu.empty(DType::kF32, {2, 16}).value(), y = cpu.empty(DType::kF32, {2, 4}).value();
  EXPECT_THAT(cpu.linear(x, bad, {}, y).message(), HasSubstr("weight_values"));

  // A stored weight's codes are checked as the host dequantization checks them.
  SafetensorsEntry entry{"w.weight", DType::kF8E4M3, {2, 3}, 0, 6};
  const uint8_t codes[6] = {0x38, 0xb8, 0x7e, 0x01, 0xff, 0x00};
  Fp8Scales scales{{0.5f, 4.0f}, std::nullopt, false};
  TensorRef ref{nullptr, &entry, codes, &scales};
  EXPECT_THAT(check_fp8_codes(ref).message(),
              HasSubstr("w.weight: element [1, 1] is an E4M3 NaN code"));
  const uint8_t finite[6] = {0x38, 0xb8, 0x7e, 0x01, 0x80, 0x00};
  ref.bytes = finite;
  EXPECT_TRUE(check_fp8_codes(ref).ok());
  scales.weight = {1.0f, 1e38f};
  EXPECT_THAT(check_fp8_codes(ref).message(), HasSubstr("w.weight: row 1's scale"));
}

}  // namespace
}  // namespace flux2
