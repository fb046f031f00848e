// Element-wise CUDA launchers on bf16 matrices (rows may be strided): the eager pieces PyTorch
// runs as separate kernels (each rounding to bf16) and the fused kernels that replay the same
// roundings in one pass. Tested bit for bit (fused vs eager) by tests/cuda/op_cases.cc
// (gpu_op_test).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "kernels/base/dtype.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// ---- eager pieces: one PyTorch op each, output rounded to bf16 ----
absl::Status silu_bf16(const Mat& x, const Mat& out, cudaStream_t stream);               // x·σ(x)
absl::Status add_bf16(const Mat& a, const Mat& b, const Mat& out, cudaStream_t stream);  // a + b
absl::Status sub_bf16(const Mat& a, const Mat& b, const Mat& out, cudaStream_t stream);  // a − b
absl::Status mul_bf16(const Mat& a, const Mat& b, const Mat& out, cudaStream_t stream);  // a ⊙ b
// out[r, :] = gate[r / rows_per_gate, :] ⊙ update[r, :] (per-sample gates [B, D]).
absl::Status gate_mul_bf16(const Mat& gate, int64_t rows_per_gate, const Mat& update,
                           const Mat& out, cudaStream_t stream);

// out[r, :] = bf16(x[r, :] + row[r / rows_per_row, :])  (broadcast add of a [B, D] row).
absl::Status add_row_bf16(const Mat& x, const Mat& row, int64_t rows_per_row, const Mat& out,
                          cudaStream_t stream);
// out = bf16(1 + x)
absl::Status one_plus_bf16(const Mat& x, const Mat& out, cudaStream_t stream);

// ---- fused, bit-identical to their eager chains ----
// x[r, :] = bf16(x + bf16(gate[r / rows_per_gate] ⊙ update))  (= gate_mul_bf16 then add_bf16)
absl::Status gate_residual_fused(const Mat& x, const Mat& gate, int64_t rows_per_gate,
                                 const Mat& update, cudaStream_t stream);
// out = bf16(residual + bf16(x + bias[c]))  (= add_row_bf16 of the [1, cols] bias row, then
// add_bf16): a convolution's bias and the resnet's shortcut add in one pass.
absl::Status bias_residual_fused(const Mat& x, const Mat& bias, const Mat& residual, const Mat& out,
                                 cudaStream_t stream);
// out = bf16(bf16(silu(gate)) ⊙ up)  (= silu_bf16 then mul_bf16)
absl::Status swiglu_fused(const Mat& gate, const Mat& up, const Mat& out, cudaStream_t stream);
// The same with silu computed as `math` says (kExact: the line above).
absl::Status swiglu_fused(const Mat& gate, const Mat& up, const Mat& out, SiluMath math,
                          cudaStream_t stream);

// ---- single kernels with PyTorch's rounding points inside ----
// x = bf16(f32(x) + dt·f32(v)): the scheduler's float32 Euler update (product and sum rounded
// separately, no FMA), stored back in bf16.
absl::Status euler_step_bf16(const Mat& x, const Mat& v, float dt, cudaStream_t stream);
// out = bf16(uncond + bf16(scale · bf16(cond − uncond))) (three eager bf16 ops).
absl::Status cfg_combine_bf16(const Mat& uncond, const Mat& cond, float scale, const Mat& out,
                              cudaStream_t stream);

// dst = src with dtype conversion (f32 <-> bf16, same dtype = copy); shapes equal.
absl::Status convert_copy(const Mat& src, DType src_dtype, const Mat& dst, DType dst_dtype,
                          cudaStream_t stream);

// out[0] = 1 / (a[0] · b[0]) (device floats): the NVFP4 GEMM's alpha from two global scales.
// out[n] = w_scale[n] · f32(gate[n]) for n < count (f32 scales, bf16 gate): an FP8 GEMM's
// per-channel scales with a transformer block's residual gate folded in.
absl::Status gated_channel_scales(const float* w_scale, const void* gate, int64_t count, float* out,
                                  cudaStream_t stream);
absl::Status inverse_product(const float* a, const float* b, float* out, cudaStream_t stream);

// Fills a contiguous bf16 buffer of `count` values with uniform values in [-scale, scale] from a
// counter-based hash of (seed, index): random weights for benchmarks.
absl::Status fill_uniform_bf16(void* data, int64_t count, uint64_t seed, float scale,
                               cudaStream_t stream);

}  // namespace flux2::cuda
