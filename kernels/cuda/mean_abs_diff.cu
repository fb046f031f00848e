// The fixed-order |a − b| and |a| sums of mean_abs_diff.h: two passes (256 blocks of 256 threads,
// then one block over their partials), float64 throughout, no atomics, so a shape always gives
// the same bits. Tested by tests/cuda/step_cache_test.cc.
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/mean_abs_diff.h"

namespace flux2::cuda {
namespace {

constexpr int kThreads = 256;  // per block, both passes (a power of two: the tree halves it)

// Halves `values` [kThreads] down to values[0] (= values[0] + ... in a fixed tree order).
__device__ void tree_sum(double* values) {
  for (int half = kThreads / 2; half > 0; half /= 2) {
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < half) values[threadIdx.x] += values[threadIdx.x + half];
  }
  __syncthreads();
}

__global__ void partial_sums_kernel(const __nv_bfloat16* a, int64_t a_stride,
                                    const __nv_bfloat16* b, int64_t b_stride, int64_t rows,
                                    int64_t cols, double* partials) {
  __shared__ double diff[kThreads], mag[kThreads];
  const int64_t count = rows * cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  double d = 0.0, m = 0.0;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < count;
       e += step) {
    const int64_t r = e / cols, c = e % cols;
    const double x = __bfloat162float(a[r * a_stride + c]);
    const double y = __bfloat162float(b[r * b_stride + c]);
    d += fabs(x - y);
    m += fabs(x);
  }
  diff[threadIdx.x] = d;
  mag[threadIdx.x] = m;
  tree_sum(diff);
  tree_sum(mag);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = diff[0];
    partials[2 * blockIdx.x + 1] = mag[0];
  }
}

__global__ void final_sums_kernel(const double* partials, double* sums) {
  static_assert(kMeanAbsDiffBlocks == kThreads, "one thread per partial");
  __shared__ double diff[kThreads], mag[kThreads];
  diff[threadIdx.x] = partials[2 * threadIdx.x];
  mag[threadIdx.x] = partials[2 * threadIdx.x + 1];
  tree_sum(diff);
  tree_sum(mag);
  if (threadIdx.x == 0) {
    sums[0] = diff[0];
    sums[1] = mag[0];
  }
}

}  // namespace

absl::Status mean_abs_diff_sums(const Mat& a, const Mat& b, double* workspace, double* sums,
                                cudaStream_t stream) {
  if (a.rows != b.rows || a.cols != b.cols) {
    return absl::InvalidArgumentError(absl::StrCat("mean_abs_diff: shapes [", a.rows, ", ", a.cols,
                                                   "] and [", b.rows, ", ", b.cols, "] differ"));
  }
  if (a.cols <= 0 || a.rows <= 0) {
    return absl::InvalidArgumentError("mean_abs_diff: empty matrices");
  }
  partial_sums_kernel<<<kMeanAbsDiffBlocks, kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(a.data), a.stride,
      static_cast<const __nv_bfloat16*>(b.data), b.stride, a.rows, a.cols, workspace);
  FLUX_RETURN_IF_LAUNCH_FAILED("mean_abs_diff partial sums");
  final_sums_kernel<<<1, kThreads, 0, stream>>>(workspace, sums);
  FLUX_RETURN_IF_LAUNCH_FAILED("mean_abs_diff final sums");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
