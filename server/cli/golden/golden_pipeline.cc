// check-golden parts "pipeline", "sigmas", "cache", "edit", "edit_kv", "lora_pipeline" and
// "fp8_pipeline": whole generations prompt (+ custom sigmas, + step caching, + reference images,
// + LoRA adapters, + an FP8 transformer file) -> image (pipeline_cases.json +
// pipeline.safetensors, sigmas_*, cache_* with the decisions (golden_cache.cc), edit_*,
// edit_kv_*, lora_cases.json's pipeline_cases + lora_pipeline.safetensors, fp8_cases.json's +
// fp8_pipeline.safetensors), for whichever
// pipeline the checkpoint's model_index.json names (klein, klein-KV, dev): the prompt embeddings,
// the initial noise, the reference tokens, the latents after every step, the float image and
// image_u8 (tests/data/README.md: 1e-4 relative; u8 equal up to 1 level on <= 0.5% of values);
// a LoRA case's image without any one of its adapters must fail the image's bar.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "kernels/base/numerics.h"
#include "kernels/base/status.h"
#include "model/json_util.h"
#include "model/pipeline.h"
#include "model/reference_image.h"
#include "model/safetensors.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr double kMaxOffByOneFraction = 0.005;  // tests/data/README.md: at most 0.5% of values

// One part: its cases, its vectors and how its pipeline runs.
struct GenerationPart {
  const char* cases;                // e.g. "edit_cases.json"
  const char* vectors;              // e.g. "edit.safetensors"
  bool kv_cache;                    // run as klein-KV
  const char* cases_key = nullptr;  // the cases' member of the cases file (null: the whole file)
};

// A case ready to run: its pipeline and request.
struct PreparedCase {
  std::unique_ptr<Pipeline> pipeline;
  GenerateParams params;
};

// `file` is the whole cases file: a case naming a "layout" (fp8_cases.json) takes its transformer
// from the file or folder file["layouts"][layout].
absl::StatusOr<PreparedCase> prepare_case(const GoldenContext& context, const GenerationPart& part,
                                          const nlohmann::json& file, const nlohmann::json& item) {
  PipelineOptions options;
  options.is_distilled = item.value("is_distilled", true);
  options.kv_cache = part.kv_cache;
  if (item.contains("layout")) {
    options.transformer_file =
        context.dir + "/" +
        file.at("layouts").at(item.at("layout").get<std::string>()).get<std::string>();
  }
  // A case naming its checkpoint (cache_cases.json) takes it relative to the directory.
  const std::string checkpoint = item.contains("checkpoint")
                                     ? context.dir + "/" + item.at("checkpoint").get<std::string>()
                                     : context.checkpoint_dir();
  PreparedCase prepared;
  FLUX_ASSIGN_OR_RETURN(prepared.pipeline, Pipeline::load(*context.backend, checkpoint, options));
  GenerateParams& params = prepared.params;
  params.prompt = item.at("prompt").get<std::string>();
  if (item.value("size_given", true)) {  // else the size comes from the first reference
    params.height = item.at("height").get<int64_t>();
    params.width = item.at("width").get<int64_t>();
  }
  if (item.contains("references")) {
    for (size_t k = 0; k < item.at("references").size(); ++k) {
      const std::string path = context.dir + "/" + item.at("references")[k].get<std::string>();
      FLUX_ASSIGN_OR_RETURN(RgbImage reference,
                            load_reference_file(path, prepared.pipeline->info().pixel_multiple,
                                                absl::StrCat("references[", k, "]")));
      params.references.push_back(std::move(reference));
    }
  }
  params.num_inference_steps = item.at("steps").get<int64_t>();
  if (item.contains("sigmas")) params.sigmas = item.at("sigmas").get<std::vector<double>>();
  params.seed = item.at("seed").get<uint64_t>();
  params.guidance_scale = item.value("guidance_scale", -1.0);
  params.max_sequence_length = item.at("max_sequence_length").get<int64_t>();
  if (item.contains("adapters")) {
    FLUX_ASSIGN_OR_RETURN(params.loras, golden_loras(context, item.at("adapters"),
                                                     prepared.pipeline->transformer_config()));
  }
  if (item.contains("R")) params.cache = golden_step_cache_options(item);
  return prepared;
}

// A generation and the tensors its hooks saw, by the goldens' names.
struct Generation {
  GeneratedImage image;
  std::map<std::string, std::vector<float>> tensors;
};

