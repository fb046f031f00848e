// LoRA's B products and their adds in one kernel (Backend::lora_up_add), optionally fused with
// the op that consumes them (the SwiGLU, the gated residual, q's and k's RMSNorm and RoPE): y is
// read once and, unfused, written once, instead of each product being written by a GEMM and read
// back by an element-wise add. Tested by tests/cuda/op_cases.cc (gpu_op_test --op lora_up*: against
// the CPU reference and the eager chain; --perf times them).
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"  // RopeStyle
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// One term: y's columns [out_offset, out_offset + b.rows) get bf16(bf16(t · bᵀ) · scale) added,
// with t [M, r], b [out, r] (bf16, rows may be strided). The product's fp32 sum runs over r on
// the tensor cores (mma m16n8k16, k in order of 16-wide chunks), the same order for every shape.
struct LoraUp {
  Mat t, b;
  float scale = 1.0f;
  int64_t out_offset = 0;
};

// In place on bf16 y [M, N]: y = bf16(y + term) for each term in order.
absl::Status lora_up_add_bf16(const Mat& y, const std::vector<LoraUp>& terms, cudaStream_t stream);

// out [M, F] = bf16(bf16(silu(g)) · u) (the swiglu kernel's bits) with g, u the columns [0, F)
// and [F, 2F) of y [M, 2F] after the terms; y is not written.
absl::Status lora_up_swiglu_bf16(const Mat& y, const std::vector<LoraUp>& terms, const Mat& out,
                                 SiluMath math, cudaStream_t stream);

// x [M, N] = bf16(x + bf16(gate · y')) (gate_residual's bits) with gate [1, N] and y' = y [M, N]
// after the terms; y is not written.
absl::Status lora_up_gate_residual_bf16(const Mat& y, const std::vector<LoraUp>& terms,
                                        const Mat& x, const Mat& gate, cudaStream_t stream);

// In place on bf16 y [M, H·128] (q's or k's columns): the terms added, then each head
// RMS-normalised with norm_weight (bf16 [128]) and rotated by the f32 tables cos, sin [M, 128]:
// the bits of lora_up_add_bf16 followed by qk_norm_rope's vectorised kernel, y read and written
// once. Needs lora_up_qk_norm_rope_unsupported(...) == "".
absl::Status lora_up_qk_norm_rope_bf16(const Mat& y, const std::vector<LoraUp>& terms,
                                       const void* norm_weight, float eps, const Mat& cos,
                                       const Mat& sin, RopeStyle style, cudaStream_t stream);
// "" when that kernel reproduces qk_norm_rope's reduction on these operands (head_dim 128, y's rows
// 8-byte aligned, the tables' 16-byte aligned), else the fallback reason.
absl::string_view lora_up_qk_norm_rope_unsupported(const Mat& y, int64_t head_dim, const Mat& cos,
                                                   const Mat& sin);

}  // namespace flux2::cuda
