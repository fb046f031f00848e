// The per-element arithmetic of QK-norm and RoPE, shared by the norm kernels (norms.cu) and the
// FP8 attention operand quantizer that fuses them (attention_fp8_operands.cu), so that both round
// alike. Tested through tests/cuda/op_cases.cc (gpu_op_test) and
// tests/cuda/flash_attention_fp8_test.cc.
#pragma once

#include "kernels/backend.h"  // RopeStyle
#include "kernels/cuda/common.cuh"

namespace flux2::cuda {

// 1 / sqrt(mean square + eps) of a head from its sum of squares.
__device__ __forceinline__ float head_rstd_of(float sum_of_squares, float head_dim, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(sum_of_squares, head_dim), eps));
}

// The same for a head size known at compile time that is a power of two: the division by it is
// then a multiplication by its exact reciprocal, which rounds the same quotient the same way.
template <int kHeadDim>
__device__ __forceinline__ float head_rstd_of(float sum_of_squares, float eps) {
  static_assert(kHeadDim > 0 && (kHeadDim & (kHeadDim - 1)) == 0, "a power of two");
  return rsqrtf(__fadd_rn(__fmul_rn(sum_of_squares, 1.0f / kHeadDim), eps));
}

// One element of an RMS-normalised head: FLUX.2 (interleaved) rounds once, Qwen3 (half split)
// after the normalisation and after the weight, as the eager ops do.
__device__ __forceinline__ float head_norm_value(float x, float rstd, float w, RopeStyle style) {
  if (style == RopeStyle::kInterleaved) return round_bf16(__fmul_rn(__fmul_rn(x, rstd), w));
  return round_bf16(__fmul_rn(w, round_bf16(__fmul_rn(x, rstd))));
}

// One element of the rotary embedding: x·cos + rot(x)·sin, where rot(x) = sign · partner.
__device__ __forceinline__ float rope_value(float x, float partner, float sign, float c, float s,
                                            RopeStyle style) {
  const float rot = sign * partner;  // exact: a sign flip
  if (style == RopeStyle::kInterleaved) return __fadd_rn(__fmul_rn(x, c), __fmul_rn(rot, s));
  return __fadd_rn(round_bf16(__fmul_rn(x, round_bf16(c))),
                   round_bf16(__fmul_rn(rot, round_bf16(s))));
}

}  // namespace flux2::cuda