absl::StatusOr<Generation> generate_case(Backend& be, Pipeline& pipeline,
                                         const GenerateParams& params) {
  Generation out;
  absl::Status hook_status;
  auto keep = [&](const std::string& key, const Tensor& t) {
    auto values = download_values(be, t);
    if (!values.ok())
      hook_status = values.status();
    else
      out.tensors[key] = std::move(*values);
  };
  GenerateHooks hooks;
  hooks.on_latents = [&](int64_t step, const Tensor& latents) {
    keep(step < 0 ? "initial_latents" : absl::StrCat("latents_after_step", step), latents);
  };
  hooks.on_image = [&](const Tensor& image) { keep("image", image); };
  hooks.on_prompt_embeds = [&](const Tensor& embeds) { keep("prompt_embeds", embeds); };
  hooks.on_references = [&](const Tensor& tokens, std::span<const int64_t> ids) {
    keep("image_latents", tokens);
    out.tensors["image_latent_ids"].assign(ids.begin(), ids.end());
  };
  FLUX_ASSIGN_OR_RETURN(out.image, pipeline.generate(params, hooks));
  FLUX_RETURN_IF_ERROR(hook_status);
  return out;
}

// Our float image as the goldens store theirs: clamp(x / 2 + 0.5, 0, 1), channels last.
std::vector<float> unit_range_image(std::vector<float> image) {
  for (float& v : image) v = std::min(1.0f, std::max(0.0f, v / 2.0f + 0.5f));
  return image;
}

// image_u8: equal up to one level on at most kMaxOffByOneFraction of the values.
void record_image_u8(const char* file, const std::string& name, const std::vector<uint8_t>& rgb,
                     const std::vector<float>& ref, GoldenReport& report) {
  int64_t off_by_one = 0, worse = 0;
  for (size_t i = 0; i < ref.size() && i < rgb.size(); ++i) {
    const int diff = std::abs(static_cast<int>(rgb[i]) - static_cast<int>(ref[i]));
    off_by_one += diff == 1;
    worse += diff > 1;
  }
  const double fraction = ref.empty() ? 1.0 : static_cast<double>(off_by_one) / ref.size();
  report.record(worse == 0 && fraction <= kMaxOffByOneFraction && rgb.size() == ref.size(), file,
                name, "image_u8",
                absl::StrFormat("off_by_one=%.4f%% worse=%d tol=%.2f%%", 100 * fraction, worse,
                                100 * kMaxOffByOneFraction));
}

// Every vector of case `name` against what the generation produced.
absl::Status compare_case(const GoldenContext& context, const char* kFile,
                          const SafetensorsFile& vectors, const std::string& name,
                          const GenerateParams& params, const Generation& produced,
                          GoldenReport& report) {
  const int64_t h = params.height / 16, w = params.width / 16;
  const std::string p = name + ".";
  for (const SafetensorsEntry& entry : vectors.entries()) {
    if (entry.name.rfind(p, 0) != 0) continue;
    const std::string tensor = entry.name.substr(p.size());
    FLUX_ASSIGN_OR_RETURN(std::vector<float> reference, read_f32(vectors, entry.name));
    const absl::StatusOr<double> tolerance = context.tolerance(
        absl::StrCat(absl::StripSuffix(kFile, ".safetensors"), ".", name, ".", tensor));
    const auto found = produced.tensors.find(tensor);
    const bool has = found != produced.tensors.end();
    const std::vector<float> ours = has ? found->second : std::vector<float>{};
    if (tensor == "initial_latents") {
      report.compare(kFile, name, tensor, ours, chw_to_hwc(reference, 128, h * w, 1), tolerance);
    } else if (tensor == "image") {
      report.compare(kFile, name, tensor, unit_range_image(ours),
                     chw_to_hwc(reference, 3, params.height, params.width), tolerance);
    } else if (tensor == "image_u8") {
      record_image_u8(kFile, name, produced.image.rgb,
                      chw_to_hwc(reference, 3, params.height, params.width), report);
    } else if (tensor == "image_latent_ids") {  // integer positions: equal
      const bool equal = ours == reference;
      report.record(equal, kFile, name, tensor, equal ? "equal" : "position ids differ");
    } else if (has) {
      report.compare(kFile, name, tensor, ours, reference, tolerance);
    } else {
      report.fail(kFile, name, absl::StrCat(tensor, ": the pipeline produced no such tensor"));
    }
  }
  return absl::OkStatus();
}

// A LoRA case's image without any one of its adapters must fail the image's bar: each adapter
// is shown to matter (as golden_lora.cc shows for the transformer's outputs).
absl::Status check_each_adapter_matters(const GoldenContext& context, const char* kFile,
                                        const nlohmann::json& item, const SafetensorsFile& vectors,
                                        const std::string& name, PreparedCase& prepared,
                                        GoldenReport& report) {
  const std::string key =
      absl::StrCat(absl::StripSuffix(kFile, ".safetensors"), ".", name, ".image");
  const absl::StatusOr<double> tolerance = context.tolerance(key);
  if (!tolerance.ok() || vectors.find(name + ".image") == nullptr) return absl::OkStatus();
  FLUX_ASSIGN_OR_RETURN(std::vector<float> golden, read_f32(vectors, name + ".image"));
  const GenerateParams& params = prepared.params;
  const std::vector<float> reference = chw_to_hwc(golden, 3, params.height, params.width);
  for (size_t drop = 0; drop < params.loras.size(); ++drop) {
    GenerateParams without = params;
    without.loras.erase(without.loras.begin() + static_cast<std::ptrdiff_t>(drop));
    FLUX_ASSIGN_OR_RETURN(Generation produced,
                          generate_case(*context.backend, *prepared.pipeline, without));
    const double error = relative_l2_error(unit_range_image(produced.tensors["image"]), reference);
    // Finite: a NaN image or one of another size (relative_l2_error's infinity) shows nothing.
    report.record(
        std::isfinite(error) && error > *tolerance, kFile, name,
        absl::StrCat("image without ", item.at("adapters")[drop].at(0).get<std::string>()),
        absl::StrFormat("rel=%.3g must exceed tol=%.3g (and be finite)", error, *tolerance));
  }
  return absl::OkStatus();
}

