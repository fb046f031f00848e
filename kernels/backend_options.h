// Process-wide settings of a backend, fixed when it is created (create_backend): filled from the
// flags of flux2_server and flux2, printed in the start-up log and reported by GetModelInfo, so
// nothing else (no environment variable) steers the backends. What changes per request is in
// RequestOptions (kernels/base/request_options.h). Tested by tests/host/small_units_test.cc.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace flux2 {

struct BackendOptions {
  // CPU backend: worker threads of parallel_for (--cpu-threads); 0: the hardware's concurrency.
  int cpu_threads = 0;
  // CUDA backend, quality=high: attention through our FP8 flash-attention kernel on Hopper
  // (--fp8-attention on); off: bf16 attention (cuDNN), ~2 ms slower per klein-4B step and closer
  // to lossless.
  bool fp8_attention = true;
  // CUDA backend: time cuBLASLt's top candidates on each GEMM shape's first call and keep the
  // fastest (--gemm-autotune); faster, but the choice, and so the last bits of lossless results,
  // may differ between processes. Off: the heuristic's first algorithm, the same in every process.
  bool gemm_autotune = false;
  // CUDA backend: where each GEMM shape's algorithm comes from (--gemm-algorithms): "builtin", the
  // table embedded at build time (kernels/cuda/gemm_algorithms.json, tuned on the H200); a file
  // in that format (`flux2 bench --tune-gemm` writes one); "heuristic": cuBLASLt's first choice.
  // Shapes the table lacks, and GPUs or cuBLASLt versions it has no section for, take the
  // heuristic's. Any of them gives the same algorithm, so the same bits, in every process.
  std::string gemm_algorithms = "builtin";

  // Every option as (flag name, value), in flag order: the start-up log and GetModelInfo.
  std::vector<std::pair<std::string, std::string>> describe() const {
    return {{"cpu-threads", std::to_string(cpu_threads)},
            {"fp8-attention", fp8_attention ? "on" : "off"},
            {"gemm-autotune", gemm_autotune ? "on" : "off"},
            {"gemm-algorithms", gemm_algorithms}};
  }
};

}  // namespace flux2
