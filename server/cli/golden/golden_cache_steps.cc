// check-golden part "cache_steps": the step-cache generations (cache_cases.json +
// cache.safetensors) module by module: the recorded decisions forced, each step started from the
// golden's latents (teacher forcing), the step's velocity against the golden's within the bars
// (float32 1e-4; bf16 max(2 e_ref, 1e-2), e_ref per step from bf16_reference_cache.json, made by
// tests/gpu/make_cache_references.py). Run by `flux2 check-golden --golden tests/data/cache`.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/json_util.h"
#include "model/pipeline.h"
#include "model/safetensors.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "cache.safetensors";

// The golden's latents before each step, [N, 128] each, and after the last: steps + 1 of them.
absl::StatusOr<std::vector<std::vector<float>>> golden_latents(const SafetensorsFile& vectors,
                                                               const std::string& name,
                                                               int64_t steps, int64_t tokens) {
  std::vector<std::vector<float>> latents;
  FLUX_ASSIGN_OR_RETURN(std::vector<float> initial,
                        read_f32(vectors, absl::StrCat(name, ".initial_latents")));
  latents.push_back(chw_to_hwc(initial, 128, tokens, 1));
  for (int64_t s = 0; s < steps; ++s) {
    FLUX_ASSIGN_OR_RETURN(std::vector<float> after,
                          read_f32(vectors, absl::StrCat(name, ".latents_after_step", s)));
    latents.push_back(std::move(after));
  }
  return latents;
}

// The golden's velocity of step s: (latents after s - latents before s) / dt_s, in float64.
std::vector<float> golden_velocity(const std::vector<std::vector<float>>& latents, int64_t s,
                                   float dt) {
  std::vector<float> v(latents[s].size());
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>((static_cast<double>(latents[s + 1][i]) - latents[s][i]) / dt);
  }
  return v;
}

absl::Status run_case(const GoldenContext& context, const nlohmann::json& item,
                      const SafetensorsFile& vectors, const std::string& name,
                      GoldenReport& report) {
  Backend& be = *context.backend;
  const std::string checkpoint = context.dir + "/" + item.at("checkpoint").get<std::string>();
  PipelineOptions options;
  options.is_distilled = item.at("is_distilled").get<bool>();
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline,
                        Pipeline::load(be, checkpoint, options));
  GenerateParams params;
  params.prompt = item.at("prompt").get<std::string>();
  params.height = item.at("height").get<int64_t>();
  params.width = item.at("width").get<int64_t>();
  params.num_inference_steps = item.at("steps").get<int64_t>();
  params.seed = item.at("seed").get<uint64_t>();
  params.guidance_scale = item.at("guidance_scale").get<double>();
  params.max_sequence_length = item.at("max_sequence_length").get<int64_t>();
  params.cache = golden_forced_step_cache_options(item);

  const int64_t steps = params.num_inference_steps;
  const int64_t tokens = (params.height / 16) * (params.width / 16);
  FLUX_ASSIGN_OR_RETURN(const std::vector<std::vector<float>> latents,
                        golden_latents(vectors, name, steps, tokens));
  const std::string scheduler_path = checkpoint + "/scheduler/scheduler_config.json";
  FLUX_ASSIGN_OR_RETURN(const nlohmann::json scheduler_json, read_json_file(scheduler_path));
  FLUX_ASSIGN_OR_RETURN(const SchedulerConfig scheduler,
                        SchedulerConfig::from_json(scheduler_json, scheduler_path));
  const Schedule schedule = make_schedule(scheduler, steps, tokens);

  absl::Status hook_status;
  int64_t compared = 0;
  GenerateHooks hooks;
  hooks.before_step = [&](int64_t step, const Tensor& x) {
    return be.upload(latents[step].data(), DType::kF32, x);
  };
  hooks.on_velocity = [&](int64_t step, const Tensor& velocity) {
    absl::StatusOr<std::vector<float>> ours = download_values(be, velocity);
    if (!ours.ok()) {
      hook_status = ours.status();
      return;
    }
    const std::string tensor = absl::StrCat("velocity_step", step);
    report.compare(kFile, name, tensor, *ours, golden_velocity(latents, step, schedule.dt(step)),
                   context.tolerance(absl::StrCat("cache.", name, ".", tensor)));
    ++compared;
  };
  FLUX_RETURN_IF_ERROR(pipeline->generate(params, hooks).status());
  FLUX_RETURN_IF_ERROR(hook_status);
  if (compared != steps) {
    return absl::InternalError(absl::StrCat(compared, " velocities seen, ", steps, " steps"));
  }
  return absl::OkStatus();
}

}  // namespace

void check_golden_cache_steps(const GoldenContext& context, GoldenReport& report) {
  if (context.quality == Quality::kHigh) {
    // e_ref is diffusers' lossless bf16 error; quality=high's cached tier runs the transformer
    // part's FP8 paths, whose bound that part checks.
    return report.skip(kFile, "the step-by-step bf16 bars are for quality=lossless");
  }
  auto file = read_json_file(context.dir + "/cache_cases.json");
  if (!file.ok()) return report.fail("cache_cases.json", "-", file.status().message());
  auto vectors = SafetensorsFile::open(context.dir + "/" + kFile);
  if (!vectors.ok()) return report.fail(kFile, "-", vectors.status().message());
  const nlohmann::json& cases = (*file)["cases"];
  if (!cases.is_array() || cases.empty()) return report.fail("cache_cases.json", "-", "no cases");
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::string name = absl::StrCat("case", k);
    try {
      if (absl::Status s = run_case(context, cases[k], **vectors, name, report); !s.ok()) {
        report.fail(kFile, name, s.message());
      }
    } catch (const nlohmann::json::exception& error) {
      report.fail("cache_cases.json", name, error.what());
    }
  }
}

}  // namespace flux2