absl::Status run_case(const GoldenContext& context, const GenerationPart& part,
                      const nlohmann::json& file, const nlohmann::json& item,
                      const SafetensorsFile& vectors, const std::string& name,
                      GoldenReport& report) {
  const char* kFile = part.vectors;
  FLUX_ASSIGN_OR_RETURN(PreparedCase prepared, prepare_case(context, part, file, item));
  GenerateParams& params = prepared.params;
  FLUX_ASSIGN_OR_RETURN(Generation produced,
                        generate_case(*context.backend, *prepared.pipeline, params));
  const GeneratedImage& image = produced.image;
  if (image.width != item.at("width").get<int64_t>() ||
      image.height != item.at("height").get<int64_t>()) {
    report.fail(
        kFile, name,
        absl::StrCat("generated ", image.width, "x", image.height, ", expected ",
                     item.at("width").get<int64_t>(), "x", item.at("height").get<int64_t>()));
    return absl::OkStatus();
  }
  params.width = image.width;
  params.height = image.height;
  if (item.contains("decisions")) check_golden_step_cache(kFile, name, item, image.cache, report);
  FLUX_RETURN_IF_ERROR(compare_case(context, kFile, vectors, name, params, produced, report));
  if (params.loras.empty()) return absl::OkStatus();
  return check_each_adapter_matters(context, kFile, item, vectors, name, prepared, report);
}

void check_generations(const GoldenContext& context, const GenerationPart& part,
                       GoldenReport& report) {
  auto file = read_json_file(context.dir + "/" + part.cases);
  if (!file.ok()) return report.fail(part.cases, "-", file.status().message());
  const nlohmann::json* cases = &*file;
  if (part.cases_key != nullptr) {
    if (!file->contains(part.cases_key)) return report.fail(part.cases, "-", "no cases");
    cases = &(*file)[part.cases_key];
  }
  auto vectors = SafetensorsFile::open(context.dir + "/" + part.vectors);
  if (!vectors.ok()) return report.fail(part.vectors, "-", vectors.status().message());
  if (!cases->is_array() || cases->empty()) return report.fail(part.cases, "-", "no cases");
  if (context.backend->activation_dtype() != DType::kF32) {
    // tests/data/README.md: with random weights bf16 generations are chaotic; compare modules
    // instead.
    report.skip(
        part.vectors,
        "whole generations are compared on float32 backends only (tests/data/README.md: bf16 "
        "generations with random weights are chaotic; modules are compared instead)");
    return;
  }
  for (size_t k = 0; k < cases->size(); ++k) {
    const std::string name = absl::StrCat("case", k);
    try {
      if (absl::Status s = run_case(context, part, *file, (*cases)[k], **vectors, name, report);
          !s.ok()) {
        report.fail(part.vectors, name, s.message());
      }
    } catch (const nlohmann::json::exception& error) {
      report.fail(part.cases, name, error.what());
    }
  }
}

}  // namespace

void check_golden_pipeline(const GoldenContext& context, GoldenReport& report) {
  check_generations(context, {"pipeline_cases.json", "pipeline.safetensors", false}, report);
}

void check_golden_sigmas(const GoldenContext& context, GoldenReport& report) {
  check_generations(context, {"sigmas_cases.json", "sigmas.safetensors", false}, report);
}

void check_golden_cache(const GoldenContext& context, GoldenReport& report) {
  check_generations(context, {"cache_cases.json", "cache.safetensors", false, "cases"}, report);
}

void check_golden_edit(const GoldenContext& context, GoldenReport& report) {
  check_generations(context, {"edit_cases.json", "edit.safetensors", false}, report);
}

void check_golden_edit_kv(const GoldenContext& context, GoldenReport& report) {
  check_generations(context, {"edit_kv_cases.json", "edit_kv.safetensors", true}, report);
}

void check_golden_lora_pipeline(const GoldenContext& context, GoldenReport& report) {
  check_generations(
      context, {"lora_cases.json", "lora_pipeline.safetensors", false, "pipeline_cases"}, report);
}

void check_golden_fp8_pipeline(const GoldenContext& context, GoldenReport& report) {
  check_generations(
      context, {"fp8_cases.json", "fp8_pipeline.safetensors", false, "pipeline_cases"}, report);
}

}  // namespace flux2
