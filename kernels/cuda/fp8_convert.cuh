// E4M3 / E2M1 conversions for CUDA kernels (included by .cu files only): the cvt instructions
// where compiled for the target, else the software conversions of kernels/base/fp8_nvfp4.h, bit for
// bit the same (tests/cuda/quantize_test.cc checks every f32 pattern range it is given).
#pragma once

#include <cstdint>

#include "kernels/base/fp8_nvfp4.h"

// cvt.rn.satfinite.e4m3x2.f32 exists from sm_89 (so on the H200); cvt.rn.satfinite.e2m1x2.f32 only
// on the family-specific Blackwell targets (sm_100a/103a/110a/120a ...), the same condition as
// cuda_fp8.h's __CUDA_FP8_INTERNAL_CAN_RELY_ON_PTX_FOR_SHORTTYPESCVT__ (plain sm_100 and sm_90
// take cuda_fp4.hpp's software routine).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define FLUX_HAS_E4M3_CVT 1
#else
#define FLUX_HAS_E4M3_CVT 0
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && \
    __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
#define FLUX_HAS_E2M1_CVT 1
#else
#define FLUX_HAS_E2M1_CVT 0
#endif

namespace flux2::cuda {

// The conversions the kernels use: the cvt instructions when kHw and compiled for the target,
// else the software ones. Host-device only so the fp8_nvfp4.h block template can take it.
template <bool kHw>
struct DeviceCvt {
  // Two E4M3 bytes, `lo` in the low byte (cvt puts its first source operand in the upper half).
  FLUX_HOST_DEVICE static uint16_t e4m3x2(float lo, float hi) {
#if FLUX_HAS_E4M3_CVT
    if constexpr (kHw) {
      uint16_t r;
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
      return r;
    } else
#endif
    {
      return static_cast<uint16_t>(f32_to_e4m3(lo) | (f32_to_e4m3(hi) << 8));
    }
  }
  FLUX_HOST_DEVICE static uint8_t e4m3(float x) {
    return static_cast<uint8_t>(e4m3x2(x, 0.0f) & 0xffu);
  }
  // Two E2M1 codes, `lo` in the low nibble.
  FLUX_HOST_DEVICE static uint8_t e2m1x2(float lo, float hi) {
#if FLUX_HAS_E2M1_CVT
    if constexpr (kHw) {
      uint16_t r;
      asm("{\n\t.reg .b8 fq;\n\tcvt.rn.satfinite.e2m1x2.f32 fq, %1, %2;\n\tmov.b16 %0, {fq, "
          "0};\n\t}"
          : "=h"(r)
          : "f"(hi), "f"(lo));
      return static_cast<uint8_t>(r);
    } else
#endif
    {
      return SoftwareCvt::e2m1x2(lo, hi);
    }
  }
};

// 8 values -> 8 E4M3 bytes e4m3(scaled(x)), element order = memory order.
template <bool kHw, typename Scaled>
__device__ __forceinline__ uint2 fp8_pack8_scaled(const float x[8], Scaled scaled) {
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t lo = DeviceCvt<kHw>::e4m3x2(scaled(x[4 * i]), scaled(x[4 * i + 1]));
    const uint32_t hi = DeviceCvt<kHw>::e4m3x2(scaled(x[4 * i + 2]), scaled(x[4 * i + 3]));
    w[i] = lo | (hi << 16);
  }
  return make_uint2(w[0], w[1]);
}

// 8 values -> 8 E4M3 bytes e4m3(x · encode); encode = fp8_encode_factor(scale), so each byte
// equals fp8_quantize_value(x, scale).
template <bool kHw>
__device__ __forceinline__ uint2 fp8_pack8(const float x[8], float encode) {
  return fp8_pack8_scaled<kHw>(x, [encode](float v) { return mul_rn(v, encode); });
}

// 16 values -> 16 E4M3 bytes, the same conversion.
template <bool kHw>
__device__ __forceinline__ uint4 fp8_pack16(const float x[16], float encode) {
  const uint2 lo = fp8_pack8<kHw>(x, encode), hi = fp8_pack8<kHw>(x + 8, encode);
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

// 8 values -> 8 E4M3 bytes under a static activation scale: each byte equals
// fp8_quantize_static_value(x, scale), e4m3(x / scale) with an IEEE division per element.
template <bool kHw>
__device__ __forceinline__ uint2 fp8_pack8_static(const float x[8], float scale) {
  return fp8_pack8_scaled<kHw>(x, [scale](float v) { return div_rn(v, scale); });
}

// 16 values -> 16 E4M3 bytes, the same conversion.
template <bool kHw>
__device__ __forceinline__ uint4 fp8_pack16_static(const float x[16], float scale) {
  const uint2 lo = fp8_pack8_static<kHw>(x, scale), hi = fp8_pack8_static<kHw>(x + 8, scale);
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

}  // namespace flux2::cuda
