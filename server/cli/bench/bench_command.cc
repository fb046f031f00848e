// `flux2 bench`: per-step latency of the FLUX.2 transformer at real shapes with random weights
// (model/README.md "Work per step and the floor"): warm-up, then the median of >= 10 timed steps
// (device events), TFLOP/s, the fraction of the floor and peak device memory; `--json` prints one
// JSON object per line; --e2e times whole requests (--base: klein-base's 50 CFG steps; --cache:
// with step caching). Run on the GPU machine by tests/gpu/run_on_device.sh.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend_factory.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/base/read_file.h"
#include "kernels/base/status.h"
#include "model/flux2_presets.h"
#include "model/flux2_transformer.h"
#include "model/image_encode.h"
#include "model/lora_device_cache.h"
#include "model/lora_targets.h"
#include "model/pipeline_presets.h"
#include "model/reference_image.h"
#include "model/rope.h"
#include "model/scheduler.h"
#include "nlohmann/json.hpp"
#include "server/cli/bench/bench_attention.h"
#include "server/cli/bench/bench_transformer.h"
#include "server/cli/bench/gpu_sampler.h"
#include "server/cli/bench/lora_load_bench.h"
#include "server/cli/bench/median.h"
#include "server/cli/commands.h"
#include "server/common/backend_flags.h"
#include "server/common/command_line.h"

