// CPU emulation of quality=high's FP8 formats; see cpu_fp8.h.
#include "kernels/cpu/cpu_fp8.h"

#include <algorithm>

#include "kernels/base/fp8_attention_keys.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/parallel.h"
#include "kernels/cpu/cpu_access.h"

namespace flux2::cpu {
namespace {

constexpr int64_t kBlockRows = kFp8AttentionKeyBlock;  // the FP8 attention's token block

float dequantized(float x, float scale) {
  return e4m3_to_f32(fp8_quantize_value(x, scale)) * scale;
}

// The power of two at or above `scale` (a positive finite float), as V's block scales.
float power_of_two_at_or_above(float scale) {
  uint32_t bits = f32_bits(scale);
  if ((bits & 0x7f800000u) == 0x7f800000u || (bits & 0x007fffffu) == 0) return scale;
  return f32_from_bits((bits & 0xff800000u) + 0x00800000u);
}

}  // namespace

void quantize_rows_e4m3(const Tensor& src, const Tensor& dst) {
  parallel_for(src.rows(), rows_per_chunk(src), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = row(src, r);
      float amax = 0.0f;
      for (int64_t c = 0; c < src.cols(); ++c) amax = abs_max(amax, in[c]);
      const float scale = fp8_dequant_scale(amax);
      float* out = row(dst, r);
      for (int64_t c = 0; c < src.cols(); ++c) out[c] = dequantized(in[c], scale);
    }
  });
}

void quantize_static_e4m3(const Tensor& src, float scale, const Tensor& dst) {
  parallel_for(src.rows(), rows_per_chunk(src), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = row(src, r);
      float* out = row(dst, r);
      for (int64_t c = 0; c < src.cols(); ++c)
        out[c] = e4m3_to_f32(fp8_quantize_static_value(in[c], scale)) * scale;
    }
  });
}

void quantize_head_blocks_e4m3(const Tensor& src, int64_t head_dim, bool power_of_two,
                               const Tensor& dst) {
  const int64_t heads = src.cols() / head_dim;
  const int64_t blocks = (src.rows() + kBlockRows - 1) / kBlockRows;
  parallel_for(blocks * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t first = (item / heads) * kBlockRows, h = item % heads;
      const int64_t last = std::min(src.rows(), first + kBlockRows);
      float amax = 0.0f;
      for (int64_t r = first; r < last; ++r) {
        const float* in = row(src, r) + h * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) amax = abs_max(amax, in[d]);
      }
      float scale = fp8_dequant_scale(amax);
      if (power_of_two) scale = power_of_two_at_or_above(scale);
      for (int64_t r = first; r < last; ++r) {
        const float* in = row(src, r) + h * head_dim;
        float* out = row(dst, r) + h * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) out[d] = dequantized(in[d], scale);
      }
    }
  });
}

float round_probability_e4m3(float p) {
  return e4m3_to_f32(f32_to_e4m3(p * 256.0f)) * (1.0f / 256.0f);
}

}  // namespace flux2::cpu
