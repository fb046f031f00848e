// bf16 GEMMs through cuBLASLt: Y = X·Wᵀ (+ bias) in the TN "column-major swap"
// layout, fp32 accumulation, one plan per shape and pointer-alignment class (descriptors + the
// algorithm without split-K reductions, for run-to-run determinism), one 32 MiB workspace per
// stream. The algorithm comes from the tuned table (GemmOptions::algorithms, --gemm-algorithms)
// when it has the plan's key, else the heuristic's first; GemmOptions::autotune times the
// heuristic's top candidates on the first call of each other shape instead (the choice may differ
// between processes: `flux2 bench --tune-gemm` writes it into a table, which does not). Tested by
// tests/cuda/op_cases.cc (gpu_op_test) (against the CPU backend), gemm_algorithm_table_test.cc
// (tables and candidates) and tests/cuda/quality_high_test.cc (FP8).
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/gemm_algorithm_table.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

struct GemmOptions {
  // FP8 GEMMs accumulate in the tensor cores for the whole K (cuBLASLt FAST_ACCUM) instead of
  // promoting to fp32 every few k-steps: 5-8% faster on the H200. Its error is measured against the
  // error of the E4M3 operands themselves (tests/cuda/fp8_accumulation_test.cc, PERF_NOTES run 31).
  bool fp8_fast_accumulation = true;
  // Time the heuristic's top candidates on each shape's first call and keep the fastest
  // (BackendOptions::gemm_autotune) instead of taking its first one.
  bool autotune = false;
  // Tuned algorithms by plan key (this GPU's and cuBLASLt's section of --gemm-algorithms); a plan
  // whose key is missing, or whose algorithm cuBLASLt rejects, takes the heuristic's.
  GemmAlgorithmTable algorithms;
};

// How the plans built so far chose their algorithm.
struct GemmPlanStats {
  int64_t plans = 0;
  int64_t from_table = 0;  // the tuned table's algorithm
  int64_t timed = 0;       // tuned: timed by GemmOptions::autotune, or chosen by a tuner
};

class Gemm final : public GemmCandidates {
 public:
  // Loads cuBLASLt, creates a handle and the stream's workspace.
  static absl::StatusOr<std::unique_ptr<Gemm>> create(cudaStream_t stream,
                                                      const GemmOptions& options = {});
  ~Gemm() override;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N] if non-null); bf16 everywhere, rows may be strided.
  // Asynchronous on the stream; plans are built on first use of a shape (host work only).
  absl::Status linear(const Mat& x, const Mat& w, const void* bias, const Mat& y);

  // c[M, N] = alpha · a[M, K] · b[N, K]ᵀ, or a · b with b [K, N] when !b_transposed.
  // bf16 inputs; c is bf16 (c_f32 false) or f32.
  absl::Status matmul(const Mat& a, const Mat& b, bool b_transposed, float alpha, const Mat& c,
                      bool c_f32);

  // FP8 (E4M3) TN GEMM (TN is the only FP8 layout Hopper supports):
  // y[M, N] (bf16) = (x_scale · x8[M, K]) · (w_scale · w8[N, K])ᵀ with dequantization scales in
  // device memory, fp32 accumulation. `rowwise`: x_scale holds M per-token and w_scale N
  // per-output-channel scales (cuBLASLt OUTER_VEC_32F); else one each. K % 16 == 0, 16-byte aligned
  // operands and scales (the FP8 requirements on Hopper). `accumulate`: y += that product instead
  // (beta = 1, y read and written in place).
  absl::Status linear_fp8(const Mat& x8, const float* x_scale, const Mat& w8, const float* w_scale,
                          const Mat& y, bool rowwise, bool accumulate = false);
  // Whether cuBLASLt offers rowwise-scaled FP8 GEMMs on this device (heuristic probe, host only).
  bool supports_rowwise_fp8();

  // NVFP4 block-scaled GEMM (Blackwell, compute capability >= 10.0; cuBLASLt scale mode
  // VEC16_UE4M3): y[M, N] (bf16) = alpha · Σ_k (x4·sx)(w4·sw), x4 [M, K] and w4 [N, K] packed E2M1
  // (two per byte; Mat cols/stride in elements), UE4M3 scales per 16 elements of K in the 128x4
  // swizzled layout, alpha a device float (1 / (global scale of x · global scale of w)).
  absl::Status linear_nvfp4(const Mat& x4, const void* x_scales, const Mat& w4,
                            const void* w_scales, const float* alpha, const Mat& y);
  // Whether cuBLASLt offers the NVFP4 GEMM on this device (heuristic probe, host only).
  bool supports_nvfp4();

  size_t plan_count() const { return plans_.size(); }
  GemmPlanStats plan_stats() const;
  // GemmCandidates (plans from the table have none: the tuner leaves them).
  std::vector<std::string> keys() const override;
  int count(const std::string& key) const override;
  absl::Status choose(const std::string& key, int index, double tuned_ms,
                      double heuristic_ms) override;
  // Every plan's algorithm that came from the table or was tuned (GemmOptions::autotune, or
  // choose()), under its key: what `flux2 bench --tune-gemm` merges into a table.
  GemmAlgorithmTable algorithms(const std::string& device) const;
  // "m=4608 n=27648 k=3072 lda=3072 ...": a plan's key in the table.
  static std::string key_string(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                int64_t ldc, bool b_transposed, bool c_f32, bool has_bias,
                                int align_a, int align_b, int align_c, int align_bias, int format);

 private:
  struct Plan;
  // Operand formats.
  enum class Format : int { kBf16, kFp8Tensor, kFp8Rowwise, kNvfp4 };
  // (m, n, k, lda, ldb, ldc, b_transposed, c_f32, has_bias, alignment classes of a, b, c, bias,
  // format)
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool,
                         int, int, int, int, Format>;

  Gemm() = default;
  absl::StatusOr<Plan*> plan(const Key& key);
  // Whether cuBLASLt offers a GEMM in `format` on this device (heuristic probe, host only).
  bool supports(Format format);
  // a_scale / b_scale: dequantization scales of a and b for the low-precision formats; for
  // kNvfp4 `alpha_device` replaces `alpha`.
  absl::Status run(const Mat& a, const Mat& b, bool b_transposed, const void* bias, float alpha,
                   const Mat& c, bool c_f32, Format format = Format::kBf16,
                   const void* a_scale = nullptr, const void* b_scale = nullptr,
                   const float* alpha_device = nullptr, float beta = 0.0f);

  cudaStream_t stream_ = nullptr;
  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // kWorkspaceBytes of device memory
  float* zero_ = nullptr;      // a device 0.0f: beta in device pointer mode
  std::map<Key, std::unique_ptr<Plan>> plans_;
  GemmOptions options_;
};

}  // namespace flux2::cuda