namespace flux2 {
namespace {

int fail(absl::string_view message) {
  std::fprintf(stderr, "flux2 bench: %s\n", std::string(message).c_str());
  return 1;
}

// Progress on stderr (stdout keeps the results, one JSON object per line with --json).
void progress(absl::string_view message) {
  std::fprintf(stderr, "flux2 bench: %s\n", std::string(message).c_str());
}

struct BenchOptions {
  std::string model = "klein-4b";
  std::string quality = "lossless";
  int64_t height = 1024, width = 1024, text_len = 512;
  int64_t steps = 10, warmup = 3;
  int64_t references = 0;             // --e2e: reference images at the output size (editing)
  bool kv_cache = false;              // --e2e: run as klein-KV (references cached after step 0)
  bool text_encoder_offload = false;  // --e2e: the text encoder streamed from pinned host memory
  bool prompt_cache = false;          // --e2e: repeated prompts served from the prompt cache
  // --e2e --base: klein run as its base model (50 steps, CFG 4.0 against the empty prompt).
  bool base = false;
  // --e2e --cache dbcache|schedule (--cache-warmup, --cache-mc, --cache-threshold: sglang's W 4,
  // MC 3, R 0.24 by default; --cache-schedule dbcache-default or 1,1,0,...): the request's step
  // caching (model/step_cache.h); reported with the forwards it computed and cached.
  std::string cache = "off";
  StepCacheOptions step_cache;
  std::string cache_schedule = "dbcache-default";
  // --e2e: leave only this much device memory free (a ballast allocation), to run a smaller
  // GPU's memory plan on a larger one; 0: no cap.
  double device_memory_cap_gb = 0.0;
  RequestOptions request;  // what the timed work runs under (--quality, --no-fast-paths)
  // --tune-gemm FILE: each GEMM shape's candidates timed, the choices merged into FILE (a
  // --gemm-algorithms table) at the end. --tune-by steps (the default): after the warm-up, each
  // plan's candidates in turn over whole steps (what a request's loop runs, at the clocks the GPU
  // sustains under it); calls: each call on its own on first use (--gemm-autotune), --e2e too.
  std::string tune_gemm;
  bool tune_by_steps = true;
  int64_t tune_candidates = 8;  // --tune-candidates: the heuristic's first N per plan
  bool json = false;
  OpProfiling profile = OpProfiling::kOff;  // also report device time per op category (or shape)
  // --lora-rank R (--loras N): N random adapters of rank R on every Linear, and the step without
  // them timed in the same run for the ratio.
  int64_t lora_rank = 0;
  int64_t loras = 1;
  // --weights bf16|fp8: the transformer's block projections as bf16 values or as an FP8
  // checkpoint's stored weights (random E4M3 codes and row scales), served as --fp8-lossless
  // resident|per_layer says (model/pipeline.h Fp8Lossless; the server's flag); with --e2e the
  // text encoder's too (an FP8 text-encoder file, unless --text-encoder-offload).
  std::string weights = "bf16";
  std::string fp8_lossless = "resident";
  // --fp8-input-scale dynamic|static (with --weights fp8 at --quality high): static quantizes the
  // FP8 GEMMs' activations per tensor under the random weights' input scale (model/
  // weight_loader.h kRandomActivationAmax), as the server's flag on a checkpoint with them.
  std::string fp8_input_scale = "dynamic";
  // --transformer-file FILE (steps only): the transformer from this checkpoint file (what the
  // server's flag takes) instead of random weights, its load timed (bench_transformer.h).
  std::string transformer_file;
  bool fp8_weights() const { return weights == "fp8"; }
  // The FP8 checkpoint flags apply: random FP8 weights, or (possibly FP8) a file's.
  bool fp8_flags_apply() const { return fp8_weights() || !transformer_file.empty(); }
};

// Fallbacks counted since `before` (fast_path_snapshot), by path and reason: a healthy run at the
// real shapes has none.
nlohmann::json fallbacks_since(const std::vector<FastPathCounters>& before) {
  nlohmann::json out = nlohmann::json::object();
  for (const FastPathCounters& now : fast_path_snapshot()) {
    const FastPathCounters* then = nullptr;
    for (const FastPathCounters& b : before) then = b.path == now.path ? &b : then;
    for (const auto& [reason, count] : now.fallbacks) {
      const int64_t earlier =
          then != nullptr && then->fallbacks.count(reason) ? then->fallbacks.at(reason) : 0;
      if (count > earlier) out[now.path][reason] = count - earlier;
    }
  }
  return out;
}

// --tune-gemm: merges the backend's timed GEMM algorithms into the table at `path`.
absl::Status write_tuned_gemms(Backend& be, const std::string& path) {
  absl::StatusOr<std::string> existing = read_file(path, "--tune-gemm");  // none yet: a new table
  FLUX_ASSIGN_OR_RETURN(const std::string table,
                        be.export_gemm_algorithms(existing.ok() ? *existing : ""));
  FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr || std::fwrite(table.data(), 1, table.size(), out) != table.size() ||
      std::fclose(out) != 0) {
    return absl::InternalError(absl::StrCat("--tune-gemm: cannot write ", path));
  }
  progress(absl::StrCat("tuned GEMM algorithms merged into ", path));
  return absl::OkStatus();
}

// What the result JSON says about the GEMM plans (and writes --tune-gemm's table).
absl::StatusOr<nlohmann::json> gemm_plans(Backend& be, const BenchOptions& o) {
  if (!o.tune_gemm.empty()) FLUX_RETURN_IF_ERROR(write_tuned_gemms(be, o.tune_gemm));
  return nlohmann::json(be.gemm_plan_stats());
}

// --tune-gemm --tune-by steps: every plan's candidates in turn, each timed as the median of
// kTunedSteps back to back (after one more untimed), keeping one only when its steps beat the
// current choice by kTuneMargin (so run-to-run noise does not pick). `reset` refills the inputs
// before each measurement (the extra steps would otherwise keep integrating). Returns the step
// medians before and after.
absl::StatusOr<std::pair<double, double>> tune_gemms_by_steps(
    Backend& be, const BenchOptions& o, const std::function<absl::Status(int64_t)>& step,
    const std::function<absl::Status()>& reset) {
  GemmCandidates* tuner = be.gemm_candidates();
  if (tuner == nullptr) {
    return absl::UnimplementedError(absl::StrCat(be.name(), " backend has no GEMM candidates"));
  }
  constexpr int kTunedSteps = 5;
  constexpr double kTuneMargin = 0.003;
  auto measure = [&]() -> absl::StatusOr<double> {
    FLUX_RETURN_IF_ERROR(reset());
    FLUX_ASSIGN_OR_RETURN(std::vector<double> times, be.time_each_ms(kTunedSteps + 1, step));
    times.erase(times.begin());
    return median_of(std::move(times));
  };
  FLUX_ASSIGN_OR_RETURN(const double before, measure());
  const std::vector<std::string> keys = tuner->keys();
  for (size_t k = 0; k < keys.size(); ++k) {
    FLUX_ASSIGN_OR_RETURN(const double current, measure());
    int best = 0;
    double best_ms = current;
    const int count = std::min<int>(static_cast<int>(o.tune_candidates), tuner->count(keys[k]));
    for (int i = 1; i < count; ++i) {
      FLUX_RETURN_IF_ERROR(tuner->choose(keys[k], i, 0.0, 0.0));
      FLUX_ASSIGN_OR_RETURN(const double ms, measure());
      if (ms < best_ms * (1.0 - kTuneMargin)) {
        best = i;
        best_ms = ms;
      }
    }
    FLUX_RETURN_IF_ERROR(tuner->choose(keys[k], best, best_ms, current));
    progress(absl::StrFormat("tuned %d/%d %s: candidate %d of %d, %.3f ms/step (first: %.3f)",
                             k + 1, keys.size(), keys[k], best, count, best_ms, current));
  }
  FLUX_ASSIGN_OR_RETURN(const double after, measure());
  return std::make_pair(before, after);
}

// A LoRA adapter of `rank` on every Linear of `config` with random values (alpha = rank).
std::shared_ptr<const LoraAdapter> random_lora_adapter(const Flux2Config& config, int64_t rank,
                                                       uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto adapter = std::make_shared<LoraAdapter>();
  for (const auto& [name, target] : flux2_lora_targets(config)) {
    LoraModule m{name, rank, target.in_features, target.out_features, {}, {}, double(rank), false};
    m.a.resize(static_cast<size_t>(rank * m.in_features));
    m.b.resize(static_cast<size_t>(m.out_features * rank));
    const float a_scale = 1.0f / std::sqrt(static_cast<float>(m.in_features));
    for (float& v : m.a) v = uniform(rng) * a_scale;
    for (float& v : m.b) v = uniform(rng) * 0.01f;
    adapter->modules.push_back(std::move(m));
  }
  return adapter;
}

// --lora-rank: the request's adapters on the device and their terms (null without).
absl::StatusOr<std::shared_ptr<const Flux2Lora>> bench_lora(Backend& be, const Flux2Config& config,
                                                            const BenchOptions& o,
                                                            LoraDeviceCache& uploads) {
  if (o.lora_rank <= 0) return nullptr;
  std::vector<LoraRequest> requests;
  for (int64_t i = 0; i < o.loras; ++i) {
    requests.push_back({absl::StrCat("random", i),
                        random_lora_adapter(config, o.lora_rank, 100 + static_cast<uint64_t>(i)),
                        i % 2 == 0 ? 0.8 : -0.5});
  }
  progress(absl::StrCat(o.loras, " random adapter(s) of rank ", o.lora_rank, " on every Linear"));
  FLUX_ASSIGN_OR_RETURN(std::vector<Flux2LoraUse> uses, uploads.acquire(be, config, requests));
  return std::make_shared<const Flux2Lora>(flux2_lora(config, uses));
}

absl::StatusOr<nlohmann::json> bench_step(Backend& be, const BenchOptions& o) {
  FLUX_ASSIGN_OR_RETURN(const Flux2Config preset, flux2_preset(o.model));
  if (o.height % 16 || o.width % 16 || o.height <= 0 || o.width <= 0) {
    return absl::InvalidArgumentError("--height/--width must be positive multiples of 16");
  }
  progress(absl::StrCat(
      "creating the ", o.model, " transformer from ",
      o.transformer_file.empty() ? "random " + o.weights + " weights" : o.transformer_file));
  FLUX_ASSIGN_OR_RETURN(BenchTransformer made,
                        make_bench_transformer(be, preset, o.transformer_file, o.fp8_weights()));
  const std::unique_ptr<Flux2Transformer>& model = made.model;
  const Flux2Config& config = model->config();  // a transformer folder's own
  int64_t fp8_bytes = 0, weight_bytes = model->load_report().device_bytes;
  LowPrecisionReport fp8;
  if (o.request.quality == Quality::kHigh) {
    FLUX_ASSIGN_OR_RETURN(const Fp8InputScale input_scale,
                          parse_fp8_input_scale(o.fp8_input_scale));
    FLUX_ASSIGN_OR_RETURN(fp8, model->enable_quality_high(input_scale));
    fp8_bytes = fp8.device_bytes;
  }
  if (made.stored_fp8 && o.fp8_lossless == "resident") {  // as the server's finish_load
    FLUX_ASSIGN_OR_RETURN(const DequantizedBytes moved, model->dequantize_stored_weights());
    weight_bytes += moved.values - moved.stored;
    if (o.request.quality == Quality::kHigh) fp8_bytes += moved.stored;
  }
  const std::vector<FastPathCounters> before = fast_path_snapshot();
  const RequestScope request(be, o.request);
  const int64_t h = o.height / 16, w = o.width / 16, n = h * w, l = o.text_len;
  const DType act = be.activation_dtype();
  FLUX_ASSIGN_OR_RETURN(Tensor prompt, be.empty(act, {l, config.joint_attention_dim}));
  FLUX_ASSIGN_OR_RETURN(Tensor x, be.empty(act, {n, config.in_channels}));
  FLUX_ASSIGN_OR_RETURN(Tensor v, be.empty(act, {n, config.out_channels}));
  FLUX_RETURN_IF_ERROR(be.fill_uniform(prompt, 11, 1.0f));
  FLUX_RETURN_IF_ERROR(be.fill_uniform(x, 12, 1.0f));
  const int64_t total = o.warmup + o.steps;
  const Schedule schedule = make_schedule(SchedulerConfig{}, total, n);
  std::vector<float> timesteps(schedule.timesteps.begin(), schedule.timesteps.end());
  for (float& t : timesteps) t /= 1000.0f;
  std::vector<float> guidance;
  if (config.guidance_embeds) guidance.assign(static_cast<size_t>(total), 4.0f);
  be.reset_peak_memory();
  LoraDeviceCache uploads;  // --lora-rank: this run's adapters
  FLUX_ASSIGN_OR_RETURN(std::shared_ptr<const Flux2Lora> lora, bench_lora(be, config, o, uploads));
  FLUX_ASSIGN_OR_RETURN(Flux2Conditioning cond,
                        model->prepare(prompt, flux2_text_ids(l), flux2_image_ids(h, w), timesteps,
                                       guidance, nullptr, lora));
  auto step = [&](int64_t i) -> absl::Status {
    FLUX_RETURN_IF_ERROR(model->forward(cond, i, x, v));
    return be.euler_step(x, v, schedule.dt(i));
  };
  // Warm-up, then the timed steps back to back as a request's denoising loop runs them (the host
  // enqueues ahead of the GPU), each between CUDA events.
  progress(absl::StrCat(o.width, "x", o.height, " at ", o.quality, ": ", o.warmup,
                        " warm-up steps, then ", o.steps, " timed steps back to back and ", o.steps,
                        " synchronised"));
  FLUX_RETURN_IF_ERROR(be.time_each_ms(o.warmup, step).status());
  std::optional<std::pair<double, double>> tuned;  // --tune-by steps: step medians before, after
  if (!o.tune_gemm.empty() && o.tune_by_steps) {
    FLUX_ASSIGN_OR_RETURN(
        tuned, tune_gemms_by_steps(be, o, step, [&] { return be.fill_uniform(x, 12, 1.0f); }));
    FLUX_RETURN_IF_ERROR(be.fill_uniform(x, 12, 1.0f));
  }
  GpuSampler sampler(be.device_pci_bus_id());  // the clock and power of the timed steps
  FLUX_ASSIGN_OR_RETURN(std::vector<double> times,
                        be.time_each_ms(o.steps, [&](int64_t i) { return step(o.warmup + i); }));
  const std::optional<GpuClockPower> clock_power = sampler.stop();
  // The same steps each timed alone, the host waiting for the GPU before and after (the GPU then
  // also waits for the first launches of every step): reported for comparison.
  std::vector<double> synced;
  for (int64_t i = 0; i < o.steps; ++i) {
    FLUX_ASSIGN_OR_RETURN(double ms, be.time_ms([&] { return step(o.warmup + i); }));
    synced.push_back(ms);
  }
  std::sort(synced.begin(), synced.end());
  std::optional<double> without_lora;  // --lora-rank: the same steps without the adapters
  if (lora != nullptr) {
    FLUX_ASSIGN_OR_RETURN(
        Flux2Conditioning plain,
        model->prepare(prompt, flux2_text_ids(l), flux2_image_ids(h, w), timesteps, guidance));
    FLUX_ASSIGN_OR_RETURN(std::vector<double> plain_times,
                          be.time_each_ms(o.steps, [&](int64_t i) -> absl::Status {
                            FLUX_RETURN_IF_ERROR(model->forward(plain, o.warmup + i, x, v));
                            return be.euler_step(x, v, schedule.dt(o.warmup + i));
                          }));
    without_lora = median_of(std::move(plain_times));
  }
  std::map<std::string, double> profile;
  if (o.profile != OpProfiling::kOff) {
    // A few more steps with events around every op: where the step's time goes.
    constexpr int kProfiledSteps = 3;
    be.set_op_profiling(o.profile);
    for (int i = 0; i < kProfiledSteps; ++i) {
      FLUX_RETURN_IF_ERROR(model->forward(cond, total - 1, x, v));
      FLUX_RETURN_IF_ERROR(be.euler_step(x, v, 0.0f));
    }
    be.set_op_profiling(OpProfiling::kOff);
    for (const auto& [category, ms] : be.take_op_profile()) profile[category] = ms / kProfiledSteps;
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const StepFlops flops = flux2_step_flops(config, n, l);
  const double floor = flux2_floor_ms(config, n, l);
  const BackendMemoryStats memory = be.memory_stats();
  FLUX_ASSIGN_OR_RETURN(const nlohmann::json plans, gemm_plans(be, o));
  nlohmann::json result = {{"model", o.model},
                           {"quality", o.quality},
                           {"gemm_plans", plans},
                           {"height", o.height},
                           {"width", o.width},
                           {"text_len", l},
                           {"backend", std::string(be.name())},
                           {"fast_paths", o.request.fast_paths},
                           {"fast_path_fallbacks", fallbacks_since(before)},
                           {"steps_timed", o.steps},
                           {"ms_per_step_median", median},
                           {"ms_per_step_min", times.front()},
                           {"ms_per_step_max", times.back()},
                           {"ms_per_step_synced_median", synced[synced.size() / 2]},
                           {"tflops", (flops.linear + flops.attention) / (median * 1e9)},
                           {"linear_tflop", flops.linear / 1e12},
                           {"attention_tflop", flops.attention / 1e12},
                           {"floor_ms", floor},
                           {"floor_fraction", floor / median},
                           {"peak_device_bytes", memory.peak_bytes},
                           {"weight_bytes", weight_bytes},
                           {"fp8_weight_bytes", fp8_bytes},
                           {"weights", made.source},
                           {"fp8_lossless", made.stored_fp8 ? o.fp8_lossless : ""},
                           {"fp8_input_scale", made.stored_fp8 ? o.fp8_input_scale : ""},
                           {"fp8_gemms", fp8.gemms},
                           {"fp8_static_scale_gemms", fp8.static_scaled}};
  add_clock_power(clock_power, result);
  if (!o.transformer_file.empty()) {
    result["transformer_file_load_seconds"] = made.load_seconds;
    result["transformer_file_bytes"] = made.file_bytes;
    result["transformer_file_load_gb_per_s"] = made.file_bytes / 1e9 / made.load_seconds;
  }
  if (without_lora) {
    result["lora_rank"] = o.lora_rank;
    result["loras"] = o.loras;
    int64_t values = 0;  // per adapter
    for (const auto& [name, t] : flux2_lora_targets(config)) {
      values += o.lora_rank * (t.in_features + t.out_features);
    }
    result["lora_device_bytes"] = o.loras * values * dtype_size(be.weight_dtype());
    result["ms_per_step_without_lora_median"] = *without_lora;
    result["lora_step_ratio"] = median / *without_lora;
  }
  if (tuned) {
    result["tune_ms_per_step_before"] = tuned->first;
    result["tune_ms_per_step_after"] = tuned->second;
  }
  if (o.profile != OpProfiling::kOff) {
    double sum = 0.0;
    for (const auto& [category, ms] : profile) sum += ms;
    result["profile_ms"] = profile;
    result["profile_gaps_ms"] = median - sum;  // launch gaps and host overhead between ops
    result["gemm_floor_ms"] = flops.linear / 870e9;
    result["attention_floor_ms"] = flops.attention / 655e9;
  }
  return result;
}

// The whole request (tokenize, text encode, denoise, decode, PNG encode) with random weights at
// the model's shapes, 1024x1024 by default: the median of `repeats` runs after one warm-up.
// How a request caches steps, for the report: "W4 MC3 R0.24", the schedule's flags, or "off".
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
  Tensor ballast;  // --device-memory-cap-gb: what a smaller device would not have
  if (o.device_memory_cap_gb > 0.0) {
    const int64_t cap = static_cast<int64_t>(o.device_memory_cap_gb * 1e9);
    const int64_t held = be.memory_stats().total_bytes - cap;
    if (held > 0) {
      FLUX_ASSIGN_OR_RETURN(ballast, be.empty(DType::kU8, {held}));
    }
  }
  spec.on_progress = [](const LoadProgress& step) { progress(describe(step)); };
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline, Pipeline::create_random(be, spec));
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
  for (int64_t k = 0; k < o.references; ++k) {  // noise-like pixels: the encoder's cost is the same
    RgbImage reference{o.width, o.height,
                       std::vector<uint8_t>(static_cast<size_t>(o.width * o.height * 3))};
    uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(k + 1);
    for (uint8_t& value : reference.pixels) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      value = static_cast<uint8_t>(state >> 56);
    }
    params.references.push_back(std::move(reference));
  }
  const int64_t free_after_load = be.free_device_bytes();
  std::vector<double> e2e, tokenize, text_encode, noise, reference_encode, denoise, decode, encode,
      steps, first_steps, later_steps;
  StepCacheCounts cache_counts;  // the last request's (a schedule repeats; DBCache's may vary)
  be.reset_peak_memory();
  const std::vector<FastPathCounters> before = fast_path_snapshot();
  std::optional<GpuSampler> sampler;          // the clock and power of the timed requests
  for (int run = -1; run < repeats; ++run) {  // run -1 warms up
    if (run == 0) sampler.emplace(be.device_pci_bus_id());
    const auto start = std::chrono::steady_clock::now();
    FLUX_ASSIGN_OR_RETURN(GeneratedImage image, pipeline->generate(params));
    const auto encode_start = std::chrono::steady_clock::now();
    FLUX_ASSIGN_OR_RETURN(std::vector<uint8_t> png,
                          encode_png(image.rgb, image.width, image.height));
    const auto end = std::chrono::steady_clock::now();
    const double request_ms = std::chrono::duration<double, std::milli>(end - start).count();
    progress(run < 0 ? absl::StrFormat("warm-up request: %.1f ms", request_ms)
                     : absl::StrFormat("request %d/%d: %.1f ms", run + 1, repeats, request_ms));
    if (run < 0) continue;
    e2e.push_back(request_ms);
    encode.push_back(std::chrono::duration<double, std::milli>(end - encode_start).count());
    tokenize.push_back(1e3 * image.timings.tokenize);
    text_encode.push_back(1e3 * image.timings.text_encode);
    noise.push_back(1e3 * image.timings.noise);
    reference_encode.push_back(1e3 * image.timings.reference_encode);
    for (size_t i = 0; i < image.timings.steps.size(); ++i) {
      (i == 0 ? first_steps : later_steps).push_back(1e3 * image.timings.steps[i]);
    }
    denoise.push_back(1e3 * image.timings.denoise);
    decode.push_back(1e3 * image.timings.decode);
    for (double s : image.timings.steps) steps.push_back(1e3 * s);
    cache_counts = StepCacheCounts{};
    cache_counts.add(image.cache);
  }
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
  FLUX_ASSIGN_OR_RETURN(const nlohmann::json plans, gemm_plans(be, o));
  const double step_median = median_of(steps);
  const int64_t n = (o.height / 16) * (o.width / 16);
  const StepFlops flops = flux2_step_flops(spec.transformer, n, o.text_len);
  const double floor = flux2_floor_ms(spec.transformer, n, o.text_len);
  nlohmann::json result{{"model", o.model},
                        {"quality", o.quality},
                        {"height", o.height},
                        {"width", o.width},
                        {"text_len", o.text_len},
                        {"backend", std::string(be.name())},
                        {"fast_paths", o.request.fast_paths},
                        {"fast_path_fallbacks", fallbacks},
                        {"gemm_plans", plans},
                        {"e2e", true},
                        {"weights", o.weights},
                        {"fp8_lossless", o.fp8_weights() ? o.fp8_lossless : ""},
                        {"fp8_input_scale", o.fp8_weights() ? o.fp8_input_scale : ""},
                        {"fp8_gemms", pipeline->info().fp8_gemms},
                        {"fp8_static_scale_gemms", pipeline->info().fp8_static_scale_gemms},
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
                        {"ms_reference_encode", median_of(reference_encode)},
                        {"ms_first_step_median", median_of(first_steps)},
                        {"ms_later_steps_median", median_of(later_steps)},
                        {"repeats", repeats},
                        {"ms_e2e_median", median_of(e2e)},
                        {"ms_tokenize", median_of(tokenize)},
                        {"ms_text_encode", median_of(text_encode)},
                        {"ms_noise", median_of(noise)},
                        {"ms_denoise", median_of(denoise)},
                        {"ms_decode", median_of(decode)},
                        {"ms_encode", median_of(encode)},
                        {"ms_per_step_median", step_median},
                        {"tflops", (flops.linear + flops.attention) / (step_median * 1e9)},
                        {"floor_ms", floor},
                        {"floor_fraction", floor / step_median},
                        {"peak_device_bytes", memory.peak_bytes},
                        {"weight_bytes", pipeline->info().device_bytes},
                        {"text_encoder_offload", o.text_encoder_offload},
                        {"text_encoder_host_bytes", pipeline->info().text_encoder_host_bytes},
                        {"prompt_cache", o.prompt_cache},
                        {"device_memory_cap_gb", o.device_memory_cap_gb},
                        {"free_device_bytes_after_load", free_after_load},
                        {"load_seconds", pipeline->info().load_seconds},
                        {"profile_ms", profile}};
  add_clock_power(clock_power, result);
  return result;
}

