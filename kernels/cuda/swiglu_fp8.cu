// swiglu_fp8.h: one block per row holds the row's packs in registers, finds its max |value| (or
// takes the static scale), then writes the row in E4M3 under that scale. Tested by
// tests/cuda/quantize_test.cc (bit for bit against fp8_quantize_rows of the concatenation).
#include "kernels/cuda/swiglu_fp8.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_convert.cuh"

namespace flux2::cuda {
namespace {

constexpr int kThreads = 256;

// Pack p of the row (8 values) is the prefix's pack p, or SwiGLU pack p - P/8. Thread t holds
// packs t, t + 256, ... (kPacks of them at most).
template <int kPacks, SiluMath kMath>
__global__ void __launch_bounds__(kThreads)
    swiglu_fp8_rows_kernel(Mat prefix, Mat gate, Mat up, uint8_t* out, float* row_scales,
                           const float* static_scale) {
  __shared__ uint32_t scratch[32];
  const int64_t r = blockIdx.x;
  const int prefix_packs = static_cast<int>(prefix.cols / 8);
  const int packs = prefix_packs + static_cast<int>(gate.cols / 8);
  const auto* prefix_row = static_cast<const __nv_bfloat16*>(prefix.data) + r * prefix.stride;
  const auto* gate_row = static_cast<const __nv_bfloat16*>(gate.data) + r * gate.stride;
  const auto* up_row = static_cast<const __nv_bfloat16*>(up.data) + r * up.stride;
  uint4 held[kPacks];
  uint32_t magnitudes = 0;  // bf16x2
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kThreads;
    if (p >= packs) break;
    if (p < prefix_packs) {
      held[j] = reinterpret_cast<const uint4*>(prefix_row)[p];
    } else {
      const int c = (p - prefix_packs) * 8;
      float g[8], u[8];
      load8(gate_row + c, g);
      load8(up_row + c, u);
#pragma unroll
      for (int i = 0; i < 8; ++i) g[i] = swiglu_value<kMath>(g[i], u[i]);
      held[j] = pack_bf16x8(g);  // swiglu_fused's bf16 output
    }
    magnitudes = max_magnitudes_bf16x8(magnitudes, held[j]);
  }
  // A static scale is the same for the whole block (no reduction); else the row's own.
  const bool fixed = static_scale != nullptr;
  const float scale = fixed ? *static_scale
                            : fp8_dequant_scale(__uint_as_float(
                                  block_max_bits(magnitude_bits_of(magnitudes), scratch)));
  if (threadIdx.x == 0) row_scales[r] = scale;
  const float encode = fp8_encode_factor(scale);
  uint8_t* out_row = out + r * packs * 8;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kThreads;
    if (p >= packs) break;
    float x[8];
    unpack_bf16x8(held[j], x);
    reinterpret_cast<uint2*>(out_row)[p] =
        fixed ? fp8_pack8_static<true>(x, scale) : fp8_pack8<true>(x, encode);
  }
}

template <int kPacks>
void launch(const SwigluFp8Rows& a, cudaStream_t stream) {
  auto* out = static_cast<uint8_t*>(a.out);
  const auto grid = static_cast<unsigned>(a.gate.rows);
  if (a.math == SiluMath::kExact) {
    swiglu_fp8_rows_kernel<kPacks, SiluMath::kExact>
        <<<grid, kThreads, 0, stream>>>(a.prefix, a.gate, a.up, out, a.row_scales, a.static_scale);
  } else {
    swiglu_fp8_rows_kernel<kPacks, SiluMath::kFast>
        <<<grid, kThreads, 0, stream>>>(a.prefix, a.gate, a.up, out, a.row_scales, a.static_scale);
  }
}

}  // namespace

bool swiglu_fp8_rows_supported(const Mat& prefix, const Mat& gate, const Mat& up) {
  const bool prefix_ok =
      prefix.cols == 0 || (prefix.rows == gate.rows && rows_aligned16(prefix, 2));
  return prefix_ok && prefix.cols % 8 == 0 && gate.cols % 8 == 0 && gate.cols > 0 &&
         up.rows == gate.rows && up.cols == gate.cols && rows_aligned16(gate, 2) &&
         rows_aligned16(up, 2) && prefix.cols + gate.cols <= kSwigluFp8MaxColumns &&
         gate.rows <= 0x7fffffff;
}

absl::Status swiglu_fp8_rows(const SwigluFp8Rows& a, cudaStream_t stream) {
  if (!swiglu_fp8_rows_supported(a.prefix, a.gate, a.up)) {
    return absl::InvalidArgumentError(
        absl::StrCat("swiglu_fp8_rows: prefix [", a.prefix.rows, ", ", a.prefix.cols, "], gate [",
                     a.gate.rows, ", ", a.gate.cols, "] and up [", a.up.rows, ", ", a.up.cols,
                     "] need equal rows, 16-byte aligned rows, widths % 8 == 0 and at most ",
                     kSwigluFp8MaxColumns, " columns"));
  }
  const int64_t cols = a.prefix.cols + a.gate.cols;
  if (a.out == nullptr || !aligned16(a.out) || a.out_bytes < a.gate.rows * cols ||
      a.row_scales == nullptr) {
    return absl::InvalidArgumentError(
        "swiglu_fp8_rows: out must be a 16-byte aligned E4M3 [M, P + F] buffer, row_scales [M]");
  }
  if (a.gate.rows == 0) return absl::OkStatus();
  const int64_t per_thread = (cols / 8 + kThreads - 1) / kThreads;
  if (per_thread <= 2) {
    launch<2>(a, stream);
  } else if (per_thread <= 4) {
    launch<4>(a, stream);
  } else if (per_thread <= 6) {
    launch<6>(a, stream);
  } else if (per_thread <= 8) {
    launch<8>(a, stream);
  } else {
    launch<12>(a, stream);  // kSwigluFp8MaxColumns / 8 / kThreads
  }
  FLUX_RETURN_IF_LAUNCH_FAILED("swiglu_fp8_rows");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
