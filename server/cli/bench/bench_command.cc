// `flux2 bench`: per-step latency of the FLUX.2 transformer at real shapes with random weights
// (model/README.md "Work per step and the floor"): warm-up, then the median of >= 10 timed steps
// (device events), TFLOP/s, the fraction of the floor and peak device memory; `--json` prints one
// JSON object per line; --lora-rank R (--loras N): with random adapters, beside the step without;
// --e2e times whole requests (bench_e2e.h). Run on the GPU machine by tests/gpu/run_on_device.sh;
// the flux2_bench_* tests of tests/server/CMakeLists.txt run it on the CPU.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend_factory.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/base/status.h"
#include "model/flux2_presets.h"
#include "model/flux2_transformer.h"
#include "model/lora_device_cache.h"
#include "model/pipeline.h"
#include "model/rope.h"
#include "model/scheduler.h"
#include "nlohmann/json.hpp"
#include "server/cli/bench/bench_attention.h"
#include "server/cli/bench/bench_e2e.h"
#include "server/cli/bench/bench_options.h"
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
    bench_progress(absl::StrFormat("tuned %d/%d %s: candidate %d of %d, %.3f ms/step (first: %.3f)",
                                   k + 1, keys.size(), keys[k], best, count, best_ms, current));
  }
  FLUX_ASSIGN_OR_RETURN(const double after, measure());
  return std::make_pair(before, after);
}

// --lora-rank: the request's adapters on the device and their terms (null without).
absl::StatusOr<std::shared_ptr<const Flux2Lora>> bench_lora(Backend& be, const Flux2Config& config,
                                                            const BenchOptions& o,
                                                            LoraDeviceCache& uploads) {
  if (o.lora_rank <= 0) return nullptr;
  const std::vector<LoraRequest> requests = random_lora_requests(config, o);
  FLUX_ASSIGN_OR_RETURN(std::vector<Flux2LoraUse> uses, uploads.acquire(be, config, requests));
  return std::make_shared<const Flux2Lora>(flux2_lora(config, uses));
}

// The transformer a step bench times, made as --transformer-file / --weights / --quality say.
struct StepModel {
  BenchTransformer made;
  int64_t weight_bytes = 0, fp8_bytes = 0;
  LowPrecisionReport fp8;
};

absl::StatusOr<StepModel> make_step_model(Backend& be, const BenchOptions& o) {
  FLUX_ASSIGN_OR_RETURN(const Flux2Config preset, flux2_preset(o.model));
  if (o.height % 16 || o.width % 16 || o.height <= 0 || o.width <= 0) {
    return absl::InvalidArgumentError("--height/--width must be positive multiples of 16");
  }
  bench_progress(absl::StrCat(
      "creating the ", o.model, " transformer from ",
      o.transformer_file.empty() ? "random " + o.weights + " weights" : o.transformer_file));
  StepModel m;
  FLUX_ASSIGN_OR_RETURN(m.made,
                        make_bench_transformer(be, preset, o.transformer_file, o.fp8_weights()));
  Flux2Transformer& model = *m.made.model;
  m.weight_bytes = model.load_report().device_bytes;
  if (o.request.quality == Quality::kHigh) {
    FLUX_ASSIGN_OR_RETURN(const Fp8InputScale input_scale,
                          parse_fp8_input_scale(o.fp8_input_scale));
    FLUX_ASSIGN_OR_RETURN(m.fp8, model.enable_quality_high(input_scale));
    m.fp8_bytes = m.fp8.device_bytes;
  }
  if (m.made.stored_fp8 && o.fp8_lossless == "resident") {  // as the server's finish_load
    FLUX_ASSIGN_OR_RETURN(const DequantizedBytes moved, model.dequantize_stored_weights());
    m.weight_bytes += moved.values - moved.stored;
    if (o.request.quality == Quality::kHigh) m.fp8_bytes += moved.stored;
  }
  return m;
}

// A request's denoising inputs at the bench's shape: random prompt embeddings and latents, the
// schedule of warm-up + timed steps, and the transformer's conditioning for them.
struct StepInputs {
  int64_t h = 0, w = 0, text_len = 0;
  Tensor prompt, x, v;
  Schedule schedule;
  std::vector<float> timesteps, guidance;

