// Plain argument structs for the CUDA kernel launchers (style.md P2): raw device pointers plus
// dims, host-compilable, no CUDA types. A Mat is a row-major matrix whose rows may be strided.
#pragma once

#include <cstdint>

namespace flux2::cuda {

struct Mat {
  void* data = nullptr;  // first element (bf16 unless a launcher says otherwise)
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;    // elements between row starts (>= cols)
};

// True when every row start of m is 16-byte aligned for `elem_bytes`-sized elements.
inline bool rows_aligned16(const Mat& m, int elem_bytes) {
  return (reinterpret_cast<uintptr_t>(m.data) % 16 == 0) && ((m.stride * elem_bytes) % 16 == 0);
}

}  // namespace flux2::cuda
