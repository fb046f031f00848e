// Normalisation launchers on bf16 matrices: LayerNorm (eager) and LayerNorm + modulation
// (fused), RMSNorm as Qwen3 computes it, and per-head QK RMSNorm + RoPE as separate eager kernels
// and as one fused kernel. Rounding points are PyTorch eager bf16's, written out per launcher below
// (kernels/README.md, "Rounding points"); tested bit for bit (fused vs eager) by
// tests/cuda/op_cases.cc (gpu_op_test).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// out = bf16(LayerNorm(x)) without affine (statistics in fp32, two passes).
absl::Status layer_norm_bf16(const Mat& x, float eps, const Mat& out, cudaStream_t stream);
// out = bf16(bf16(bf16(1 + scale) · bf16(LN(x))) + shift) in one kernel; scale/shift rows [1, D]
// (rows_per_mod rows of x share one modulation row). Bit-identical to layer_norm_bf16 followed by
// one_plus_bf16, gate_mul_bf16 and add_row_bf16. fp8 (optional, quality=high): also writes
// E4M3 [rows, cols] of the rounded outputs, each row quantized under the scale of its own max
// |out| (written to row_scales[r]): bit for bit fp8_quantize_rows of `out`, for the FP8 GEMM that
// reads it next; or, with static_scale, every row under that one scale (a checkpoint's
// input_scale: bit for bit fp8_quantize_static of `out`, the scale written to every row_scales[r]).
// Needs layer_norm_writes_fp8(x). out.data may then be null (the E4M3 rows alone).
struct Fp8Rows {
  uint8_t* values = nullptr;            // contiguous [rows, cols] E4M3, 8-byte aligned
  float* row_scales = nullptr;          // [rows]: receives each row's dequantization scale
  const float* static_scale = nullptr;  // device f32: the static activation scale; null: per row
};
absl::Status layer_norm_modulate_fused(const Mat& x, const Mat& shift, const Mat& scale,
                                       int64_t rows_per_mod, float eps, const Mat& out,
                                       cudaStream_t stream, Fp8Rows fp8 = {});
// Whether layer_norm_modulate_fused can also write E4M3 for x (the vectorized row layout).
bool layer_norm_writes_fp8(const Mat& x);

// Qwen3RMSNorm: out = bf16(weight · bf16(x · rsqrt(mean(x²) + eps))).
absl::Status rms_norm_qwen_bf16(const Mat& x, const void* weight, float eps, const Mat& out,
                                cudaStream_t stream);

// Per-head RMSNorm in place on x [S, H·Dh] with weight [Dh] (bf16).
//   kInterleaved (FLUX.2, torch.nn.RMSNorm): bf16(x · rstd · w), one rounding;
//   kHalfSplit (Qwen3RMSNorm): bf16(w · bf16(x · rstd)), two roundings.
absl::Status qk_rms_norm_bf16(const Mat& x, int64_t head_dim, const void* weight, float eps,
                              RopeStyle style, cudaStream_t stream);
// Rotary embedding in place on x [S, H·Dh] with f32 tables cos/sin [S, Dh]:
//   kInterleaved (diffusers): bf16(f32(x·cos) + f32(rot(x)·sin)) in fp32;
//   kHalfSplit (HF Qwen3): bf16 ops with bf16 tables: bf16(bf16(x·cos) + bf16(rot(x)·sin)).
absl::Status rope_bf16(const Mat& x, int64_t head_dim, const Mat& cos, const Mat& sin,
                       RopeStyle style, cudaStream_t stream);
// qk_rms_norm_bf16 then rope_bf16 in one kernel, bit-identical to the pair.
absl::Status qk_norm_rope_fused(const Mat& x, int64_t head_dim, const void* weight, float eps,
                                const Mat& cos, const Mat& sin, RopeStyle style,
                                cudaStream_t stream);

}  // namespace flux2::cuda
