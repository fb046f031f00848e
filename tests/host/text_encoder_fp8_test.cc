// FP8 text-encoder files (--text-encoder-file, model/text_encoder_checkpoint.h): the tiny klein
// text encoder quantized here into ComfyUI's comfy_quant layout (per-tensor scale = amax / 448,
// as mistral_3_small_flux2_fp8.safetensors), kept FP8 and dequantized layer by layer as it runs,
// gives the bits of the same encoder run on the dequantized weights; a bf16 single file equals the
// folder; every refusal names the tensor. No golden exists for an FP8 text encoder: the
// dequantized weights are the reference.
//   build-cpu/bin/host_tests --gtest_filter='TextEncoderFp8*'
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "kernels/base/dtype.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/json_util.h"
#include "model/pipeline.h"
#include "model/text_encoder.h"
#include "model/text_encoder_checkpoint.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;
using testing::RawTensor;

std::string klein() {
  return testing::test_data_dir() + "/tiny-klein/checkpoint";
}
std::string config_path() {
  return klein() + "/text_encoder/config.json";
}

bool is_projection(const std::string& name) {
  for (const char* p :
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
    if (absl::StrContains(name, std::string(".") + p + ".weight")) return true;
  }
  return false;
}

std::vector<float> as_f32(const RawTensor& t) {
  const size_t n = t.bytes.size() / (t.dtype == "BF16" ? 2 : 4);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t.dtype == "BF16") {
      uint16_t bits;
      std::memcpy(&bits, &t.bytes[2 * i], 2);
      out[i] = bf16_bits_to_f32(bits);
    } else {
      std::memcpy(&out[i], &t.bytes[4 * i], 4);
    }
  }
  return out;
}

// The folder's text encoder in ComfyUI's comfy_quant layout (`fp8`), and the same weights
// dequantized to F32 (`dequantized`): every projection quantized per tensor, the rest as it is.
struct QuantizedEncoder {
  std::map<std::string, RawTensor> fp8, dequantized;
};

QuantizedEncoder quantize_encoder() {
  QuantizedEncoder out;
  for (auto& [name, t] : testing::read_all_tensors(klein() + "/text_encoder/model.safetensors")) {
    out.dequantized[name] = t;
    if (!is_projection(name)) {
      out.fp8[name] = t;
      continue;
    }
    const std::vector<float> w = as_f32(t);
    float amax = 0.0f;
    for (float v : w) amax = std::max(amax, std::fabs(v));
    const float scale = amax / kE4M3Max;
    RawTensor codes{"F8_E4M3", t.shape, std::vector<uint8_t>(w.size())};
    std::vector<float> values(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      codes.bytes[i] = f32_to_e4m3(w[i] / scale);
      values[i] = e4m3_to_f32(codes.bytes[i]) * scale;  // dequantize_fp8's product
    }
    const std::string layer = name.substr(0, name.size() - std::string(".weight").size());
    const std::string json = R"({"format": "float8_e4m3fn"})";
    out.fp8[name] = codes;
    out.fp8[layer + ".weight_scale"] = testing::f32_tensor({}, {scale});
    out.fp8[layer + ".comfy_quant"] =
        RawTensor{"U8", {static_cast<int64_t>(json.size())}, {json.begin(), json.end()}};
    out.dequantized[name] = testing::f32_tensor(t.shape, values);
  }
  return out;
}

absl::StatusOr<TextEncoderCheckpoint> open_file(const std::string& path) {
  FLUX_ASSIGN_OR_RETURN(nlohmann::json config, read_json_file(config_path()));
  return open_text_encoder_file(path, std::move(config), config_path());
}

// The taps' hidden states for a fixed prompt (12 ids, 9 real), as host floats.
std::vector<float> encode(Backend& be, const ComponentWeights& weights, int64_t* device_bytes) {
  auto encoder = TextEncoder::load(be, weights, {9, 18, 27});
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  if (!encoder.ok()) return {};
  *device_bytes = (*encoder)->device_bytes();
  const std::vector<int32_t> ids = {151644, 872, 198, 32, 2518, 38835, 304, 279, 11794, 0, 0, 0};
  auto embeds = (*encoder)->encode(ids, 9);
  EXPECT_TRUE(embeds.ok()) << embeds.status();
  return embeds.ok() ? testing::download(be, *embeds) : std::vector<float>{};
}

TEST(TextEncoderFp8Test, PerLayerDequantizationGivesTheDequantizedWeightsBits) {
  const QuantizedEncoder q = quantize_encoder();
  testing::TempDir dir;
  testing::write_safetensors(dir.path() + "/te_fp8.safetensors", q.fp8);
  testing::write_safetensors(dir.path() + "/te_dequantized.safetensors", q.dequantized);
  auto fp8 = open_file(dir.path() + "/te_fp8.safetensors");
  auto dequantized = open_file(dir.path() + "/te_dequantized.safetensors");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  EXPECT_EQ(fp8->format, "comfy_fp8");
  EXPECT_EQ(fp8->fp8_tensors, 28 * 7);  // every layer's seven projections
  EXPECT_EQ(dequantized->format, "file");
  EXPECT_THAT(fp8->describe(), HasSubstr("comfy_fp8 (196 FP8 tensors"));

  CpuBackend cpu;
  int64_t fp8_bytes = 0, f32_bytes = 0;
  const std::vector<float> a = encode(cpu, fp8->weights, &fp8_bytes);
  const std::vector<float> b = encode(cpu, dequantized->weights, &f32_bytes);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << "the FP8 encoder's taps differ from the dequantized weights'";
  double norm = 0.0;
  for (float v : a) norm += double{v} * v;
  EXPECT_GT(norm, 0.0);
  // The projections of the 27 loaded layers at 1 byte a value (+ a scale per row) instead of 4.
  EXPECT_LT(fp8_bytes, f32_bytes);
}