  // The conditioning with `lora`'s adapters (none: null).
  absl::StatusOr<Flux2Conditioning> prepare(Flux2Transformer& model,
                                            std::shared_ptr<const Flux2Lora> lora) const {
    return model.prepare(prompt, flux2_text_ids(text_len), flux2_image_ids(h, w), timesteps,
                         guidance, nullptr, std::move(lora));
  }
};

absl::StatusOr<StepInputs> make_step_inputs(Backend& be, const BenchOptions& o,
                                            const Flux2Config& config) {
  StepInputs in;
  in.h = o.height / 16;
  in.w = o.width / 16;
  in.text_len = o.text_len;
  const int64_t n = in.h * in.w;
  const DType act = be.activation_dtype();
  FLUX_ASSIGN_OR_RETURN(in.prompt, be.empty(act, {in.text_len, config.joint_attention_dim}));
  FLUX_ASSIGN_OR_RETURN(in.x, be.empty(act, {n, config.in_channels}));
  FLUX_ASSIGN_OR_RETURN(in.v, be.empty(act, {n, config.out_channels}));
  FLUX_RETURN_IF_ERROR(be.fill_uniform(in.prompt, 11, 1.0f));
  FLUX_RETURN_IF_ERROR(be.fill_uniform(in.x, 12, 1.0f));
  const int64_t total = o.warmup + o.steps;
  in.schedule = make_schedule(SchedulerConfig{}, total, n);
  in.timesteps.assign(in.schedule.timesteps.begin(), in.schedule.timesteps.end());
  for (float& t : in.timesteps) t /= 1000.0f;
  if (config.guidance_embeds) in.guidance.assign(static_cast<size_t>(total), 4.0f);
  return in;
}

// The timed steps' median and clock; a section of the step bench.
struct TimedSteps {
  std::vector<double> sorted_ms;
  std::optional<GpuClockPower> clock_power;
  double median() const { return sorted_ms[sorted_ms.size() / 2]; }
};

// `o.steps` steps back to back as a request's denoising loop runs them (the host enqueues ahead
// of the GPU), each between CUDA events, with the GPU's clock and power sampled meanwhile.
absl::StatusOr<TimedSteps> time_steps(Backend& be, const BenchOptions& o,
                                      const std::function<absl::Status(int64_t)>& step) {
  TimedSteps timed;
  GpuSampler sampler(be.device_pci_bus_id());
  FLUX_ASSIGN_OR_RETURN(timed.sorted_ms,
                        be.time_each_ms(o.steps, [&](int64_t i) { return step(o.warmup + i); }));
  timed.clock_power = sampler.stop();
  std::sort(timed.sorted_ms.begin(), timed.sorted_ms.end());
  return timed;
}

// The same steps each timed alone, the host waiting for the GPU before and after (the GPU then
// also waits for the first launches of every step): reported for comparison.
absl::StatusOr<double> synced_step_median(Backend& be, const BenchOptions& o,
                                          const std::function<absl::Status(int64_t)>& step) {
  std::vector<double> synced;
  for (int64_t i = 0; i < o.steps; ++i) {
    FLUX_ASSIGN_OR_RETURN(double ms, be.time_ms([&] { return step(o.warmup + i); }));
    synced.push_back(ms);
  }
  return median_of(std::move(synced));
}

// --profile: a few more steps with events around every op: where the step's time goes (ms per
// step by category or shape). `step(i, dt)`: step i with an Euler step of dt (0: x unchanged).
absl::StatusOr<std::map<std::string, double>> profile_steps(
    Backend& be, const BenchOptions& o, const std::function<absl::Status(int64_t, float)>& step) {
  constexpr int kProfiledSteps = 3;
  be.set_op_profiling(o.profile);
  for (int i = 0; i < kProfiledSteps; ++i) {
    FLUX_RETURN_IF_ERROR(step(o.warmup + o.steps - 1, 0.0f));
  }
  be.set_op_profiling(OpProfiling::kOff);
  std::map<std::string, double> profile;
  for (const auto& [category, ms] : be.take_op_profile()) profile[category] = ms / kProfiledSteps;
  return profile;
}