// `flux2 bench`'s flags: the benchmark's options and what picks the benchmark and its backend,
// bound by add_bench_flags (the values are the defaults).
struct BenchFlags {
  BenchOptions o;
  std::string backend = "cuda";
  std::string tokenizer;  // --e2e; empty: the tiny checkpoint's of the model's family
  std::string tune_by = "steps";
  int64_t repeats = 5;
  int64_t lora_load_mb = 0;  // --lora-load-mb N: lora_load_bench.h instead of steps
  bool e2e = false, attention_only = false, no_fast_paths = false;
  bool profile = false, profile_by_shape = false;
  BackendOptions backend_options;
};

void add_bench_flags(CLI::App& app, BenchFlags& f) {
  BenchOptions& o = f.o;
  app.add_option("--model", o.model);
  app.add_option("--height", o.height);
  app.add_option("--width", o.width);
  app.add_option("--text-len", o.text_len);
  app.add_option("--quality", o.quality);
  app.add_option("--steps", o.steps);
  app.add_option("--warmup", o.warmup);
  app.add_flag("--json", o.json);
  app.add_option("--backend", f.backend);
  app.add_flag("--no-fast-paths", f.no_fast_paths);
  app.add_flag("--e2e", f.e2e);
  app.add_flag("--profile", f.profile);
  app.add_option("--tokenizer", f.tokenizer);
  app.add_option("--repeats", f.repeats);
  app.add_flag("--attention-only", f.attention_only);
  app.add_flag("--profile-by-shape", f.profile_by_shape);
  app.add_option("--references", o.references);
  app.add_flag("--kv", o.kv_cache);
  app.add_flag("--text-encoder-offload", o.text_encoder_offload);
  app.add_flag("--prompt-cache", o.prompt_cache);
  app.add_flag("--base", o.base);
  app.add_option("--cache", o.cache);
  app.add_option("--cache-warmup", o.step_cache.warmup_steps);
  app.add_option("--cache-mc", o.step_cache.max_consecutive_cached);
  app.add_option("--cache-threshold", o.step_cache.threshold);
  app.add_option("--cache-schedule", o.cache_schedule);
  app.add_option("--device-memory-cap-gb", o.device_memory_cap_gb);
  app.add_option("--tune-gemm", o.tune_gemm);
  app.add_option("--tune-by", f.tune_by);
  app.add_option("--tune-candidates", o.tune_candidates);
  app.add_option("--lora-rank", o.lora_rank);
  app.add_option("--loras", o.loras);
  app.add_option("--lora-load-mb", f.lora_load_mb);
  app.add_option("--weights", o.weights);
  app.add_option("--fp8-lossless", o.fp8_lossless);
  app.add_option("--fp8-input-scale", o.fp8_input_scale);
  app.add_option("--transformer-file", o.transformer_file);
  add_backend_flags(app, f.backend_options);
}

