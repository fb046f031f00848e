// Our FP8 (E4M3) flash attention for Hopper (quality=high): Q·Kᵀ and P·V on the tensor
// cores (wgmma, operands in shared memory through TMA), online softmax in fp32, P rounded to E4M3,
// bf16 output. Deterministic: every output element is computed by one CTA in a fixed order. Keys
// may outnumber queries and come in two segments (a call's own keys, then cached ones:
// kernels/base/fp8_attention_keys.h). Operands come from attention_fp8_operands.h. Tested against a
// float64 reference of the same E4M3 operands by tests/cuda/flash_attention_fp8_test.cc and
// flash_attention_fp8_keys_test.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/base/fp8_attention_keys.h"
#include "kernels/base/fp8_nvfp4.h"  // FLUX_HOST_DEVICE
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

inline constexpr int64_t kFlashFp8HeadDim = 128;
// V is stored transposed, [H · 128, keys], with the keys padded to a multiple of this (per
// segment).
inline constexpr int64_t kFlashFp8KeyBlock = kFp8AttentionKeyBlock;

// Keys of V's transposed layout: column `position` of a row holds key flash_fp8_key_at(position);
// key k sits at column flash_fp8_position_of(k). Within each group of 32 the keys are permuted so
// that the softmax probabilities feed the P·V multiply straight from the registers that Q·Kᵀ left
// them in (a key 16h + 8a + 2t + b sits at 16h + 4t + 2a + b).
FLUX_HOST_DEVICE inline int64_t flash_fp8_key_at(int64_t position) {
  const int64_t within = position % 32;
  const int64_t half = within / 16, t = (within / 4) % 4, a = (within / 2) % 2, b = within % 2;
  return position - within + 16 * half + 8 * a + 2 * t + b;
}
FLUX_HOST_DEVICE inline int64_t flash_fp8_position_of(int64_t key) {
  const int64_t within = key % 32;
  const int64_t half = within / 16, a = (within / 8) % 2, t = (within / 2) % 4, b = within % 2;
  return key - within + 16 * half + 4 * t + 2 * a + b;
}
inline int64_t flash_fp8_padded_keys(int64_t keys) {
  return (keys + kFlashFp8KeyBlock - 1) / kFlashFp8KeyBlock * kFlashFp8KeyBlock;
}

// V's dequantization scale for a block of keys with max |v| = amax: the power of two at or above
// fp8_dequant_scale(amax) (NaN and infinity stay). A power of two, so that the kernel folds its
// log2 into the softmax exponent exactly (flash_attention_fp8.cu: softmax_tile).
FLUX_HOST_DEVICE inline float flash_fp8_value_scale(float amax) {
  const float scale = fp8_dequant_scale(amax);
  uint32_t bits = f32_bits(scale);
  if ((bits & 0x7f800000u) == 0x7f800000u || (bits & 0x007fffffu) == 0) return scale;
  bits = (bits & 0xff800000u) + 0x00800000u;  // the next power of two (2^-126 for a subnormal)
  return f32_from_bits(bits);
}

inline int64_t flash_fp8_tiles(int64_t tokens) {
  return (tokens + kFlashFp8KeyBlock - 1) / kFlashFp8KeyBlock;
}

// One segment of keys with their values, in the kernel's layout; its blocks of 128 keys count from
// its own first key.
struct FlashFp8KeySegment {
  // E4M3, token-major [S_seg, H·128], row stride in bytes (a multiple of 16). rows 0: no segment.
  Mat k;
  // E4M3 [H·128, flash_fp8_padded_keys(S_seg)] (row stride = that), keys permuted as above; the
  // padding keys hold zeros.
  const void* vt = nullptr;
  // Device fp32 dequantization scales (value = stored · scale) per head and block of 128 keys
  // ([H][flash_fp8_tiles(S_seg)], head-major); V's are powers of two (flash_fp8_value_scale).
  const float* scale_k = nullptr;
  const float* scale_v = nullptr;
};

struct FlashFp8Args {
  Mat q;  // E4M3, token-major [S_q, H·128], row stride in bytes (a multiple of 16)
  // The keys: segment 0 (at least one key), then segment 1 (k.rows 0: none). Softmax runs over
  // both as one sequence; tiles never straddle them.
  FlashFp8KeySegment keys[2];
  Mat out;  // bf16 [S_q, H·128]
  int64_t heads = 0;
  float softmax_scale = 0.0f;
  const float* scale_q = nullptr;  // [H][flash_fp8_tiles(S_q)], as the keys' scales
};

// True when the kernel runs here: compiled for sm_90a and the device is compute capability 9.0.
bool flash_attention_fp8_available();
// Whether the kernel serves this attention: non-causal, unmasked, head_dim 128, as many kv heads
// as heads, k and v with the same rows (any number of them, S_k > S_q included), bf16 rows 16-byte
// aligned (for the operand quantizer).
bool flash_attention_fp8_supports(const AttentionParams& params, const Mat& q, const Mat& k,
                                  const Mat& v);
// Checks shapes, strides and alignment (naming the field) and launches on `stream`. Bits depend
// only on the operands and the segment layout, never on other launches.
absl::Status flash_attention_fp8(const FlashFp8Args& args, cudaStream_t stream);

}  // namespace flux2::cuda