// The step bench's result: what ran, its times and the floor, memory and weights.
nlohmann::json step_result(Backend& be, const BenchOptions& o, const StepModel& m,
                           const TimedSteps& timed, double synced_median,
                           const nlohmann::json& fallbacks) {
  const Flux2Config& config = m.made.model->config();
  const int64_t n = (o.height / 16) * (o.width / 16), l = o.text_len;
  const double median = timed.median();
  const StepFlops flops = flux2_step_flops(config, n, l);
  const double floor = flux2_floor_ms(config, n, l);
  nlohmann::json result = {{"model", o.model},
                           {"quality", o.quality},
                           {"height", o.height},
                           {"width", o.width},
                           {"text_len", l},
                           {"backend", std::string(be.name())},
                           {"fast_paths", o.request.fast_paths},
                           {"fast_path_fallbacks", fallbacks},
                           {"steps_timed", o.steps},
                           {"ms_per_step_median", median},
                           {"ms_per_step_min", timed.sorted_ms.front()},
                           {"ms_per_step_max", timed.sorted_ms.back()},
                           {"ms_per_step_synced_median", synced_median},
                           {"tflops", (flops.linear + flops.attention) / (median * 1e9)},
                           {"linear_tflop", flops.linear / 1e12},
                           {"attention_tflop", flops.attention / 1e12},
                           {"floor_ms", floor},
                           {"floor_fraction", floor / median},
                           {"peak_device_bytes", be.memory_stats().peak_bytes},
                           {"weight_bytes", m.weight_bytes},
                           {"fp8_weight_bytes", m.fp8_bytes},
                           {"weights", m.made.source},
                           {"fp8_lossless", m.made.stored_fp8 ? o.fp8_lossless : ""},
                           {"fp8_input_scale", m.made.stored_fp8 ? o.fp8_input_scale : ""},
                           {"fp8_gemms", m.fp8.gemms},
                           {"fp8_static_scale_gemms", m.fp8.static_scaled}};
  add_clock_power(timed.clock_power, result);
  if (!o.transformer_file.empty()) {
    result["transformer_file_load_seconds"] = m.made.load_seconds;
    result["transformer_file_bytes"] = m.made.file_bytes;
    result["transformer_file_load_gb_per_s"] = m.made.file_bytes / 1e9 / m.made.load_seconds;
  }
  return result;
}

// --profile's fields: the profile, the gaps between ops and the GEMM and attention floors.
void add_profile(const std::map<std::string, double>& profile, const Flux2Config& config,
                 const BenchOptions& o, double median, nlohmann::json& result) {
  const StepFlops flops = flux2_step_flops(config, (o.height / 16) * (o.width / 16), o.text_len);
  double sum = 0.0;
  for (const auto& [category, ms] : profile) sum += ms;
  result["profile_ms"] = profile;
  result["profile_gaps_ms"] = median - sum;  // launch gaps and host overhead between ops
  result["gemm_floor_ms"] = flops.linear / 870e9;
  result["attention_floor_ms"] = flops.attention / 655e9;
}