// --weights and the FP8 checkpoint flags that need --weights fp8 (--fp8-lossless,
// --fp8-input-scale; static only at --quality high).
absl::Status check_weights_flags(const CLI::App& app, const BenchOptions& o) {
  if (o.weights != "bf16" && o.weights != "fp8") {
    return absl::InvalidArgumentError(
        absl::StrCat("--weights ", o.weights, ": expected bf16 or fp8"));
  }
  if (!o.transformer_file.empty() && app.count("--weights")) {
    return absl::InvalidArgumentError(
        "--weights picks random weights' form; --transformer-file's weights are the file's");
  }
  FLUX_RETURN_IF_ERROR(parse_fp8_lossless(o.fp8_lossless).status());
  if (app.count("--fp8-lossless") && !o.fp8_flags_apply()) {
    return absl::InvalidArgumentError(
        "--fp8-lossless says how FP8 checkpoint weights serve lossless: add --weights fp8");
  }
  FLUX_ASSIGN_OR_RETURN(const Fp8InputScale input_scale, parse_fp8_input_scale(o.fp8_input_scale));
  if (app.count("--fp8-input-scale") && !o.fp8_flags_apply()) {
    return absl::InvalidArgumentError(
        "--fp8-input-scale says how quality=high scales FP8 checkpoint weights' activations: add "
        "--weights fp8");
  }
  if (input_scale == Fp8InputScale::kStatic && o.quality != "high") {
    return absl::InvalidArgumentError(
        "--fp8-input-scale static sets quality=high's activation scales: add --quality high");
  }
  return absl::OkStatus();
}

