// flux2 bench --e2e; see bench_e2e.h.
#include "server/cli/bench/bench_e2e.h"

#include <chrono>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/status.h"
#include "model/flux2_presets.h"
#include "model/image_encode.h"
#include "model/pipeline.h"
#include "model/pipeline_presets.h"
#include "model/scheduler.h"
#include "server/cli/bench/gpu_sampler.h"
#include "server/cli/bench/median.h"

namespace flux2 {
namespace {

// Each phase of the timed requests, in ms.
struct E2eTimes {
  std::vector<double> e2e, tokenize, text_encode, noise, reference_encode, denoise, decode, encode,
      steps, first_steps, later_steps;
  StepCacheCounts cache_counts;  // the last request's (a schedule repeats; DBCache's may vary)

  void add(const GeneratedImage& image, double request_ms, double encode_ms) {
    e2e.push_back(request_ms);
    encode.push_back(encode_ms);
    tokenize.push_back(1e3 * image.timings.tokenize);
    text_encode.push_back(1e3 * image.timings.text_encode);
    noise.push_back(1e3 * image.timings.noise);
    reference_encode.push_back(1e3 * image.timings.reference_encode);
    for (size_t i = 0; i < image.timings.steps.size(); ++i) {
      (i == 0 ? first_steps : later_steps).push_back(1e3 * image.timings.steps[i]);
      steps.push_back(1e3 * image.timings.steps[i]);
    }
    denoise.push_back(1e3 * image.timings.denoise);
    decode.push_back(1e3 * image.timings.decode);
    cache_counts = StepCacheCounts{};
    cache_counts.add(image.cache);
  }
};

absl::StatusOr<RandomPipelineSpec> e2e_spec(const BenchOptions& o,
                                            const std::string& tokenizer_dir) {
  FLUX_ASSIGN_OR_RETURN(RandomPipelineSpec spec, random_pipeline_spec(o.model, tokenizer_dir));
  spec.enable_quality_high = o.request.quality == Quality::kHigh;
  spec.fp8_weights = o.fp8_weights();
  FLUX_ASSIGN_OR_RETURN(spec.fp8_lossless, parse_fp8_lossless(o.fp8_lossless));
  FLUX_ASSIGN_OR_RETURN(spec.fp8_input_scale, parse_fp8_input_scale(o.fp8_input_scale));
  spec.kv_cache = o.kv_cache;
  spec.is_distilled = !o.base;
  if (o.text_encoder_offload) spec.text_encoder_residency = WeightResidency::kStreamed;
  // Every run repeats the prompt: without --prompt-cache each one encodes it, as a new prompt does.
  if (!o.prompt_cache) spec.prompt_cache_bytes = 0;
  spec.on_progress = [](const LoadProgress& step) { bench_progress(describe(step)); };
  return spec;
}

// `count` noise-like references at the output size: the encoder's cost is the same.
std::vector<RgbImage> noise_references(int64_t count, int64_t width, int64_t height) {
  std::vector<RgbImage> references;
  for (int64_t k = 0; k < count; ++k) {
    RgbImage reference{width, height,
                       std::vector<uint8_t>(static_cast<size_t>(width * height * 3))};
    uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(k + 1);
    for (uint8_t& value : reference.pixels) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      value = static_cast<uint8_t>(state >> 56);
    }
    references.push_back(std::move(reference));
  }
  return references;
}

absl::StatusOr<GenerateParams> e2e_params(const BenchOptions& o) {
  GenerateParams params;
  params.prompt =
      "A photo of a red fox in fresh snow at golden hour, watercolor style, highly detailed";
  params.height = o.height;
  params.width = o.width;
  params.num_inference_steps = o.model == "dev" || o.base ? 50 : 4;  // the published defaults
  params.cache = o.step_cache;
  if (params.cache.mode == StepCacheOptions::Mode::kSchedule) {
    FLUX_ASSIGN_OR_RETURN(params.cache.schedule,
                          parse_step_cache_schedule(o.cache_schedule, params.num_inference_steps));
  }
  params.max_sequence_length = o.text_len;
  params.fast_paths = o.request.fast_paths;
  params.quality = o.request.quality;
  params.references = noise_references(o.references, o.width, o.height);
  return params;
}

// One warm-up request, then `repeats` timed ones (`label` names them in the progress lines);
// `sampler`, when given, samples the clock and power from the first timed request on.
absl::StatusOr<E2eTimes> time_requests(Backend& be, Pipeline& pipeline,
                                       const GenerateParams& params, int repeats,
                                       const std::string& label,
                                       std::optional<GpuSampler>* sampler) {
  E2eTimes times;
  for (int run = -1; run < repeats; ++run) {  // run -1 warms up
    if (run == 0 && sampler != nullptr) sampler->emplace(be.device_pci_bus_id());
    const auto start = std::chrono::steady_clock::now();
    FLUX_ASSIGN_OR_RETURN(GeneratedImage image, pipeline.generate(params));
    const auto encode_start = std::chrono::steady_clock::now();
    FLUX_ASSIGN_OR_RETURN(std::vector<uint8_t> png,
                          encode_png(image.rgb, image.width, image.height));
    const auto end = std::chrono::steady_clock::now();
    const double request_ms = std::chrono::duration<double, std::milli>(end - start).count();
    bench_progress(
        run < 0 ? absl::StrFormat("%swarm-up request: %.1f ms", label, request_ms)
                : absl::StrFormat("%srequest %d/%d: %.1f ms", label, run + 1, repeats, request_ms));
    if (run < 0) continue;
    times.add(image, request_ms,
              std::chrono::duration<double, std::milli>(end - encode_start).count());
  }
  return times;
}

// --lora-rank: the adapters on the request, kept resident by the pipeline's device cache (the
// warm-up request uploads them, as a server's first request with them does).
void add_random_loras(const BenchOptions& o, const Flux2Config& config, Backend& be,
                      Pipeline& pipeline, GenerateParams& params) {
  params.loras = random_lora_requests(config, o);
  int64_t bytes = 0;
  for (const LoraRequest& r : params.loras) {
    bytes += Flux2LoraWeights::device_bytes(*r.adapter, dtype_size(be.weight_dtype()));
  }
  pipeline.lora_cache().set_capacity(bytes);
}

// What the timed requests say: what ran, each phase's median, the step's TFLOP/s and floor, the
// step cache's forwards, the weights.
nlohmann::json e2e_result(Backend& be, const BenchOptions& o, const RandomPipelineSpec& spec,
                          const Pipeline& pipeline, const GenerateParams& params,
                          const E2eTimes& t) {
  const double step_median = median_of(t.steps);
  const int64_t n = (o.height / 16) * (o.width / 16);
  const StepFlops flops = flux2_step_flops(spec.transformer, n, o.text_len);
  const double floor = flux2_floor_ms(spec.transformer, n, o.text_len);
  const StepCacheCounts& cache_counts = t.cache_counts;
  const PipelineInfo& info = pipeline.info();
  return {{"model", o.model},
          {"quality", o.quality},
          {"height", o.height},
          {"width", o.width},
          {"text_len", o.text_len},
          {"backend", std::string(be.name())},
          {"fast_paths", o.request.fast_paths},
          {"e2e", true},
          {"weights", o.weights},
          {"fp8_lossless", o.fp8_weights() ? o.fp8_lossless : ""},
          {"fp8_input_scale", o.fp8_weights() ? o.fp8_input_scale : ""},
          {"fp8_gemms", info.fp8_gemms},
          {"fp8_static_scale_gemms", info.fp8_static_scale_gemms},
          {"request_steps", params.num_inference_steps},
          {"references", o.references},
          {"kv_cache", o.kv_cache},
          {"base", o.base},
          {"cache", o.cache},
          {"cache_params", cache_description(params.cache)},
          {"cache_forwards",
           {{"double_computed", cache_counts.computed[0]},
            {"double_cached", cache_counts.cached[0]},
            {"single_computed", cache_counts.computed[1]},
            {"single_cached", cache_counts.cached[1]}}},
          {"ms_reference_encode", median_of(t.reference_encode)},
          {"ms_first_step_median", median_of(t.first_steps)},
          {"ms_later_steps_median", median_of(t.later_steps)},
          {"ms_e2e_median", median_of(t.e2e)},
          {"ms_tokenize", median_of(t.tokenize)},
          {"ms_text_encode", median_of(t.text_encode)},
          {"ms_noise", median_of(t.noise)},
          {"ms_denoise", median_of(t.denoise)},
          {"ms_decode", median_of(t.decode)},
          {"ms_encode", median_of(t.encode)},
          {"ms_per_step_median", step_median},
          {"tflops", (flops.linear + flops.attention) / (step_median * 1e9)},
          {"floor_ms", floor},
          {"floor_fraction", floor / step_median},
          {"weight_bytes", info.device_bytes},
          {"text_encoder_offload", o.text_encoder_offload},
          {"text_encoder_host_bytes", info.text_encoder_host_bytes},
          {"prompt_cache", o.prompt_cache},
          {"device_memory_cap_gb", o.device_memory_cap_gb},
          {"load_seconds", info.load_seconds}};
}

// --lora-rank: the same requests without the adapters (their clock too), and the ratios.
absl::Status add_without_lora(Backend& be, const BenchOptions& o, const RandomPipelineSpec& spec,
                              Pipeline& pipeline, const GenerateParams& params, int repeats,
                              const E2eTimes& with, nlohmann::json& result) {
  GenerateParams plain = params;
  plain.loras.clear();
  std::optional<GpuSampler> sampler;
  FLUX_ASSIGN_OR_RETURN(const E2eTimes without,
                        time_requests(be, pipeline, plain, repeats, "without LoRA: ", &sampler));
  add_clock_power(sampler ? sampler->stop() : std::nullopt, result, "without_lora_");
  result.update(lora_result(spec.transformer, o, dtype_size(be.weight_dtype())));
  result["ms_e2e_without_lora_median"] = median_of(without.e2e);
  result["ms_per_step_without_lora_median"] = median_of(without.steps);
  result["lora_e2e_ratio"] = median_of(with.e2e) / median_of(without.e2e);
  result["lora_step_ratio"] = median_of(with.steps) / median_of(without.steps);
  return absl::OkStatus();
}

}  // namespace

