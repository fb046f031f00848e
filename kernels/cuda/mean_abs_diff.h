// The reduction behind Backend::mean_abs_diff_ratio (step caching's relative L1 distance): the
// sums of |a − b| and |a| over two bf16 matrices, in a fixed order. Tested by
// tests/cuda/step_cache_test.cc (CUDA vs the CPU reference, the same bits twice).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// Partial sums per block of the first pass; the workspace holds 2 * kMeanAbsDiffBlocks doubles.
inline constexpr int kMeanAbsDiffBlocks = 256;

// sums[0] = Σ|a − b|, sums[1] = Σ|a| (device doubles) over a and b [rows, cols] (strided rows,
// same shape). Deterministic: element e of the row-major order goes to thread e % 65536 of a
// fixed 256 x 256 grid, each thread sums its elements in order in float64, the blocks reduce
// their threads as a fixed tree and one block adds the 256 partials as a fixed tree.
// `workspace`: 2 * kMeanAbsDiffBlocks device doubles. Asynchronous on `stream`.
absl::Status mean_abs_diff_sums(const Mat& a, const Mat& b, double* workspace, double* sums,
                                cudaStream_t stream);

}  // namespace flux2::cuda
