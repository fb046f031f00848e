// The LoRA A products of one input, every adapter at once: t[:, 0:R) = x · [a_0; a_1; ...]ᵀ, the
// stacks' rows concatenated (R <= 128), fp32 accumulation rounded once to bf16. cuBLASLt's
// algorithms for N = R this narrow stream x at 40-440 GB/s (one CTA per 128 rows, K in one
// pass); this kernel splits K over enough CTAs to fill the GPU and sums the slices in a fixed
// order, so it streams x near the bandwidth and gives the same bits every run. Tested by
// tests/cuda/op_cases.cc (lora_down, against the CPU reference; --perf against cuBLASLt).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

inline constexpr int kLoraDownMaxRank = 128;  // R: every stack's rows together
inline constexpr int kLoraDownMaxStacks = 8;

// "" when lora_down_bf16 takes these operands: bf16 x with K a multiple of 8 and 16-byte aligned
// rows, at most kLoraDownMaxStacks stacks [r_i, K] of 16-byte aligned rows with R <= 128, t
// [rows of x, R]; otherwise why not (the caller then runs one GEMM per stack).
absl::string_view lora_down_unsupported(const Mat& x, const std::vector<Mat>& stacks, const Mat& t);

// The K slices lora_down_bf16 splits x into for `rows` x `k` on a GPU of `sms` SMs (1: no
// partial sums); it needs splits x rows x lora_down_partial_cols(R) floats of `partials`.
int lora_down_splits(int64_t rows, int64_t k, int sms);
int lora_down_partial_cols(int64_t rank);

// t = x · [stacks]ᵀ. `partials` (device, f32): lora_down_splits(...) x x.rows x
// lora_down_partial_cols(R) floats when splits > 1, else unused.
absl::Status lora_down_bf16(const Mat& x, const std::vector<Mat>& stacks, const Mat& t, int splits,
                            float* partials, cudaStream_t stream);

}  // namespace flux2::cuda
