// check-golden part "lora": one transformer forward per lora_cases.json transformer case with its
// adapters applied (lora_transformer.safetensors), the bar of the transformer part; then the same
// case without each of its adapters in turn, which must fail that bar (a missing adapter is
// visible). "lora_pipeline" (whole generations with adapters) runs in golden_pipeline.cc.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/numerics.h"
#include "kernels/base/read_file.h"
#include "kernels/base/status.h"
#include "model/checkpoint.h"
#include "model/flux2_lora.h"
#include "model/flux2_transformer.h"
#include "model/json_util.h"
#include "model/lora_adapter.h"
#include "model/safetensors.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {

absl::StatusOr<std::vector<LoraRequest>> golden_loras(const GoldenContext& context,
                                                      const nlohmann::json& adapters,
                                                      const Flux2Config& config) {
  FLUX_ASSIGN_OR_RETURN(nlohmann::json cases, read_json_file(context.dir + "/lora_cases.json"));
  std::vector<LoraRequest> loras;
  for (const nlohmann::json& entry : adapters) {
    const std::string name = entry.at(0).get<std::string>();
    const std::string path =
        context.dir + "/" + cases.at("adapters").at(name).at("file").get<std::string>();
    FLUX_ASSIGN_OR_RETURN(std::string bytes, read_file(path, name));
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    absl::StatusOr<LoraAdapter> adapter =
        parse_lora_adapter(std::span<const uint8_t>(data, bytes.size()), config);
    if (!adapter.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", adapter.status().message()));
    }
    loras.push_back({path, std::make_shared<const LoraAdapter>(std::move(*adapter)),
                     entry.at(1).get<double>()});
  }
  return loras;
}

namespace {

constexpr char kFile[] = "lora_transformer.safetensors";

// The output of one forward of `model` on transformer.safetensors case `input` with `loras`.
absl::StatusOr<std::vector<float>> forward_with(Backend& be, const Flux2Transformer& model,
                                                const SafetensorsFile& inputs, int input,
                                                std::span<const LoraRequest> loras) {
  const Flux2Config& config = model.config();
  FLUX_ASSIGN_OR_RETURN(TransformerInputs in,
                        transformer_inputs(be, config, inputs, absl::StrCat("case", input, ".")));
  FLUX_ASSIGN_OR_RETURN(Tensor out,
                        be.empty(be.activation_dtype(), {in.x.rows(), config.out_channels}));
  LoraDeviceCache uploads;  // no budget: this forward's adapters only
  FLUX_ASSIGN_OR_RETURN(std::vector<Flux2LoraUse> uses, uploads.acquire(be, config, loras));
  auto lora = std::make_shared<const Flux2Lora>(flux2_lora(config, uses));
  FLUX_ASSIGN_OR_RETURN(
      Flux2Conditioning cond,
      model.prepare(in.prompt, in.txt_ids, in.img_ids, in.timestep, in.guidance, nullptr, lora));
  FLUX_RETURN_IF_ERROR(model.forward(cond, 0, in.x, out));
  return download_values(be, out);
}

// The two models of a check: the one under test and, at quality=high, the CPU's FP8 emulation.
struct Models {
  std::unique_ptr<Flux2Transformer> model, fp8_reference;
};

absl::Status run_case(const GoldenContext& context, const Models& models,
                      const SafetensorsFile& inputs, const SafetensorsFile& outputs,
                      const nlohmann::json& item, const std::string& name, GoldenReport& report) {
  const Flux2Config& config = models.model->config();
  const int input = item.at("input_case").get<int>();
  FLUX_ASSIGN_OR_RETURN(std::vector<LoraRequest> loras,
                        golden_loras(context, item.at("adapters"), config));
  FLUX_ASSIGN_OR_RETURN(std::vector<float> reference, read_f32(outputs, name + ".output"));
  FLUX_ASSIGN_OR_RETURN(std::vector<float> ours,
                        forward_with(*context.backend, *models.model, inputs, input, loras));
  double fp8_error = 0.0;
  if (models.fp8_reference != nullptr) {
    FLUX_ASSIGN_OR_RETURN(
        std::vector<float> emulated,
        forward_with(*context.fp8_backend, *models.fp8_reference, inputs, input, loras));
    fp8_error = relative_l2_error(emulated, reference);
  }
  const absl::StatusOr<double> tolerance =
      context.tolerance(absl::StrCat("lora_transformer.", name, ".output"), fp8_error);
  report.compare(kFile, name, "output", ours, reference, tolerance);
  if (!tolerance.ok()) return absl::OkStatus();
  // Without any one adapter the output must fail the same bar.
  for (size_t drop = 0; drop < loras.size(); ++drop) {
    std::vector<LoraRequest> rest = loras;
    rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(drop));
    FLUX_ASSIGN_OR_RETURN(std::vector<float> without,
                          forward_with(*context.backend, *models.model, inputs, input, rest));
    const double error = relative_l2_error(without, reference);
    // Finite: a NaN output or one of another size (relative_l2_error's infinity) shows nothing.
    report.record(
        std::isfinite(error) && error > *tolerance, kFile, name,
        absl::StrCat("output without ", item.at("adapters")[drop].at(0).get<std::string>()),
        absl::StrFormat("rel=%.3g must exceed tol=%.3g (and be finite)", error, *tolerance));
  }
  return absl::OkStatus();
}

