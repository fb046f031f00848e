// The per-element arithmetic of QK-norm and RoPE, shared by the norm kernels (norms.cu) and the
// FP8 attention operand quantizer that fuses them (attention_fp8_operands.cu) and the LoRA kernel
// that adds q's and k's terms before them (lora_up.cu), so that all round alike. Tested through
// tests/cuda/op_cases.cc (gpu_op_test) and tests/cuda/flash_attention_fp8_test.cc.
#pragma once

#include <cuda_bf16.h>

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

// ---- head_dim 128: lane l of a warp holds elements 4l..4l+3 of a head (8-byte loads); the
// eager norm kernels (norms.cu) and the fused LoRA one (lora_up.cu) reduce in this order ----
constexpr int kVecHeadDim = 128;

struct Bf16x4 {
  __nv_bfloat162 lo, hi;
};

__device__ __forceinline__ void load4(const __nv_bfloat16* p, float v[4]) {
  const Bf16x4 pack = *reinterpret_cast<const Bf16x4*>(p);
  v[0] = __low2float(pack.lo);
  v[1] = __high2float(pack.lo);
  v[2] = __low2float(pack.hi);
  v[3] = __high2float(pack.hi);
}

__device__ __forceinline__ void store4(__nv_bfloat16* p, const float v[4]) {
  Bf16x4 pack;
  pack.lo = __floats2bfloat162_rn(v[0], v[1]);
  pack.hi = __floats2bfloat162_rn(v[2], v[3]);
  *reinterpret_cast<Bf16x4*>(p) = pack;
}

// Normalises (and rounds) this lane's four elements v of a head, w the lane's norm weights.
__device__ __forceinline__ void norm4(float v[4], const float w[4], float eps, RopeStyle style) {
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) squares = __fadd_rn(squares, __fmul_rn(v[i], v[i]));
  const float rstd = head_rstd_of(warp_sum(squares), static_cast<float>(kVecHeadDim), eps);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = head_norm_value(v[i], rstd, w[i], style);
}

// Normalised (and rounded) values of this lane's four elements.
__device__ __forceinline__ void head_norm4(const __nv_bfloat16* head, const __nv_bfloat16* weight,
                                           float eps, RopeStyle style, float v[4]) {
  const int lane = threadIdx.x & 31;
  load4(head + 4 * lane, v);
  float w[4];
  load4(weight + 4 * lane, w);
  norm4(v, w, eps, style);
}

// This lane's four cos and sin values of a table row.
struct Rope4 {
  float cs[4], sn[4];
};

__device__ __forceinline__ Rope4 load_rope4(const float* cos_row, const float* sin_row) {
  const int lane = threadIdx.x & 31;
  const float4 c = reinterpret_cast<const float4*>(cos_row)[lane];
  const float4 s = reinterpret_cast<const float4*>(sin_row)[lane];
  return Rope4{{c.x, c.y, c.z, c.w}, {s.x, s.y, s.z, s.w}};
}

// RoPE of this lane's four (already rounded) values.
__device__ __forceinline__ void rope4(float v[4], const Rope4& t, RopeStyle style) {
  const int lane = threadIdx.x & 31;
  float partner[4], sign[4];
  if (style == RopeStyle::kInterleaved) {
    partner[0] = v[1], partner[1] = v[0], partner[2] = v[3], partner[3] = v[2];
    sign[0] = sign[2] = -1.0f, sign[1] = sign[3] = 1.0f;
  } else {
    // Half split: element d pairs with d ± 64, four elements per lane -> lane ^ 16.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      partner[i] = __shfl_xor_sync(0xffffffffu, v[i], 16);
      sign[i] = lane < 16 ? -1.0f : 1.0f;
    }
  }
  float result[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    result[i] = rope_value(v[i], partner[i], sign[i], t.cs[i], t.sn[i], style);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = result[i];
}

}  // namespace flux2::cuda
