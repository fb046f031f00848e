// `flux2 check-golden`: runs every case of a reference-vector directory in the tests/data
// format (tests/data/README.md) and prints one PASS/FAIL line per check, then "N passed, M failed".
// Each part (tokenizer, text_encoder, transformer, vae, vae_encode, scheduler, randn, pipeline with
// sigmas, cache, edit and edit_kv, lora, fp8) is one function in its own golden_<part>.cc. Tested
// by tests/golden/ (ctest label "golden").
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "kernels/backend.h"
#include "model/lora_device_cache.h"
#include "model/safetensors.h"
#include "model/step_cache.h"
#include "nlohmann/json.hpp"

namespace flux2 {

// Collects and prints check results.
class GoldenReport {
 public:
  // Compares `out` with `ref` by relative L2 error against `tolerance` and prints the line.
  // A tolerance that could not be derived (a missing reference error) is the check's failure.
  void compare(absl::string_view file, absl::string_view case_name, absl::string_view tensor,
               std::span<const float> out, std::span<const float> ref,
               const absl::StatusOr<double>& tolerance);
  // A check decided by the caller; `detail` says what was measured.
  void record(bool passed, absl::string_view file, absl::string_view case_name,
              absl::string_view tensor, absl::string_view detail);
  void fail(absl::string_view file, absl::string_view case_name, absl::string_view message) {
    record(false, file, case_name, "-", message);
  }
  // A check not applicable by design on this backend: printed as SKIP with the reason, not counted.
  void skip(absl::string_view file, absl::string_view reason);
  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  int passed_ = 0;
  int failed_ = 0;
};

// What a part needs to run its cases.
struct GoldenContext {
  std::string dir;           // the golden directory (holds checkpoint/ and the vector files)
  std::string backend_name;  // "cpu" or "cuda"
  Backend* backend = nullptr;
  Quality quality = Quality::kLossless;  // kHigh: the quality=high paths
  // quality=high on a bf16 backend: the CPU backend, whose FP8 emulation measures each tensor's
  // FP8 error (the parts that have FP8 paths run their cases on it too).
  Backend* fp8_backend = nullptr;
  // Relative L2 error of diffusers' bf16 path per tensor ("transformer.case0.output"), from
  // bf16_reference.json; empty when the file is absent.
  std::map<std::string, double> bf16_errors;

  // The tolerance for `key` (tests/data/README.md, the bars), an error when it cannot be derived:
  // - float32 CPU backend: 1e-4 relative.
  // - bf16 backend: max(2 x e_ref, 1e-2), e_ref diffusers' bf16 error for `key` from
  //   bf16_reference.json (a missing key is an error, not a default).
  // - quality=high on a bf16 backend: that, plus 2 x `fp8_error`, the error of the same-precision
  //   FP8 emulation (twice the error of a naive implementation in the same
  //   formats); 0 for parts without FP8 paths (the VAE: its fused epilogues round less).
  absl::StatusOr<double> tolerance(const std::string& key, double fp8_error = 0.0) const;
  std::string checkpoint_dir() const { return dir + "/checkpoint"; }
};

// Runs `run_case("case0")`, `run_case("case1")`, ... while `vectors` has "<case>.<first_tensor>",
// reporting a case's error as its failure; no case at all is a failure too.
void for_each_case(const SafetensorsFile& vectors, absl::string_view file,
                   absl::string_view first_tensor, GoldenReport& report,
                   const std::function<absl::Status(const std::string& name)>& run_case);

// A backend tensor's values as host floats (waits for the device).
absl::StatusOr<std::vector<float>> download_values(Backend& backend, const Tensor& tensor);
// A new tensor in the backend's activation dtype holding `values` with `shape`.
absl::StatusOr<Tensor> upload_values(Backend& backend, const std::vector<float>& values,
                                     Shape shape);

// [C, H, W] (batch 1, as the vectors store images and latents) -> [H, W, C] (the backends' NHWC
// and packed tokens: h x w = tokens, w = 1), and back.
std::vector<float> chw_to_hwc(const std::vector<float>& chw, int64_t c, int64_t h, int64_t w);
std::vector<float> hwc_to_chw(const std::vector<float>& hwc, int64_t c, int64_t h, int64_t w);

// The inputs of one transformer.safetensors case ("case0."), uploaded (golden_transformer.cc).
struct TransformerInputs {
  Tensor prompt;  // [L, J]
  Tensor x;       // [N, in_channels]
  std::vector<int64_t> img_ids, txt_ids;
  std::vector<float> timestep, guidance;  // guidance: dev only
};
absl::StatusOr<TransformerInputs> transformer_inputs(Backend& backend, const Flux2Config& config,
                                                     const SafetensorsFile& vectors,
                                                     const std::string& prefix);

// The parts, each defined in golden_<part>.cc.
void check_golden_tokenizer(const GoldenContext& context, GoldenReport& report);
void check_golden_text_encoder(const GoldenContext& context, GoldenReport& report);
void check_golden_transformer(const GoldenContext& context, GoldenReport& report);
void check_golden_vae(const GoldenContext& context, GoldenReport& report);
void check_golden_scheduler(const GoldenContext& context, GoldenReport& report);
void check_golden_randn(const GoldenContext& context, GoldenReport& report);
void check_golden_vae_encode(const GoldenContext& context, GoldenReport& report);
void check_golden_pipeline(const GoldenContext& context, GoldenReport& report);
void check_golden_sigmas(const GoldenContext& context, GoldenReport& report);
void check_golden_cache(const GoldenContext& context, GoldenReport& report);
void check_golden_cache_steps(const GoldenContext& context, GoldenReport& report);
void check_golden_edit(const GoldenContext& context, GoldenReport& report);
void check_golden_edit_kv(const GoldenContext& context, GoldenReport& report);
void check_golden_lora(const GoldenContext& context, GoldenReport& report);
void check_golden_lora_pipeline(const GoldenContext& context, GoldenReport& report);
void check_golden_fp8(const GoldenContext& context, GoldenReport& report);
void check_golden_fp8_pipeline(const GoldenContext& context, GoldenReport& report);

// The adapters `[[name, weight], ...]` of a lora_cases.json case, read from the files its
// "adapters" table names and parsed for `config` (golden_lora.cc).
absl::StatusOr<std::vector<LoraRequest>> golden_loras(const GoldenContext& context,
                                                      const nlohmann::json& adapters,
                                                      const Flux2Config& config);

// A cache_cases.json case's DBCache options (W, MC, R) (golden_cache.cc).
StepCacheOptions golden_step_cache_options(const nlohmann::json& item);
// The same case's recorded decisions as a forced schedule per list and branch (cached where the
// code is 4), for backends whose diffs may straddle R (bf16).
StepCacheOptions golden_forced_step_cache_options(const nlohmann::json& item);
// Checks a generation's step-cache decisions against the case's, per "<list>.<branch>": codes
// equal, the diffs computed where the case has them (-1 where not) within the float32 bar.
void check_golden_step_cache(absl::string_view file, absl::string_view case_name,
                             const nlohmann::json& item, const StepCacheReport& produced,
                             GoldenReport& report);

}  // namespace flux2
