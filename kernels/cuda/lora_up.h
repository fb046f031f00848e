// LoRA's B product and its add in one kernel (Backend::lora_up_add): y is read and written once
// instead of the product being written by a GEMM and read back by an element-wise add. Tested by
// tests/cuda/op_cases.cc (gpu_op_test --op lora_up_add: against the CPU reference; --perf times
// it).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// In place on bf16 y [M, N]: y = bf16(y + bf16(bf16(t · bᵀ) · scale)) with t [M, r], b [N, r]
// (bf16, rows may be strided). The product's fp32 sum runs over r on the tensor cores (mma
// m16n8k16, k in order of 16-wide chunks), the same order for every M, N and call.
absl::Status lora_up_add_bf16(const Mat& y, const Mat& t, const Mat& b, float scale,
                              cudaStream_t stream);

}  // namespace flux2::cuda