// Checks the flags against each other and fills in what they imply (the request's options, the
// profiling, --tune-gemm's backend options, the tokenizer).
absl::Status check_bench_flags(const CLI::App& app, BenchFlags& f) {
  BenchOptions& o = f.o;
  o.request.fast_paths = !f.no_fast_paths;
  o.profile = f.profile_by_shape ? OpProfiling::kByShape
              : f.profile        ? OpProfiling::kByCategory
                                 : OpProfiling::kOff;
  if (app.count("--device-memory-cap-gb")) {
    if (!(o.device_memory_cap_gb > 0.0)) {
      return absl::InvalidArgumentError("--device-memory-cap-gb: expected a positive number of GB");
    }
    if (!f.e2e) {
      return absl::InvalidArgumentError("--device-memory-cap-gb caps whole requests: add --e2e");
    }
  }
  if ((o.references != 0 || o.kv_cache || o.text_encoder_offload || o.prompt_cache) && !f.e2e) {
    return absl::InvalidArgumentError(
        "--references, --kv, --text-encoder-offload and --prompt-cache time whole requests: add "
        "--e2e");
  }
  if ((o.base || o.cache != "off") && !f.e2e) {
    return absl::InvalidArgumentError("--base and --cache time whole requests: add --e2e");
  }
  FLUX_RETURN_IF_ERROR(check_weights_flags(app, o));
  if (!o.transformer_file.empty() && (f.e2e || f.attention_only || f.lora_load_mb > 0)) {
    return absl::InvalidArgumentError(
        "--transformer-file times steps: drop --e2e, "
        "--attention-only and --lora-load-mb");
  }
  if (o.base && o.model == "dev") {
    return absl::InvalidArgumentError("--base runs klein as its base model; dev has no base");
  }
  if (o.cache != "off" && o.cache != "dbcache" && o.cache != "schedule") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cache ", o.cache, ": expected off, dbcache or schedule"));
  }
  o.step_cache.mode = o.cache == "dbcache"    ? StepCacheOptions::Mode::kDbCache
                      : o.cache == "schedule" ? StepCacheOptions::Mode::kSchedule
                                              : StepCacheOptions::Mode::kOff;
  if (o.references < 0 || o.references > 8) {
    return absl::InvalidArgumentError("--references: expected 0..8");
  }
  if (o.steps < 10) {
    return absl::InvalidArgumentError("--steps: time at least 10 steps (a median needs them)");
  }
  if (o.quality != "lossless" && o.quality != "high") {
    return absl::InvalidArgumentError(
        absl::StrCat("--quality ", o.quality, ": expected lossless or high"));
  }
  o.request.quality = o.quality == "high" ? Quality::kHigh : Quality::kLossless;
  if (f.tune_by != "steps" && f.tune_by != "calls") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tune-by ", f.tune_by, ": expected steps or calls"));
  }
  if (o.tune_candidates < 2) {
    return absl::InvalidArgumentError("--tune-candidates: expected at least 2");
  }
  o.tune_by_steps = f.tune_by == "steps";
  if (!o.tune_gemm.empty()) {
    if (app.count("--gemm-algorithms") || app.count("--gemm-autotune")) {
      return absl::InvalidArgumentError(
          "--tune-gemm starts from the heuristic's candidates: drop --gemm-algorithms and "
          "--gemm-autotune");
    }
    if (o.tune_by_steps && f.e2e) {
      return absl::InvalidArgumentError(
          "--tune-by steps tunes the transformer's steps: drop --e2e (or --tune-by calls)");
    }
    f.backend_options.gemm_autotune = !o.tune_by_steps;
    f.backend_options.gemm_algorithms = "heuristic";
  }
  if (f.repeats < 1) return absl::InvalidArgumentError("--repeats must be a positive integer");
  if (f.tokenizer.empty()) {
    f.tokenizer =
        std::string(o.model == "dev" ? FLUX2_TINY_DEV_CHECKPOINT_DIR : FLUX2_TINY_CHECKPOINT_DIR) +
        "/tokenizer";
  }
  return absl::OkStatus();
}

}  // namespace

