// quality=high's SwiGLU that writes E4M3 rows for the GEMM after it: [prefix | swiglu(gate, up)]
// quantized with one scale per row (or one static scale), without the bf16 activation. Tested bit
// for bit against fp8_quantize_rows / fp8_quantize_static of the materialized concatenation by
// tests/cuda/quantize_test.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

struct SwigluFp8Rows {
  Mat prefix;    // bf16 [M, P], P % 8 == 0 (P = 0: no prefix; data may then be null)
  Mat gate, up;  // bf16 [M, F], F % 8 == 0
  SiluMath math = SiluMath::kExact;
  void* out = nullptr;          // E4M3 [M, P + F] contiguous, 16-byte aligned
  int64_t out_bytes = 0;        // capacity of `out`
  float* row_scales = nullptr;  // [M]: fp8_dequant_scale(max |row|), as fp8_quantize_rows
  // Device f32: a static activation scale (a checkpoint's input_scale): every row quantized under
  // it as fp8_quantize_static does, and written to each row_scales[r]. Null: per row as above.
  const float* static_scale = nullptr;
};

// Whether swiglu_fp8_rows serves these operands (16-byte aligned rows, widths multiples of 8, at
// most kSwigluFp8MaxColumns columns in all).
bool swiglu_fp8_rows_supported(const Mat& prefix, const Mat& gate, const Mat& up);
constexpr int64_t kSwigluFp8MaxColumns = 24576;  // FLUX.2-dev's [attn | mlp]: 6144 + 18432

// out = fp8_quantize_rows([prefix | bf16(swiglu(gate, up))]) (values and row scales), or with
// static_scale fp8_quantize_static of it, the SwiGLU values rounded to bf16 exactly as
// swiglu_fused rounds them. One kernel, one block per row.
absl::Status swiglu_fp8_rows(const SwigluFp8Rows& args, cudaStream_t stream);

}  // namespace flux2::cuda
