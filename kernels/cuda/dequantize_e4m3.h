// An FP8 checkpoint's stored weight made bf16 on the device: out[r, c] = bf16(float(W8[r, c]) *
// row_scales[r]), the value the loader's host dequantization uploads. Tested by
// tests/cuda/fp8_stored_weight_test.cc (bit-exact against the host's dequantize_fp8 + bf16 upload).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace flux2::cuda {

struct DequantizeE4m3Args {
  const void* values = nullptr;       // E4M3 codes [rows, cols], contiguous
  const float* row_scales = nullptr;  // [rows], each finite and > 0
  void* out = nullptr;                // bf16 [rows, cols], row stride out_stride (elements)
  int64_t rows = 0;
  int64_t cols = 0;        // a multiple of 8 (one 8-byte load per thread)
  int64_t out_stride = 0;  // >= cols, a multiple of 8
};

// The product in f32 (exact code, one rounding), then round-to-nearest-even to bf16, as
// convert_host's f32 -> bf16 upload does. A NaN code (0x7F / 0xFF) gives a bf16 NaN: the loader
// refused those already. Asynchronous on `stream`; InvalidArgument without launching when the
// shape or alignment does not fit.
absl::Status dequantize_e4m3_rows_bf16(const DequantizeE4m3Args& args, cudaStream_t stream);

}  // namespace flux2::cuda
