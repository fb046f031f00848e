// --fp8-input-scale static on the CPU backend: the FP8 emulation quantizes a static-scaled stored
// weight's activation per tensor (a hand-computed product, exact), each FP8 layout's input scales
// reach the GEMMs that have them (counted, the rest per token, a fused target with a part
// without one too), the start-up refusals name the flag, and dynamic is unchanged.
//   build-cpu/bin/host_tests --gtest_filter='Fp8InputScale*'
#include <algorithm>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "model/fp8_input_scale.h"
#include "model/json_util.h"
#include "model/pipeline.h"
#include "model/pipeline_presets.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;

std::string klein() {
  return testing::test_data_dir() + "/tiny-klein";
}

TEST(Fp8InputScaleTest, NamesParseBackAndBadWordsNameTheFlag) {
  for (Fp8InputScale mode : {Fp8InputScale::kDynamic, Fp8InputScale::kStatic}) {
    auto parsed = parse_fp8_input_scale(fp8_input_scale_name(mode));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, mode);
  }
  EXPECT_EQ(parse_fp8_input_scale("calibrated").status().message(),
            "--fp8-input-scale \"calibrated\": expected dynamic or static");
}

// y = x · wᵀ at quality=high on a stored weight [2, 16] with input_scale 0.5: x / 0.5 rounded to
// E4M3 (ties to even, saturating at ±448) times 0.5, worked out by hand below. Every value is
// dyadic with few bits, so the float32 sums are exact (P4 (a)): compared bit for bit.
TEST(Fp8InputScaleTest, CpuEmulationQuantizesPerTensorUnderTheStaticScale) {
  CpuBackend cpu;
  constexpr int64_t m = 2, n = 2, k = 16;
  std::vector<float> x(m * k, 0.0f);
  const float row0[] = {0.55f, 300.0f, -0.3f, 1.0f};
  const float row1[] = {2.0f, -2.0f, 0.26f, 100.0f, 224.0f, 225.0f};
  std::copy(std::begin(row0), std::end(row0), x.begin());
  std::copy(std::begin(row1), std::end(row1), x.begin() + k);
  // x / 0.5 -> E4M3 -> x 0.5: 1.1 -> 1.125; 600 -> 448 (saturated); -0.6 -> -0.625; 2 -> 2;
  // 4; -4; 0.52 -> 0.5; 200, the tie of 192 and 208 -> 192 (even mantissa); 448; 450 -> 448.
  const float q0[] = {0.5625f, 224.0f, -0.3125f, 1.0f};
  const float q1[] = {2.0f, -2.0f, 0.25f, 96.0f, 224.0f, 224.0f};
  // Row 0 of the weight: code 1.0 under row scale 0.25; row 1: 2.0, -1.0, ... under 2.0.
  std::vector<uint8_t> codes(n * k);
  for (int64_t c = 0; c < k; ++c) {
    codes[c] = 0x38;                          // 1.0
    codes[k + c] = c % 2 == 0 ? 0x40 : 0xb8;  // 2.0, -1.0
  }
  const std::vector<float> row_scales = {0.25f, 2.0f};
  double expected[m][n] = {};
  for (int64_t c = 0; c < 4; ++c) {
    expected[0][0] += 0.25 * q0[c];
    expected[0][1] += (c % 2 == 0 ? 4.0 : -2.0) * q0[c];
  }
  for (int64_t c = 0; c < 6; ++c) {
    expected[1][0] += 0.25 * q1[c];
    expected[1][1] += (c % 2 == 0 ? 4.0 : -2.0) * q1[c];
  }
  ASSERT_EQ(expected[0][0], 56.3125);  // the hand sums: 0.25 x 225.25, ...
  ASSERT_EQ(expected[0][1], -449.0);
  ASSERT_EQ(expected[1][0], 136.0625);
  ASSERT_EQ(expected[1][1], 269.0);

  Weight w;
  w.tensor = cpu.empty(DType::kF8E4M3, {n, k}).value();
  w.row_scales = cpu.empty(DType::kF32, {n}).value();
  ASSERT_TRUE(cpu.upload(codes.data(), DType::kF8E4M3, w.tensor).ok());
  ASSERT_TRUE(cpu.upload(row_scales.data(), DType::kF32, w.row_scales).ok());
  auto low = cpu.add_stored_fp8_weight(w.tensor, w.row_scales, 0.5f);
  ASSERT_TRUE(low.ok()) << low.status();
  w.low_precision = *low;
  Tensor xt = cpu.empty(DType::kF32, {m, k}).value(), y = cpu.empty(DType::kF32, {m, n}).value();
  ASSERT_TRUE(cpu.upload(x.data(), DType::kF32, xt).ok());
  {
    const RequestScope high(cpu, {Quality::kHigh});
    ASSERT_TRUE(cpu.linear(xt, w, {}, y).ok());
  }
  const std::vector<float> got = testing::download(cpu, y);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(got[i * n + j], expected[i][j]) << i << ", " << j;

  // The same weight per token gives other values (row 0's amax 300 sets its scale).
  auto per_token = cpu.add_stored_fp8_weight(w.tensor, w.row_scales, std::nullopt);
  ASSERT_TRUE(per_token.ok());
  w.low_precision = *per_token;
  {
    const RequestScope high(cpu, {Quality::kHigh});
    ASSERT_TRUE(cpu.linear(xt, w, {}, y).ok());
  }
  EXPECT_NE(testing::download(cpu, y)[0], expected[0][0]);
  EXPECT_THAT(cpu.add_stored_fp8_weight(w.tensor, w.row_scales, -1.0f).status().message(),
              HasSubstr("input_scale -1 is not finite and > 0"));
}

