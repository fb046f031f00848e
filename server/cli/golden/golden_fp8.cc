// check-golden part "fp8": the tiny klein transformer from each FP8 checkpoint layout of
// fp8_cases.json (BFL, ComfyUI mixed, ComfyUI legacy scaled fp8, ModelOpt folder), its detected
// format, the layers a mixed file keeps bf16, and one forward per transformer.safetensors input
// case against diffusers on the dequantized weights (fp8_transformer.safetensors) at the
// transformer's bars; at lossless the --fp8-lossless plans (codes kept, dequantized per GEMM or
// after load) give the same bits, at quality=high the file's codes feed the FP8 GEMMs, and a
// layout with input scales runs again under them (--fp8-input-scale static) at the bar of their
// CPU emulation.
// "fp8_pipeline" (a whole generation) runs in golden_pipeline.cc. Run by ctest
// golden.tiny_klein.all; alone: flux2 check-golden --golden tests/data/tiny-klein --only fp8
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/base/numerics.h"
#include "kernels/base/status.h"
#include "model/flux2_transformer.h"
#include "model/fp8_input_scale.h"
#include "model/json_util.h"
#include "model/safetensors.h"
#include "model/transformer_checkpoint.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kCases[] = "fp8_cases.json";
constexpr char kFile[] = "fp8_transformer.safetensors";

// The format open_transformer_* must detect for each layout of the goldens.
std::string expected_format(const std::string& layout) {
  if (layout == "bfl") return "bfl_fp8";
  if (layout == "comfy") return "comfy_fp8";
  if (layout == "comfy_legacy") return "comfy_scaled_fp8";
  if (layout == "modelopt") return "modelopt_fp8";
  return "(unknown layout " + layout + ")";
}

// The diffusers prefix of a kept_bf16 pattern in BFL names: "double_blocks.0.*" ->
// "transformer_blocks.0.", "single_blocks.2.*" -> "single_transformer_blocks.2."; "" otherwise.
std::string diffusers_block_prefix(const std::string& pattern) {
  absl::string_view rest = pattern;
  if (!absl::ConsumeSuffix(&rest, ".*")) return "";
  if (absl::ConsumePrefix(&rest, "double_blocks."))
    return absl::StrCat("transformer_blocks.", rest, ".");
  if (absl::ConsumePrefix(&rest, "single_blocks."))
    return absl::StrCat("single_transformer_blocks.", rest, ".");
  return "";
}

// The checkpoint of `layout` at `path` (a file, or the ModelOpt folder) with the tiny klein
// transformer's config.
absl::StatusOr<TransformerCheckpoint> open_layout(const GoldenContext& context,
                                                  const std::string& path) {
  const std::string config_path = context.checkpoint_dir() + "/transformer/config.json";
  FLUX_ASSIGN_OR_RETURN(nlohmann::json config, read_json_file(config_path));
  return open_transformer_file(context.dir + "/" + path, std::move(config), config_path);
}

// Every block weight under `prefix` must be stored bf16 (no scales), and some other weight FP8.
void check_kept_bf16(const TransformerCheckpoint& checkpoint, const std::string& layout,
                     const std::string& pattern, GoldenReport& report) {
  const std::string prefix = diffusers_block_prefix(pattern);
  if (prefix.empty()) return report.fail(kCases, layout, "kept_bf16: unknown pattern " + pattern);
  int64_t kept = 0, quantized_kept = 0;
  for (const auto& [name, ref] : checkpoint.weights.tensors()) {
    if (!absl::StartsWith(name, prefix)) continue;
    ++kept;
    if (ref.fp8 != nullptr || ref.entry->dtype != DType::kBF16) ++quantized_kept;
  }
  report.record(kept > 0 && quantized_kept == 0 && checkpoint.fp8_tensors > 0, kCases, layout,
                "kept_bf16 " + pattern,
                absl::StrCat(kept, " tensors under ", prefix, ", ", quantized_kept,
                             " of them not bf16; ", checkpoint.fp8_tensors, " FP8 tensors in all"));
}

// One transformer forward of input case `name` on `model`, the output as host floats.
absl::StatusOr<std::vector<float>> forward(Backend& be, const Flux2Transformer& model,
                                           const SafetensorsFile& inputs, const std::string& name) {
  const Flux2Config& config = model.config();
  FLUX_ASSIGN_OR_RETURN(TransformerInputs in, transformer_inputs(be, config, inputs, name + "."));
  FLUX_ASSIGN_OR_RETURN(Tensor out,
                        be.empty(be.activation_dtype(), {in.x.rows(), config.out_channels}));
  FLUX_ASSIGN_OR_RETURN(Flux2Conditioning cond,
                        model.prepare(in.prompt, in.txt_ids, in.img_ids, in.timestep, in.guidance));
  FLUX_RETURN_IF_ERROR(model.forward(cond, 0, in.x, out));
  return download_values(be, out);
}

