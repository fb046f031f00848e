// A plain CUDA attention kernel for every shape the models use (any head_dim <= 512, grouped-query
// heads, causal and key-length masks): the fallback when cuDNN's fused SDPA cannot serve a shape,
// and the reference the cuDNN path is tested against (tests/cuda/op_cases.cc (gpu_op_test),
// tests/cuda/fast_path_fallback_test.cc).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// out [S_q, H·Dh] = softmax(q kᵀ · scale + mask) v per head; q [S_q, H·Dh], k, v [S_k, Hkv·Dh],
// all bf16 with strided rows. fp32 scores, online softmax, output rounded to bf16.
absl::Status attention_fallback(const Mat& q, const Mat& k, const Mat& v,
                                const AttentionParams& params, const Mat& out, cudaStream_t stream);

}  // namespace flux2::cuda
