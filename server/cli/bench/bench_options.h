// What `flux2 bench` measures and how (BenchOptions, set from its flags by bench_command.cc), and
// what its step and end-to-end benchmarks share: progress lines, fast-path fallbacks, the GEMM
// plans, random LoRA adapters. Run on the GPU machine by tests/gpu/run_on_device.sh; the CPU runs
// of tests/server/CMakeLists.txt (flux2_bench_*) cover the host side.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/base/fast_path_registry.h"
#include "model/flux2_config.h"
#include "model/lora_device_cache.h"
#include "model/step_cache.h"
#include "nlohmann/json.hpp"

namespace flux2 {

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

// Progress on stderr (stdout keeps the results, one JSON object per line with --json).
void bench_progress(absl::string_view message);

// Fallbacks counted since `before` (fast_path_snapshot), by path and reason: a healthy run at the
// real shapes has none.
nlohmann::json fallbacks_since(const std::vector<FastPathCounters>& before);

// What the result JSON says about the GEMM plans (and writes --tune-gemm's table).
absl::StatusOr<nlohmann::json> gemm_plans(Backend& be, const BenchOptions& o);

// --lora-rank R --loras N: N adapters of rank R on every Linear of `config`, random values
// (alpha = rank), weights 0.8, -0.5, 0.8, ...; none without --lora-rank.
std::vector<LoraRequest> random_lora_requests(const Flux2Config& config, const BenchOptions& o);

// What the result JSON says about the adapters (rank, count, device bytes) beside its ratios.
nlohmann::json lora_result(const Flux2Config& config, const BenchOptions& o, int64_t value_bytes);

}  // namespace flux2