// The model on the backend under test and, at quality=high, on the CPU's FP8 emulation. At
// quality=high both keep the file's FP8 codes (Fp8Placement::kStored), which the FP8 GEMMs take
// as they are. At lossless `model` is dequantized on the host at load and `same_bits` holds the
// server's two --fp8-lossless plans, which must give its output bit for bit: the codes kept and
// dequantized per GEMM (per_layer), and the codes dequantized on the backend after load
// (resident).
struct Models {
  std::unique_ptr<Flux2Transformer> model, fp8_reference;
  std::vector<std::pair<std::string, std::unique_ptr<Flux2Transformer>>> same_bits;
  // quality=high with --fp8-input-scale static, for a layout with input scales: the model under
  // test and its CPU emulation (null otherwise).
  std::unique_ptr<Flux2Transformer> static_model, static_reference;
};

// `checkpoint` loaded as stored on `be` with quality=high's weights under `input_scale`.
absl::StatusOr<std::unique_ptr<Flux2Transformer>> load_high(Backend& be,
                                                            const TransformerCheckpoint& checkpoint,
                                                            Fp8InputScale input_scale) {
  FLUX_ASSIGN_OR_RETURN(auto model,
                        Flux2Transformer::load(be, checkpoint.weights, Fp8Placement::kStored));
  FLUX_RETURN_IF_ERROR(model->enable_quality_high(input_scale).status());
  return model;
}

absl::StatusOr<Models> load_models(const GoldenContext& context,
                                   const TransformerCheckpoint& checkpoint) {
  Models models;
  const bool high = context.quality == Quality::kHigh;
  FLUX_ASSIGN_OR_RETURN(models.model, Flux2Transformer::load(*context.backend, checkpoint.weights,
                                                             high ? Fp8Placement::kStored
                                                                  : Fp8Placement::kDequantized));
  if (!high) {
    for (const char* plan : {"per_layer", "resident"}) {
      FLUX_ASSIGN_OR_RETURN(
          auto stored,
          Flux2Transformer::load(*context.backend, checkpoint.weights, Fp8Placement::kStored));
      if (std::string(plan) == "resident")
        FLUX_RETURN_IF_ERROR(stored->dequantize_stored_weights().status());
      models.same_bits.emplace_back(plan, std::move(stored));
    }
    return models;
  }
  FLUX_RETURN_IF_ERROR(models.model->enable_quality_high().status());
  if (context.fp8_backend != nullptr) {
    FLUX_ASSIGN_OR_RETURN(models.fp8_reference,
                          load_high(*context.fp8_backend, checkpoint, Fp8InputScale::kDynamic));
  }
  if (context.fp8_backend != nullptr && count_input_scales(checkpoint.weights) > 0) {
    FLUX_ASSIGN_OR_RETURN(models.static_model,
                          load_high(*context.backend, checkpoint, Fp8InputScale::kStatic));
    FLUX_ASSIGN_OR_RETURN(models.static_reference,
                          load_high(*context.fp8_backend, checkpoint, Fp8InputScale::kStatic));
  }
  return models;
}

// --fp8-lossless plans against the host-dequantized model's output `ours`: the same bits.
absl::Status check_same_bits(const GoldenContext& context, const Models& models,
                             const SafetensorsFile& inputs, const std::string& name,
                             const std::string& key, const std::vector<float>& ours,
                             GoldenReport& report) {
  for (const auto& [plan, model] : models.same_bits) {
    FLUX_ASSIGN_OR_RETURN(std::vector<float> theirs,
                          forward(*context.backend, *model, inputs, name));
    size_t differ = 0;
    for (size_t i = 0; i < ours.size() && i < theirs.size(); ++i)
      differ += std::memcmp(&ours[i], &theirs[i], sizeof(float)) != 0;
    report.record(theirs.size() == ours.size() && differ == 0, kFile, key,
                  absl::StrCat("output --fp8-lossless=", plan),
                  absl::StrCat(differ, " of ", ours.size(),
                               " values differ from the host-dequantized weights' output"));
  }
  return absl::OkStatus();
}

