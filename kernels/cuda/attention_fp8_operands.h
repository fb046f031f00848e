// The E4M3 operands of our FP8 flash attention (flash_attention_fp8.h) from bf16 Q, K, V, scaled
// per head and block of 128 tokens (one pass: each block finds its own amax), V transposed into the
// key-permuted layout, and its inverse for cached keys. Bit for bit equal to the CPU references of
// tests/cuda/flash_attention_fp8_test.cc and flash_attention_fp8_keys_test.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// Device buffers for S_q query and S_kv key tokens and H heads (width = H · 128), 16-byte aligned.
struct FlashFp8Operands {
  void* q = nullptr;        // E4M3 [S_q, width], contiguous (unused when S_q is 0)
  void* k = nullptr;        // E4M3 [S_kv, width], contiguous
  void* vt = nullptr;       // E4M3 [width, flash_fp8_padded_keys(S_kv)]
  float* scales = nullptr;  // flash_fp8_scale_count(H, S_q, S_kv) floats: Q's [H][tiles(S_q)],
                            // then K's and V's [H][tiles(S_kv)] each
};
int64_t flash_fp8_scale_count(int64_t heads, int64_t q_tokens, int64_t kv_tokens);

// The key segment these buffers hold (klein-KV's FP8 cache: S_q 0), and the kernel's operands
// with it as segment 0 (out and softmax_scale left to the caller; no segment 1).
FlashFp8KeySegment flash_fp8_key_segment(const FlashFp8Operands& operands, int64_t q_tokens,
                                         int64_t kv_tokens, int64_t heads);
FlashFp8Args flash_fp8_args(const FlashFp8Operands& operands, int64_t q_tokens, int64_t kv_tokens,
                            int64_t heads);

// QK-norm and RoPE applied on the way (Backend::normed_attention's fusion): q and k are then the
// raw projections, and each head of a row is RMS-normalised (rows [0, split) with weight [0], the
// rest with [1]) and rotated (interleaved pairs) with exactly qk_norm_rope's arithmetic and
// rounding before it is quantized, so the result equals qk_norm_rope followed by the plain
// quantizer. Needs as many q as k rows (row i of both at position i).
struct FlashFp8QkNorm {
  const void* q_weight[2] = {nullptr, nullptr};  // bf16 [128]
  const void* k_weight[2] = {nullptr, nullptr};
  int64_t split = 0;
  float eps = 0.0f;
  Mat cos, sin;  // f32 [S, 128], rows 16-byte aligned
};

// q: bf16 [S_q, width], k and v: bf16 [S_kv, width] (rows 16-byte aligned, may be strided; S_q 0
// quantizes only the keys and values, S_kv >= 1). Scales of a block of 128 tokens with max |x| =
// amax: fp8_dequant_scale(amax) for Q and K, flash_fp8_value_scale(amax) for V; values
// fp8_quantize_value(x, scale). Q's and K's blocks count from their own first rows. Two kernels on
// `stream`.
absl::Status quantize_attention_operands_fp8(const Mat& q, const Mat& k, const Mat& v,
                                             int64_t heads, const FlashFp8Operands& out,
                                             cudaStream_t stream,
                                             const FlashFp8QkNorm* norm = nullptr);

// The inverse for a key segment (the fallback of klein-KV's FP8 cache, which keeps no bf16 copy):
// k_out[r, c] = bf16(e4m3(k[r, c]) · scale_k[h][r / 128]) and v_out[r, c] = bf16(e4m3(vt[c,
// flash_fp8_position_of(r)]) · scale_v[h][r / 128]), h = c / 128: the f32 product (exact) rounded
// once to nearest even. k_out and v_out bf16 [rows, H·128], rows 16-byte aligned, may be strided.
// One kernel on `stream`.
absl::Status dequantize_attention_keys_fp8(const FlashFp8KeySegment& keys, int64_t heads,
                                           const Mat& k_out, const Mat& v_out, cudaStream_t stream);

}  // namespace flux2::cuda
