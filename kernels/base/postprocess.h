// diffusers' image post-processing of one value in [-1, 1] to a uint8 level and the
// pre-processing of a reference image's level to [-1, 1], shared by the model, the CPU backend and
// (as device code) the CUDA kernels. Tested by tests/host/vae_test.cc (against a naive reference
// and the golden image_u8), tests/host/reference_image_test.cc and gpu_backend_ops_test.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FLUX_POSTPROCESS_HD __host__ __device__
#else
#define FLUX_POSTPROCESS_HD
#endif

namespace flux2 {

// round(clamp(unit, 0, 1) x 255) with numpy's round-half-to-even; NaN gives 0. `unit` is the
// pipeline's (x / 2 + 0.5) already computed in its dtype.
FLUX_POSTPROCESS_HD inline uint8_t unit_to_u8(float unit) {
  const float clamped = unit < 0.0f ? 0.0f : (unit > 1.0f ? 1.0f : unit);
  const float scaled = rintf(clamped * 255.0f);  // rint: round half to even in the default mode
  return scaled != scaled ? 0 : static_cast<uint8_t>(scaled);
}

// A reference image's level in [-1, 1] as diffusers makes it: numpy's float32 v / 255, then
// VaeImageProcessor.normalize's 2x - 1, each rounded to f32.
FLUX_POSTPROCESS_HD inline float u8_to_unit(uint8_t v) {
#if defined(__CUDA_ARCH__)  // the same roundings whatever --prec-div and --fmad say
  return __fsub_rn(__fmul_rn(2.0f, __fdiv_rn(static_cast<float>(v), 255.0f)), 1.0f);
#else
  return 2.0f * (static_cast<float>(v) / 255.0f) - 1.0f;
#endif
}

}  // namespace flux2