// quality=high under the file's static input scales against diffusers on the dequantized
// weights, at the bar the CPU emulation of the same static scales sets.
absl::Status check_static(const GoldenContext& context, const Models& models,
                          const SafetensorsFile& inputs, const std::string& name,
                          const std::string& key, const std::vector<float>& reference,
                          GoldenReport& report) {
  if (models.static_model == nullptr) return absl::OkStatus();
  FLUX_ASSIGN_OR_RETURN(std::vector<float> ours,
                        forward(*context.backend, *models.static_model, inputs, name));
  FLUX_ASSIGN_OR_RETURN(std::vector<float> emulated,
                        forward(*context.fp8_backend, *models.static_reference, inputs, name));
  report.compare(kFile, key, "output --fp8-input-scale=static", ours, reference,
                 context.tolerance(absl::StrCat("fp8_transformer.", key, ".output"),
                                   relative_l2_error(emulated, reference)));
  return absl::OkStatus();
}

// Every check of one layout: format, kept layers, one forward per input case.
absl::Status run_layout(const GoldenContext& context, const nlohmann::json& cases,
                        const std::string& layout, const SafetensorsFile& inputs,
                        const SafetensorsFile& outputs, GoldenReport& report) {
  FLUX_ASSIGN_OR_RETURN(TransformerCheckpoint checkpoint,
                        open_layout(context, cases.at("layouts").at(layout).get<std::string>()));
  report.record(
      checkpoint.format == expected_format(layout), kCases, layout, "format",
      absl::StrCat("detected ", checkpoint.describe(), ", expected ", expected_format(layout)));
  if (cases.contains("kept_bf16") && cases["kept_bf16"].contains(layout))
    check_kept_bf16(checkpoint, layout, cases["kept_bf16"][layout].get<std::string>(), report);
  FLUX_ASSIGN_OR_RETURN(Models models, load_models(context, checkpoint));
  std::optional<RequestScope> reference_request;
  if (models.fp8_reference != nullptr)
    reference_request.emplace(*context.fp8_backend, RequestOptions{Quality::kHigh});
  const RequestScope request(*context.backend, {context.quality});
  for (int k = 0; outputs.find(absl::StrCat(layout, ".case", k, ".output")) != nullptr; ++k) {
    const std::string name = absl::StrCat("case", k), key = absl::StrCat(layout, ".", name);
    FLUX_ASSIGN_OR_RETURN(std::vector<float> reference, read_f32(outputs, key + ".output"));
    FLUX_ASSIGN_OR_RETURN(std::vector<float> ours,
                          forward(*context.backend, *models.model, inputs, name));
    double fp8_error = 0.0;
    if (models.fp8_reference != nullptr) {
      FLUX_ASSIGN_OR_RETURN(std::vector<float> emulated,
                            forward(*context.fp8_backend, *models.fp8_reference, inputs, name));
      fp8_error = relative_l2_error(emulated, reference);
    }
    report.compare(kFile, key, "output", ours, reference,
                   context.tolerance(absl::StrCat("fp8_transformer.", key, ".output"), fp8_error));
    FLUX_RETURN_IF_ERROR(check_same_bits(context, models, inputs, name, key, ours, report));
    FLUX_RETURN_IF_ERROR(check_static(context, models, inputs, name, key, reference, report));
  }
  if (outputs.find(absl::StrCat(layout, ".case0.output")) == nullptr)
    report.fail(kFile, layout, "no cases (" + layout + ".case0.output missing)");
  return absl::OkStatus();
}

}  // namespace

void check_golden_fp8(const GoldenContext& context, GoldenReport& report) {
  auto cases = read_json_file(context.dir + "/" + kCases);
  if (!cases.ok()) return report.fail(kCases, "-", cases.status().message());
  auto inputs = SafetensorsFile::open(context.dir + "/transformer.safetensors");
  if (!inputs.ok()) return report.fail(kFile, "-", inputs.status().message());
  auto outputs = SafetensorsFile::open(context.dir + "/" + kFile);
  if (!outputs.ok()) return report.fail(kFile, "-", outputs.status().message());
  if (!cases->contains("layouts") || !(*cases)["layouts"].is_object() ||
      (*cases)["layouts"].empty())
    return report.fail(kCases, "-", "no layouts");
  for (auto it = (*cases)["layouts"].begin(); it != (*cases)["layouts"].end(); ++it) {
    try {
      absl::Status s = run_layout(context, *cases, it.key(), **inputs, **outputs, report);
      if (!s.ok()) report.fail(kFile, it.key(), s.message());
    } catch (const nlohmann::json::exception& error) {
      report.fail(kCases, it.key(), error.what());
    }
  }
}

}  // namespace flux2
