// The E4M3 operands of our FP8 flash attention (flash_attention_fp8.h) from bf16 Q, K, V, scaled
// per head and block of 128 tokens (one pass: each block finds its own amax), V transposed into the
// key-permuted layout. Bit for bit equal to the CPU reference of
// tests/cuda/flash_attention_fp8_test.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// Device buffers for S tokens and H heads (width = H · 128), 16-byte aligned.
struct FlashFp8Operands {
  void* q = nullptr;        // E4M3 [S, width], contiguous
  void* k = nullptr;        // E4M3 [S, width], contiguous
  void* vt = nullptr;       // E4M3 [width, flash_fp8_padded_keys(S)]
  float* scales = nullptr;  // flash_fp8_scale_count(H, S) floats: Q's [H][tiles], K's, then V's
};
int64_t flash_fp8_scale_count(int64_t heads, int64_t tokens);

// The kernel's operands from these buffers (out and softmax_scale left to the caller).
FlashFp8Args flash_fp8_args(const FlashFp8Operands& operands, int64_t tokens, int64_t heads);

// QK-norm and RoPE applied on the way (Backend::normed_attention's fusion): q and k are then the
// raw projections, and each head of a row is RMS-normalised (rows [0, split) with weight [0], the
// rest with [1]) and rotated (interleaved pairs) with exactly qk_norm_rope's arithmetic and
// rounding before it is quantized, so the result equals qk_norm_rope followed by the plain
// quantizer.
struct FlashFp8QkNorm {
  const void* q_weight[2] = {nullptr, nullptr};  // bf16 [128]
  const void* k_weight[2] = {nullptr, nullptr};
  int64_t split = 0;
  float eps = 0.0f;
  Mat cos, sin;  // f32 [S, 128], rows 16-byte aligned
};

// q, k, v: bf16 [S, width] (rows 16-byte aligned, may be strided). Scales of a block with max |x| =
// amax: fp8_dequant_scale(amax) for Q and K, flash_fp8_value_scale(amax) for V; values
// fp8_quantize_value(x, scale). Two kernels on `stream`.
absl::Status quantize_attention_operands_fp8(const Mat& q, const Mat& k, const Mat& v,
                                             int64_t heads, const FlashFp8Operands& out,
                                             cudaStream_t stream,
                                             const FlashFp8QkNorm* norm = nullptr);

}  // namespace flux2::cuda
