// GroupNorm statistics in one pass over x for quality=high (the `group_norm_one_pass` fast path):
// Welford per thread, Chan's merges in a fixed tree. Tested by tests/cuda/backend_ops_test.cc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// Whether the one-pass statistics serve x [P, C] (bf16): C % 8 == 0, C <= 2048, 16-byte aligned
// rows (the vectorized layout of the two-pass statistics).
bool group_norm_one_pass_supported(const Mat& x);
// Per group of x [P, C] (bf16): mean and rstd = 1/sqrt(var + eps) into the device arrays mean,
// rstd [groups], reading x once: each thread keeps a running (count, mean, M2) per channel
// (Welford), merged (Chan et al.) over a block's threads and channels, then over the blocks, in a
// fixed order, so the result does not depend on the GPU or the run. Two-pass statistics
// (image_ops.h) read x twice and keep PyTorch's lossless bits; these agree with them to float
// rounding.
absl::Status group_norm_statistics_one_pass_bf16(const Mat& x, int64_t groups, float eps,
                                                 float* mean, float* rstd, cudaStream_t stream);

}  // namespace flux2::cuda