absl::StatusOr<nlohmann::json> bench_step(Backend& be, const BenchOptions& o) {
  FLUX_ASSIGN_OR_RETURN(StepModel m, make_step_model(be, o));
  Flux2Transformer& model = *m.made.model;
  const Flux2Config& config = model.config();  // a transformer folder's own
  const std::vector<FastPathCounters> before = fast_path_snapshot();
  const RequestScope request(be, o.request);
  FLUX_ASSIGN_OR_RETURN(StepInputs in, make_step_inputs(be, o, config));
  be.reset_peak_memory();
  LoraDeviceCache uploads;  // --lora-rank: this run's adapters
  FLUX_ASSIGN_OR_RETURN(std::shared_ptr<const Flux2Lora> lora, bench_lora(be, config, o, uploads));
  FLUX_ASSIGN_OR_RETURN(const Flux2Conditioning cond, in.prepare(model, lora));
  // Step i under conditioning `c` (cond, or plain without the adapters), with an Euler step of dt.
  auto step_dt = [&](const Flux2Conditioning& c, int64_t i, float dt) -> absl::Status {
    FLUX_RETURN_IF_ERROR(model.forward(c, i, in.x, in.v));
    return be.euler_step(in.x, in.v, dt);
  };
  const std::function<absl::Status(int64_t)> step = [&](int64_t i) {
    return step_dt(cond, i, in.schedule.dt(i));
  };
  bench_progress(absl::StrCat(o.width, "x", o.height, " at ", o.quality, ": ", o.warmup,
                              " warm-up steps, then ", o.steps, " timed steps back to back and ",
                              o.steps, " synchronised"));
  FLUX_RETURN_IF_ERROR(be.time_each_ms(o.warmup, step).status());
  std::optional<std::pair<double, double>> tuned;  // --tune-by steps: step medians before, after
  if (!o.tune_gemm.empty() && o.tune_by_steps) {
    auto reset = [&] { return be.fill_uniform(in.x, 12, 1.0f); };
    FLUX_ASSIGN_OR_RETURN(tuned, tune_gemms_by_steps(be, o, step, reset));
    FLUX_RETURN_IF_ERROR(reset());
  }
  FLUX_ASSIGN_OR_RETURN(const TimedSteps timed, time_steps(be, o, step));
  FLUX_ASSIGN_OR_RETURN(const double synced, synced_step_median(be, o, step));
  std::optional<TimedSteps> without;  // --lora-rank: the same steps without the adapters
  if (lora != nullptr) {
    FLUX_ASSIGN_OR_RETURN(const Flux2Conditioning plain, in.prepare(model, nullptr));
    FLUX_ASSIGN_OR_RETURN(without, time_steps(be, o, [&](int64_t i) {
                            return step_dt(plain, i, in.schedule.dt(i));
                          }));
  }
  std::map<std::string, double> profile;
  if (o.profile != OpProfiling::kOff) {
    FLUX_ASSIGN_OR_RETURN(
        profile, profile_steps(be, o, [&](int64_t i, float dt) { return step_dt(cond, i, dt); }));
  }
  // Fallbacks and the peak over every step run.
  nlohmann::json result = step_result(be, o, m, timed, synced, fallbacks_since(before));
  if (without) {
    result.update(lora_result(config, o, dtype_size(be.weight_dtype())));
    result["ms_per_step_without_lora_median"] = without->median();
    result["lora_step_ratio"] = timed.median() / without->median();
    add_clock_power(without->clock_power, result, "without_lora_");
  }
  if (tuned) {
    result["tune_ms_per_step_before"] = tuned->first;
    result["tune_ms_per_step_after"] = tuned->second;
  }
  if (o.profile != OpProfiling::kOff) add_profile(profile, config, o, timed.median(), result);
  FLUX_ASSIGN_OR_RETURN(result["gemm_plans"], gemm_plans(be, o));
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

// --lora-rank R >= 1 with --loras N in 1..16 (steps or --e2e); --loras alone means nothing.
absl::Status check_lora_flags(const CLI::App& app, const BenchFlags& f) {
  const BenchOptions& o = f.o;
  if (app.count("--lora-rank") == 0) {
    if (app.count("--loras")) return absl::InvalidArgumentError("--loras: add --lora-rank R");
    return absl::OkStatus();
  }
  if (o.lora_rank < 1 || o.lora_rank > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lora-rank: ", o.lora_rank, " is outside 1..4096"));
  }
  if (o.loras < 1 || o.loras > 16) {
    return absl::InvalidArgumentError(absl::StrCat("--loras: ", o.loras, " is outside 1..16"));
  }
  if (f.attention_only || f.lora_load_mb > 0) {
    return absl::InvalidArgumentError(
        "--lora-rank times steps or whole requests with adapters: drop --attention-only and "
        "--lora-load-mb");
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
  FLUX_RETURN_IF_ERROR(check_lora_flags(app, f));
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