std::string cache_description(const StepCacheOptions& cache) {
  if (cache.mode == StepCacheOptions::Mode::kDbCache) {
    return absl::StrFormat("W%d MC%d R%g", cache.warmup_steps, cache.max_consecutive_cached,
                           cache.threshold);
  }
  if (cache.mode == StepCacheOptions::Mode::kOff) return "off";
  std::string flags;
  for (bool compute : cache.schedule) flags += compute ? '1' : '0';
  return flags;
}

absl::StatusOr<nlohmann::json> bench_e2e(Backend& be, const BenchOptions& o,
                                         const std::string& tokenizer_dir, int repeats) {
  FLUX_ASSIGN_OR_RETURN(const RandomPipelineSpec spec, e2e_spec(o, tokenizer_dir));
  Tensor ballast;  // --device-memory-cap-gb: what a smaller device would not have
  if (o.device_memory_cap_gb > 0.0) {
    const int64_t cap = static_cast<int64_t>(o.device_memory_cap_gb * 1e9);
    const int64_t held = be.memory_stats().total_bytes - cap;
    if (held > 0) {
      FLUX_ASSIGN_OR_RETURN(ballast, be.empty(DType::kU8, {held}));
    }
  }
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline, Pipeline::create_random(be, spec));
  FLUX_ASSIGN_OR_RETURN(GenerateParams params, e2e_params(o));
  add_random_loras(o, spec.transformer, be, *pipeline, params);
  const int64_t free_after_load = be.free_device_bytes();
  be.reset_peak_memory();
  const std::vector<FastPathCounters> before = fast_path_snapshot();
  std::optional<GpuSampler> sampler;  // the clock and power of the timed requests
  FLUX_ASSIGN_OR_RETURN(const E2eTimes t,
                        time_requests(be, *pipeline, params, repeats, "", &sampler));
  const std::optional<GpuClockPower> clock_power = sampler ? sampler->stop() : std::nullopt;
  BackendMemoryStats memory = be.memory_stats();
  memory.peak_bytes -= ballast.bytes();  // the pipeline's own peak
  const nlohmann::json fallbacks = fallbacks_since(before);
  std::map<std::string, double> profile;
  if (o.profile != OpProfiling::kOff) {  // one more request with events around every op
    be.set_op_profiling(o.profile);
    FLUX_ASSIGN_OR_RETURN(GeneratedImage image, pipeline->generate(params));
    be.set_op_profiling(OpProfiling::kOff);
    profile = be.take_op_profile();
  }
  nlohmann::json result = e2e_result(be, o, spec, *pipeline, params, t);
  result.update(nlohmann::json{{"repeats", repeats},
                               {"fast_path_fallbacks", fallbacks},
                               {"peak_device_bytes", memory.peak_bytes},
                               {"free_device_bytes_after_load", free_after_load},
                               {"profile_ms", profile}});
  FLUX_ASSIGN_OR_RETURN(result["gemm_plans"], gemm_plans(be, o));
  add_clock_power(clock_power, result);
  if (!params.loras.empty()) {
    FLUX_RETURN_IF_ERROR(add_without_lora(be, o, spec, *pipeline, params, repeats, t, result));
  }
  return result;
}

}  // namespace flux2