TEST(TextEncoderFp8Test, Bf16SingleFileEqualsTheFolder) {
  auto file = open_file(klein() + "/text_encoder/model.safetensors");
  auto folder = open_text_encoder_folder(klein() + "/text_encoder");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(file->format, "file");
  EXPECT_EQ(folder->format, "diffusers");
  CpuBackend cpu;
  int64_t bytes = 0;
  EXPECT_EQ(encode(cpu, file->weights, &bytes), encode(cpu, folder->weights, &bytes));
}

TEST(TextEncoderFp8Test, PipelineReportsTheFormatAndStreamsDequantizedLayers) {
  const QuantizedEncoder q = quantize_encoder();
  testing::TempDir dir;
  testing::write_safetensors(dir.path() + "/te_fp8.safetensors", q.fp8);
  CpuBackend cpu;
  PipelineOptions options;
  options.text_encoder_file = dir.path() + "/te_fp8.safetensors";
  std::vector<std::string> log;
  options.on_progress = [&](const LoadProgress& p) { log.push_back(describe(p)); };
  auto pipeline = Pipeline::load(cpu, klein(), options);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ((*pipeline)->info().text_encoder_format, "comfy_fp8");
  ASSERT_FALSE((*pipeline)->info().components.empty());
  EXPECT_EQ((*pipeline)->info().components[0].format, "comfy_fp8");
  bool logged = false;
  for (const std::string& line : log) logged |= absl::StrContains(line, "from comfy_fp8 (196");
  EXPECT_TRUE(logged);

  // Streamed from host memory, the FP8 layers are dequantized there at load (bf16 on the GPU).
  options.text_encoder_residency = WeightResidency::kStreamed;
  auto streamed = Pipeline::load(cpu, klein(), options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE((*streamed)->info().text_encoder_streamed);
  EXPECT_GT((*streamed)->info().text_encoder_host_bytes,
            (*pipeline)->info().text_encoder_host_bytes);
}

// Writes `tensors` and opens them with the tiny config, then loads the encoder; the error.
std::string load_error(const std::map<std::string, RawTensor>& tensors) {
  testing::TempDir dir;
  testing::write_safetensors(dir.path() + "/te.safetensors", tensors);
  auto opened = open_file(dir.path() + "/te.safetensors");
  if (!opened.ok()) return std::string(opened.status().message());
  CpuBackend cpu;
  auto encoder = TextEncoder::load(cpu, opened->weights, {9, 18, 27});
  return encoder.ok() ? "" : std::string(encoder.status().message());
}

TEST(TextEncoderFp8Test, RefusalsNameTheTensor) {
  const std::string q_proj = "model.layers.3.self_attn.q_proj";
  {  // E5M2 codes
    QuantizedEncoder q = quantize_encoder();
    q.fp8[q_proj + ".weight"].dtype = "F8_E5M2";
    const std::string error = load_error(q.fp8);
    EXPECT_THAT(error, HasSubstr(q_proj + ".weight"));
    EXPECT_THAT(error, HasSubstr("E5M2"));
  }
  {  // two layouts in one file: comfy_quant and the legacy scaled_fp8 marker
    QuantizedEncoder q = quantize_encoder();
    q.fp8["scaled_fp8"] = RawTensor{"F8_E4M3", {0}, {}};
    EXPECT_THAT(load_error(q.fp8), HasSubstr("mixes FP8 layouts"));
  }
  {  // a quantized weight of the wrong shape (one row short, its scale per row still fitting)
    QuantizedEncoder q = quantize_encoder();
    RawTensor& w = q.fp8[q_proj + ".weight"];
    const int64_t cols = w.shape[1];
    w.shape[0] -= 1;
    w.bytes.resize(w.bytes.size() - static_cast<size_t>(cols));
    const std::string error = load_error(q.fp8);
    EXPECT_THAT(error, HasSubstr(q_proj + ".weight is"));
    EXPECT_THAT(error, HasSubstr("wrong shape"));
  }
  {  // a scale of the wrong shape
    QuantizedEncoder q = quantize_encoder();
    q.fp8[q_proj + ".weight_scale"] = testing::f32_tensor({3}, {1.0f, 1.0f, 1.0f});
    EXPECT_THAT(load_error(q.fp8), HasSubstr(q_proj + ".weight_scale"));
  }
}

}  // namespace
}  // namespace flux2
