// diffusers' image post-processing of one value in [-1, 1] to a uint8 level, shared by the model
// (image_to_u8), the CPU backend and (as device code) the CUDA kernel. Tested by
// tests/host/vae_test.cc (against a naive reference and the golden image_u8).
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

}  // namespace flux2
