// libFuzzer target: an FP8 transformer checkpoint (model/fp8_checkpoint.h) as a BFL-named single
// file (--transformer-file) and as the weights of a ModelOpt transformer/ folder, for a tiny
// transformer (hidden 8, one double and one single block). Every tensor it opens with scales must
// be F8_E4M3 with one scale or one per row, all finite and > 0, and dequantize to finite values
// or a refusal. Run by tests/fuzz/run_fuzzers.sh (seeds: corpus/fp8_checkpoint, made by
// tests/tools/make_fp8_fuzz_seeds.py).
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "model/bfl_checkpoint.h"
#include "model/fp8_checkpoint.h"
#include "model/transformer_checkpoint.h"
#include "tests/fuzz/fuzz_configs.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Aborts unless every FP8 tensor of `checkpoint` keeps the invariants of fp8_checkpoint.h.
void check(const absl::StatusOr<flux2::TransformerCheckpoint>& checkpoint) {
  if (!checkpoint.ok()) return;
  for (const auto& [name, ref] : checkpoint->weights.tensors()) {
    if (ref.fp8 == nullptr) {
      if (ref.entry->dtype == flux2::DType::kF8E4M3) std::abort();  // FP8 without scales
      continue;
    }
    const std::vector<float>& scale = ref.fp8->weight;
    if (ref.entry->dtype != flux2::DType::kF8E4M3 || ref.entry->shape.size() != 2) std::abort();
    if (scale.size() != 1 && static_cast<int64_t>(scale.size()) != ref.entry->shape[0])
      std::abort();
    for (float s : scale)
      if (!std::isfinite(s) || s <= 0.0f) std::abort();
    const absl::StatusOr<std::vector<float>> values = flux2::dequantize_fp8(ref);
    if (!values.ok()) continue;
    for (float v : *values)
      if (!std::isfinite(v)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::json config = flux2::flux2_config_json(flux2::fuzzing::fp8_fuzz_config());
  const std::string& dir = flux2::fuzz::scratch_dir();
  const std::string file = dir + "/input.safetensors";
  flux2::fuzz::write_file(file, data, size);
  check(flux2::open_transformer_file(file, config, "tiny config"));
  // The same bytes as a ModelOpt folder's weights.
  const std::string folder = dir + "/transformer";
  std::filesystem::create_directories(folder);
  nlohmann::json modelopt = config;
  modelopt["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}};
  const std::string text = modelopt.dump();
  flux2::fuzz::write_file(folder + "/config.json", reinterpret_cast<const uint8_t*>(text.data()),
                          text.size());
  flux2::fuzz::write_file(folder + "/diffusion_pytorch_model.safetensors", data, size);
  check(flux2::open_transformer_folder(folder));
  return 0;
}
