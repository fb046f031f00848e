// Row softmax for attention computed through GEMMs (the VAE's single-head, head_dim 512 attention,
// which cuDNN's fused SDPA does not serve): f32 scores in, bf16 probabilities out.
// Tested through tests/cuda/op_cases.cc (gpu_op_test) (attention d=512 against the CPU backend).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// probs[r, :] = bf16(softmax(scores[r, :])); scores is f32, probs bf16, same shape.
absl::Status softmax_rows_f32_to_bf16(const Mat& scores, const Mat& probs, cudaStream_t stream);

}  // namespace flux2::cuda
