// Launch helpers for row-strided element-wise kernels: one thread per 8 contiguous elements of a
// row when every operand allows 16-byte access, else one thread per element. Included by .cu only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"

namespace flux2::cuda {

// f(r, c · kWidth) for every item of a rows x cols grid (a grid-stride loop). Index: the loop's
// integer type — 32-bit whenever rows x cols plus one grid stride fits in 31 bits (a 64-bit
// division or modulo costs dozens of instructions per item, enough to slow these memory-bound
// loops).
template <int kWidth, typename Index, typename F>
__global__ void for_each_kernel(Index rows, Index cols, F f) {
  const Index total = rows * cols;
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    f(static_cast<int64_t>(i / cols), static_cast<int64_t>(i % cols) * kWidth);
  }
}

// Blocks of `kernel` (`threads` threads each, no dynamic shared memory) resident on the current
// device at once: the grid of a persistent or cooperative kernel. Host work only; callers cache it.
inline absl::StatusOr<int> resident_blocks(const void* kernel, int threads, const char* op) {
  int device = 0, sms = 0, per_sm = 0;
  FLUX_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), op));
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), op));
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0), op));
  return std::max(1, sms * per_sm);
}

// Whether `items` grid-stride iterations can use 32-bit indices (the last stride step included).
inline bool fits_32bit(int64_t items) {
  return items < (int64_t{1} << 31);
}

inline int grid_for(int64_t items, int threads) {
  // Enough blocks to fill an H200 several times over; grid-stride loops cover the rest.
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((items + threads - 1) / threads, 132 * 32)));
}

// Launches for_each_kernel<kWidth> over a rows x cols grid with the narrowest index that fits.
template <int kWidth, typename F>
void launch_grid(int64_t rows, int64_t cols, cudaStream_t stream, F f) {
  constexpr int kThreads = 256;
  const int grid = grid_for(rows * cols, kThreads);
  if (fits_32bit(rows * cols + int64_t{grid} * kThreads)) {
    for_each_kernel<kWidth, uint32_t><<<grid, kThreads, 0, stream>>>(
        static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), f);
  } else {
    for_each_kernel<kWidth, int64_t><<<grid, kThreads, 0, stream>>>(rows, cols, f);
  }
}

// Runs vec8(r, c) for c = 0, 8, 16, ... when `vectorized`, else scalar(r, c) for every c.
template <typename Vec8, typename Scalar>
void launch_rows(int64_t rows, int64_t cols, bool vectorized, cudaStream_t stream, Vec8 vec8,
                 Scalar scalar) {
  if (rows == 0 || cols == 0) return;
  if (vectorized && cols % 8 == 0) {
    launch_grid<8>(rows, cols / 8, stream, vec8);
  } else {
    launch_grid<1>(rows, cols, stream, scalar);
  }
}

}  // namespace flux2::cuda