int run_bench(int argc, char** argv, int first) {
  CommandLine app("flux2 bench");
  BenchFlags flags;
  add_bench_flags(app, flags);
  absl::Status parsed = app.parse_flags(argc, argv, first);
  if (parsed.ok()) parsed = check_bench_flags(app, flags);
  if (!parsed.ok()) return fail(parsed.message());
  const BenchOptions& o = flags.o;
  auto backend = create_backend(flags.backend, flags.backend_options);
  if (!backend.ok()) return fail(backend.status().message());
  if (flags.lora_load_mb > 0) {
    auto config = flux2_preset(o.model);
    if (!config.ok()) return fail(config.status().message());
    auto loads = bench_lora_load(**backend, *config, flags.lora_load_mb);
    if (!loads.ok()) return fail(loads.status().message());
    std::printf("%s\n", loads->dump().c_str());
    return 0;
  }
  auto result =
      flags.attention_only ? bench_attention(**backend, {o.model, o.quality, o.height, o.width,
                                                         o.text_len, o.warmup, o.steps, o.request})
      : flags.e2e ? bench_e2e(**backend, o, flags.tokenizer, static_cast<int>(flags.repeats))
                  : bench_step(**backend, o);
  if (!result.ok()) return fail(result.status().message());
  if (o.json || flags.attention_only) {
    std::printf("%s\n", result->dump().c_str());
  } else if (result->contains("e2e")) {
    const nlohmann::json& r = *result;
    std::printf(
        "%s e2e %lldx%lld, %d steps, %lld references%s: %.1f ms (tokenize %.2f, text encode "
        "%.1f, reference encode %.1f, denoise %.1f, decode %.1f, encode %.1f), %.2f ms/step "
        "(first %.2f, later %.2f), peak %.2f GB%s%s\n",
        o.model.c_str(), static_cast<long long>(o.width), static_cast<long long>(o.height),
        r["request_steps"].get<int>(), static_cast<long long>(o.references),
        o.kv_cache ? " (klein-KV)" : "", r["ms_e2e_median"].get<double>(),
        r["ms_tokenize"].get<double>(), r["ms_text_encode"].get<double>(),
        r["ms_reference_encode"].get<double>(), r["ms_denoise"].get<double>(),
        r["ms_decode"].get<double>(), r["ms_encode"].get<double>(),
        r["ms_per_step_median"].get<double>(), r["ms_first_step_median"].get<double>(),
        r["ms_later_steps_median"].get<double>(), r["peak_device_bytes"].get<int64_t>() / 1e9,
        o.text_encoder_offload ? " (text encoder streamed from host memory)" : "",
        clock_power_text(r).c_str());
  } else {
    const nlohmann::json& r = *result;
    std::printf(
        "%s %s %lldx%lld text %lld: %.2f ms/step median (min %.2f, max %.2f), %.0f TFLOP/s, floor "
        "%.1f ms "
        "(fraction %.3f), peak %.2f GB%s\n",
        o.model.c_str(), o.quality.c_str(), static_cast<long long>(o.width),
        static_cast<long long>(o.height), static_cast<long long>(o.text_len),
        r["ms_per_step_median"].get<double>(), r["ms_per_step_min"].get<double>(),
        r["ms_per_step_max"].get<double>(), r["tflops"].get<double>(), r["floor_ms"].get<double>(),
        r["floor_fraction"].get<double>(), r["peak_device_bytes"].get<int64_t>() / 1e9,
        clock_power_text(r).c_str());
  }
  return 0;
}

}  // namespace flux2
