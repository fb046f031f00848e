// The E4M3 -> bf16 row-scaled dequantization of dequantize_e4m3.h: one thread per 8 codes (an
// 8-byte load, a 16-byte store), the code converted exactly (kernels/base/fp8_nvfp4.h), times the
// row's scale in f32, rounded to bf16 once. Tested by tests/cuda/fp8_stored_weight_test.cc.
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequantize_e4m3.h"

namespace flux2::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kCodesPerThread = 8;  // one uint2 load of codes, one uint4 store of bf16

__global__ void dequantize_e4m3_kernel(const uint2* values, const float* row_scales,
                                       __nv_bfloat16* out, int64_t rows, int64_t cols,
                                       int64_t out_stride) {
  const int64_t groups_per_row = cols / kCodesPerThread;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (group >= rows * groups_per_row) return;
  const int64_t r = group / groups_per_row, c = (group % groups_per_row) * kCodesPerThread;
  const uint2 packed = values[group];
  const float scale = row_scales[r];
  alignas(16) __nv_bfloat16 result[kCodesPerThread];
  for (int i = 0; i < kCodesPerThread; ++i) {
    const uint32_t word = i < 4 ? packed.x : packed.y;
    const uint8_t code = static_cast<uint8_t>(word >> (8 * (i % 4)));
    // __fmul_rn: one rounding, never contracted with anything.
    result[i] = __float2bfloat16_rn(__fmul_rn(e4m3_to_f32(code), scale));
  }
  *reinterpret_cast<uint4*>(out + r * out_stride + c) = *reinterpret_cast<const uint4*>(result);
}

}  // namespace

absl::Status dequantize_e4m3_rows_bf16(const DequantizeE4m3Args& args, cudaStream_t stream) {
  const auto aligned = [](const void* p, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  if (args.rows <= 0 || args.cols <= 0 || args.cols % kCodesPerThread != 0 ||
      args.out_stride < args.cols || args.out_stride % kCodesPerThread != 0 ||
      !aligned(args.values, 8) || !aligned(args.out, 16) || args.row_scales == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dequantize_e4m3_rows_bf16: [", args.rows, ", ", args.cols, "] (out stride ",
        args.out_stride, ") needs cols and the stride multiples of 8, 8-byte aligned codes and a ",
        "16-byte aligned output"));
  }
  const int64_t groups = args.rows * (args.cols / kCodesPerThread);
  const int64_t blocks = (groups + kThreads - 1) / kThreads;
  dequantize_e4m3_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint2*>(args.values), args.row_scales,
      static_cast<__nv_bfloat16*>(args.out), args.rows, args.cols, args.out_stride);
  FLUX_RETURN_IF_LAUNCH_FAILED("dequantize_e4m3_rows_bf16");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