// The klein checkpoint with its transformer from FP8 file (or folder) `file` under fp8/.
absl::StatusOr<std::unique_ptr<Pipeline>> load(Backend& be, const std::string& file,
                                               Fp8InputScale mode, bool quality_high = true) {
  PipelineOptions options;
  if (!file.empty()) options.transformer_file = file;
  options.fp8_input_scale = mode;
  options.enable_quality_high = quality_high;
  return Pipeline::load(be, klein() + "/checkpoint", options);
}

std::vector<uint8_t> generate(const Pipeline& pipeline, Quality quality) {
  GenerateParams params;
  params.prompt = "a red fox in the snow, from an FP8 file";
  params.height = params.width = 64;
  params.num_inference_steps = 2;
  params.seed = 700;
  params.max_sequence_length = 64;
  params.quality = quality;
  auto image = pipeline.generate(params);
  EXPECT_TRUE(image.ok()) << image.status();
  return image.ok() ? image->rgb : std::vector<uint8_t>{};
}

// BFL's file has an input scale on every quantized layer: every FP8 GEMM is static, quality=high
// images change, lossless ones do not; the start-up summary says how many.
TEST(Fp8InputScaleTest, BflFileRunsEveryGemmUnderItsInputScale) {
  CpuBackend cpu;
  const std::string bfl = klein() + "/fp8/bfl_fp8.safetensors";
  auto fixed = load(cpu, bfl, Fp8InputScale::kStatic);
  auto dynamic = load(cpu, bfl, Fp8InputScale::kDynamic);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ASSERT_TRUE(dynamic.ok()) << dynamic.status();
  const PipelineInfo& info = (*fixed)->info();
  EXPECT_EQ(info.fp8_input_scale, Fp8InputScale::kStatic);
  EXPECT_EQ(info.fp8_gemms, 22);  // 2 double blocks x 8 + 3 single blocks x 2
  EXPECT_EQ(info.fp8_static_scale_gemms, 22);
  EXPECT_EQ((*dynamic)->info().fp8_gemms, 22);
  EXPECT_EQ((*dynamic)->info().fp8_static_scale_gemms, 0);
  EXPECT_THAT(info.load_summary(),
              HasSubstr("22 FP8 GEMMs, --fp8-input-scale static: 22 under the checkpoint's "
                        "input_scale, 0 per token"));
  EXPECT_THAT((*dynamic)->info().load_summary(), HasSubstr("22 FP8 GEMMs, activations per token"));
  const std::vector<uint8_t> high = generate(**fixed, Quality::kHigh);
  ASSERT_FALSE(high.empty());
  EXPECT_NE(high, generate(**dynamic, Quality::kHigh)) << "static scales changed nothing";
  EXPECT_EQ(generate(**fixed, Quality::kLossless), generate(**dynamic, Quality::kLossless));
}

