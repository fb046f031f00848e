// Launch helpers for row-strided element-wise kernels: one thread per 8 contiguous elements of a
// row when every operand allows 16-byte access, else one thread per element. Included by .cu only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace flux2::cuda {

template <typename F>
__global__ void for_each_vec8_kernel(int64_t rows, int64_t vec_cols, F f) {
  const int64_t total = rows * vec_cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    f(i / vec_cols, (i % vec_cols) * 8);
  }
}

template <typename F>
__global__ void for_each_scalar_kernel(int64_t rows, int64_t cols, F f) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    f(i / cols, i % cols);
  }
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
    for_each_vec8_kernel<<<grid_for(rows * vec_cols, kThreads), kThreads, 0, stream>>>(rows, vec_cols, vec8);
  } else {
    for_each_scalar_kernel<<<grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(rows, cols, scalar);
  }
}

}  // namespace flux2::cuda
