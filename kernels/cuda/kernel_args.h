// Plain argument structs for the CUDA kernel launchers: raw device pointers plus dims,
// host-compilable, no CUDA types, so model/ code built by the host compiler can include the
// launcher headers. A Mat is a row-major matrix whose rows may be strided.
#pragma once

#include <cstdint>

namespace flux2::cuda {

struct Mat {
  void* data = nullptr;  // first element (bf16 unless a launcher says otherwise)
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between row starts (>= cols)
};

// How kernels compute silu(x) = x / (1 + exp(-x)) in fp32 (common.cuh: silu_value).
enum class SiluMath : uint8_t {
  kExact,  // expf and IEEE division, as PyTorch: bit-identical to the eager ops (quality=lossless)
  kFast,   // __expf and __fdividef (quality=high): within ~2^-16 relative for |x| < 100, far below
           // the bf16 rounding that follows; a third fewer instructions in the SwiGLU kernels
};

// True when every row start of m is 16-byte aligned for `elem_bytes`-sized elements.
inline bool rows_aligned16(const Mat& m, int elem_bytes) {
  return (reinterpret_cast<uintptr_t>(m.data) % 16 == 0) && ((m.stride * elem_bytes) % 16 == 0);
}

}  // namespace flux2::cuda