// ComfyUI's legacy file carries scale_input on the single blocks only: their 6 GEMMs are static,
// the double blocks' 16 stay per token.
TEST(Fp8InputScaleTest, LayersWithoutAnInputScaleStayDynamic) {
  CpuBackend cpu;
  auto legacy = load(cpu, klein() + "/fp8/comfy_scaled_fp8.safetensors", Fp8InputScale::kStatic);
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ((*legacy)->info().fp8_gemms, 22);
  EXPECT_EQ((*legacy)->info().fp8_static_scale_gemms, 6);
}

// ModelOpt's q, k and v each have an input scale and one fused GEMM: static when all three do; a
// fused target with one part without a scale stays per token.
TEST(Fp8InputScaleTest, FusedTargetsNeedEveryPartsInputScale) {
  CpuBackend cpu;
  const std::string modelopt = klein() + "/fp8/modelopt/transformer";
  auto full = load(cpu, modelopt, Fp8InputScale::kStatic);
  ASSERT_TRUE(full.ok()) << full.status();
  const int64_t all = (*full)->info().fp8_static_scale_gemms;
  EXPECT_EQ(all, (*full)->info().fp8_gemms);

  testing::TempDir dir;
  std::filesystem::copy_file(modelopt + "/config.json", dir.path() + "/config.json");
  auto tensors = testing::read_all_tensors(modelopt + "/diffusion_pytorch_model.safetensors");
  ASSERT_EQ(tensors.erase("transformer_blocks.0.attn.to_k.input_scale"), 1u);
  testing::write_safetensors(dir.path() + "/diffusion_pytorch_model.safetensors", tensors);
  auto partial = load(cpu, dir.path(), Fp8InputScale::kStatic);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ((*partial)->info().fp8_static_scale_gemms, all - 1);
}

TEST(Fp8InputScaleTest, StaticIsRefusedWhereNothingCouldUseIt) {
  CpuBackend cpu;
  auto bf16 = load(cpu, "", Fp8InputScale::kStatic);  // the diffusers transformer/ folder
  ASSERT_FALSE(bf16.ok());
  EXPECT_THAT(
      bf16.status().message(),
      HasSubstr("--fp8-input-scale static: the transformer checkpoint (diffusers) is bf16"));
  auto without = load(cpu, klein() + "/fp8/comfy_fp8mixed.safetensors", Fp8InputScale::kStatic);
  ASSERT_FALSE(without.ok());
  EXPECT_THAT(without.status().message(), HasSubstr("--fp8-input-scale static: the transformer "
                                                    "checkpoint (comfy_fp8"));
  EXPECT_THAT(without.status().message(),
              HasSubstr("has no input_scale (or scale_input) for any quantized layer"));
  auto lossless_only =
      load(cpu, klein() + "/fp8/bfl_fp8.safetensors", Fp8InputScale::kStatic, false);
  ASSERT_FALSE(lossless_only.ok());
  EXPECT_THAT(lossless_only.status().message(),
              HasSubstr("--fp8-input-scale static: quality=high is not enabled"));
  // Dynamic is the default for all of them.
  EXPECT_TRUE(load(cpu, "", Fp8InputScale::kDynamic).ok());
}

// bench's random FP8 weights all carry kRandomActivationAmax / 448; bf16 ones refuse static
// (before anything is allocated).
TEST(Fp8InputScaleTest, RandomFp8WeightsCarryAnInputScale) {
  CpuBackend cpu;
  const std::string config_path = klein() + "/checkpoint/transformer/config.json";
  auto json = read_json_file(config_path);
  ASSERT_TRUE(json.ok()) << json.status();
  auto config = Flux2Config::from_json(*json, config_path);  // widths multiples of 16
  ASSERT_TRUE(config.ok()) << config.status();
  auto model = Flux2Transformer::create_random(cpu, *config, 5, /*stored_fp8=*/true);
  ASSERT_TRUE(model.ok()) << model.status();
  auto report = (*model)->enable_quality_high(Fp8InputScale::kStatic);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->gemms, 0);
  EXPECT_EQ(report->static_scaled, report->gemms);

  auto spec = random_pipeline_spec("klein-4b", klein() + "/checkpoint/tokenizer");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->fp8_input_scale = Fp8InputScale::kStatic;
  spec->enable_quality_high = true;
  auto refused = Pipeline::create_random(cpu, *spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("the transformer checkpoint (random) is bf16"));
}

}  // namespace
}  // namespace flux2