absl::StatusOr<Models> load_models(const GoldenContext& context) {
  FLUX_ASSIGN_OR_RETURN(ComponentWeights checkpoint,
                        ComponentWeights::open(context.checkpoint_dir() + "/transformer"));
  Models models;
  FLUX_ASSIGN_OR_RETURN(models.model, Flux2Transformer::load(*context.backend, checkpoint));
  if (context.quality != Quality::kHigh) return models;
  FLUX_RETURN_IF_ERROR(models.model->enable_quality_high().status());
  if (context.fp8_backend != nullptr) {
    FLUX_ASSIGN_OR_RETURN(models.fp8_reference,
                          Flux2Transformer::load(*context.fp8_backend, checkpoint));
    FLUX_RETURN_IF_ERROR(models.fp8_reference->enable_quality_high().status());
  }
  return models;
}

}  // namespace

void check_golden_lora(const GoldenContext& context, GoldenReport& report) {
  auto cases = read_json_file(context.dir + "/lora_cases.json");
  if (!cases.ok()) return report.fail("lora_cases.json", "-", cases.status().message());
  auto inputs = SafetensorsFile::open(context.dir + "/transformer.safetensors");
  if (!inputs.ok()) return report.fail(kFile, "-", inputs.status().message());
  auto outputs = SafetensorsFile::open(context.dir + "/" + kFile);
  if (!outputs.ok()) return report.fail(kFile, "-", outputs.status().message());
  auto models = load_models(context);
  if (!models.ok()) return report.fail(kFile, "-", models.status().message());
  std::optional<RequestScope> reference_request;
  if (context.fp8_backend != nullptr && context.quality == Quality::kHigh) {
    reference_request.emplace(*context.fp8_backend, RequestOptions{Quality::kHigh});
  }
  const RequestScope request(*context.backend, {context.quality});
  const nlohmann::json& items = cases->at("transformer_cases");
  if (items.empty()) return report.fail("lora_cases.json", "-", "no transformer cases");
  for (size_t k = 0; k < items.size(); ++k) {
    const std::string name = absl::StrCat("case", k);
    try {
      absl::Status s = run_case(context, *models, **inputs, **outputs, items[k], name, report);
      if (!s.ok()) report.fail(kFile, name, s.message());
    } catch (const nlohmann::json::exception& error) {
      report.fail("lora_cases.json", name, error.what());
    }
  }
}

}  // namespace flux2
