// Launch helpers for row-strided element-wise kernels: one thread per 8 contiguous elements of a
// row when every operand allows 16-byte access, else one thread per element. Included by .cu only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace flux2::cuda {

// Index: the loop's integer type — 32-bit whenever rows x columns plus one grid stride fits in 31
// bits (a 64-bit division or modulo costs dozens of instructions per item, enough to slow these
// memory-bound loops).
template <typename Index, typename F>
__global__ void for_each_vec8_kernel(Index rows, Index vec_cols, F f) {
  const Index total = rows * vec_cols;
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    f(static_cast<int64_t>(i / vec_cols), static_cast<int64_t>(i % vec_cols) * 8);
  }
}

template <typename Index, typename F>
__global__ void for_each_scalar_kernel(Index rows, Index cols, F f) {
  const Index total = rows * cols;
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    f(static_cast<int64_t>(i / cols), static_cast<int64_t>(i % cols));
  }
}

// Whether `items` grid-stride iterations can use 32-bit indices (the last stride step included).
inline bool fits_32bit(int64_t items) {
  return items < (int64_t{1} << 31);
}

inline int grid_for(int64_t items, int threads) {
  // Enough blocks to fill an H200 several times over; grid-stride loops cover the rest.
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((items + threads - 1) / threads, 132 * 32)));
}

// Runs vec8(r, c) for c = 0, 8, 16, ... when `vectorized`, else scalar(r, c) for every c.
template <typename Vec8, typename Scalar>
void launch_rows(int64_t rows, int64_t cols, bool vectorized, cudaStream_t stream, Vec8 vec8,
                 Scalar scalar) {
  constexpr int kThreads = 256;
  if (rows == 0 || cols == 0) return;
  if (vectorized && cols % 8 == 0) {
    const int64_t vec_cols = cols / 8;
    const int grid = grid_for(rows * vec_cols, kThreads);
    if (fits_32bit(rows * vec_cols + int64_t{grid} * kThreads)) {
      for_each_vec8_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(
          static_cast<uint32_t>(rows), static_cast<uint32_t>(vec_cols), vec8);
    } else {
      for_each_vec8_kernel<int64_t><<<grid, kThreads, 0, stream>>>(rows, vec_cols, vec8);
    }
  } else {
    const int grid = grid_for(rows * cols, kThreads);
    if (fits_32bit(rows * cols + int64_t{grid} * kThreads)) {
      for_each_scalar_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(
          static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), scalar);
    } else {
      for_each_scalar_kernel<int64_t><<<grid, kThreads, 0, stream>>>(rows, cols, scalar);
    }
  }
}

}  // namespace flux2::cuda
