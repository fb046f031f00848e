// Device helpers shared by the CUDA kernels: bf16 <-> f32 with explicit rounding, 16-byte vector
// access, and deterministic warp/block reductions (fixed butterfly order). Included by .cu only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_f32(float v) {
  return v;
}
// Round-to-nearest-even to bf16, as a PyTorch eager op stores its output.
__device__ __forceinline__ __nv_bfloat16 to_bf16(float v) {
  return __float2bfloat16_rn(v);
}
// The value a bf16 store then load would give.
__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// silu(x) = x / (1 + exp(-x)) in fp32. kExact: PyTorch's (expf, IEEE division). kFast: the
// special-function unit (__expf: 2 + |1.17 x| ulp; __fdividef: 2 ulp, and 0 for a denominator
// beyond 2^126, i.e. x < -87, where |silu(x)| < 2^-119).
template <SiluMath kMath>
__device__ __forceinline__ float silu_value(float x) {
  if constexpr (kMath == SiluMath::kExact) {
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
  } else {
    return __fdividef(x, __fadd_rn(1.0f, __expf(-x)));
  }
}

// One SwiGLU element before its output rounding: bf16(silu(g)) · u (the eager silu then mul).
template <SiluMath kMath>
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return __fmul_rn(round_bf16(silu_value<kMath>(g)), u);
}

// r / n for the non-negative row arithmetic of the kernels: a 32-bit division whenever both fit
// (the 64-bit one costs dozens of instructions), the same quotient either way.
__device__ __forceinline__ int64_t row_div(int64_t r, int64_t n) {
  if (((r | n) >> 31) == 0) return static_cast<uint32_t>(r) / static_cast<uint32_t>(n);
  return r / n;
}

// 8 bf16 values = 16 bytes.
struct alignas(16) Bf16x8 {
  __nv_bfloat16 v[8];
};

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float out[8]) {
  const Bf16x8 pack = *reinterpret_cast<const Bf16x8*>(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = __bfloat162float(pack.v[i]);
}

__device__ __forceinline__ void store8(__nv_bfloat16* p, const float in[8]) {
  Bf16x8 pack;
#pragma unroll
  for (int i = 0; i < 8; ++i) pack.v[i] = __float2bfloat16_rn(in[i]);
  *reinterpret_cast<Bf16x8*>(p) = pack;
}

// 8 bf16 held in a 16-byte register pack, element 0 in the low half of .x (memory order). These
// helpers never take the pack's address, which would put it in local memory.
__device__ __forceinline__ void unpack_bf16x8(const uint4& pack, float x[8]) {  // exact
  const uint32_t words[4] = {pack.x, pack.y, pack.z, pack.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(words[i] << 16);
    x[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// The 8 values rounded to bf16 (round to nearest even, as to_bf16) and packed.
__device__ __forceinline__ uint4 pack_bf16x8(const float x[8]) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    words[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// Running max of the magnitudes of a pack, as bf16x2 magnitudes (integer max of magnitude bits
// orders bf16 like f32, NaN above infinity; exact in any order).
__device__ __forceinline__ uint32_t max_magnitudes_bf16x8(uint32_t running, const uint4& v) {
  running = __vmaxu2(running, v.x & 0x7fff7fffu);
  running = __vmaxu2(running, v.y & 0x7fff7fffu);
  running = __vmaxu2(running, v.z & 0x7fff7fffu);
  return __vmaxu2(running, v.w & 0x7fff7fffu);
}

// The f32 magnitude bits of the larger half of bf16x2 magnitudes (as abs_bits would give).
__device__ __forceinline__ uint32_t magnitude_bits_of(uint32_t bf16x2_magnitudes) {
  return max(bf16x2_magnitudes & 0xffffu, bf16x2_magnitudes >> 16) << 16;
}

// Sum across a warp by xor butterfly: every lane gets the same, order-fixed result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum across a block of blockDim.x threads (a multiple of 32, <= 1024); `scratch` holds 32 floats.
// Deterministic: warp butterflies, then warp 0 sums the partials in warp order. All threads get
// the result. Contains __syncthreads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < warps ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) scratch[0] = t;
  }
  __syncthreads();
  return scratch[0];
}

// Max of magnitude bit patterns across the block (all threads get it); `scratch` holds 32 words.
// Integer max: exact and the same in any order. Contains __syncthreads.
__device__ __forceinline__ uint32_t block_max_bits(uint32_t v, uint32_t* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    uint32_t t = lane < warps ? scratch[lane] : 0u;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      t = max(t, __shfl_xor_sync(0xffffffffu, t, offset));
    if (lane == 0) scratch[0] = t;
  }
  __syncthreads();
  return scratch[0];
}

// True when p is 16-byte aligned.
__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace flux2::cuda
