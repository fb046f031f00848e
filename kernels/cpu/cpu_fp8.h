// quality=high on the CPU reference backend: a naive float32 emulation of the CUDA backend's FP8
// formats (E4M3 values under per-row, per-tensor static, or per head and 128-token block, scales;
// attention
// probabilities rounded to E4M3), so the quality=high paths have a same-precision reference to
// bound their error by (a bound of k times a naive same-precision implementation's error against a
// float32 or float64 reference). Internal to kernels/cpu; tested by tests/host/cpu_ops_test.cc
// (CpuFp8Test).
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/backend.h"

namespace flux2::cpu {

// A weight's E4M3 copy under a scale per row (output channel), dequantized to float32.
struct CpuLowPrecision final : LowPrecisionWeight {
  Tensor values;  // f32 [N, K]: e4m3(w · 1/s_r) · s_r (a stored FP8 weight's: float(W8) · s_r)
  // The static activation scale of a stored FP8 weight (add_stored_fp8_weight's input_scale):
  // linear quantizes x per tensor under it; none: per token.
  std::optional<float> input_scale;
  int64_t device_bytes() const override { return values.bytes(); }
};

// dst[r, :] = e4m3(src[r, :] / s_r) · s_r with s_r = fp8_dequant_scale(max_c |src[r, c]|), the
// scale the CUDA backend's rowwise quantizer uses. src and dst f32 [rows, cols], may alias.
void quantize_rows_e4m3(const Tensor& src, const Tensor& dst);
// dst = e4m3(src / scale) · scale for every element (fp8_quantize_static_value: IEEE division,
// round-to-nearest-even, saturation to ±448): a per-tensor static activation scale, as the CUDA
// backend's fp8_quantize_static. src and dst f32 [rows, cols], may alias.
void quantize_static_e4m3(const Tensor& src, float scale, const Tensor& dst);
// The attention operands' recipe: every head's columns [h·head_dim, (h+1)·head_dim) of each block
// of 128 rows under its own scale (fp8_dequant_scale of the block's amax; with `power_of_two`, the
// power of two at or above it, as V's), dequantized into dst.
void quantize_head_blocks_e4m3(const Tensor& src, int64_t head_dim, bool power_of_two,
                               const Tensor& dst);
// An attention probability p in [0, 1] as the FP8 kernel multiplies it: e4m3(256 · p) / 256.
float round_probability_e4m3(float p);

}  // namespace flux2::cpu
