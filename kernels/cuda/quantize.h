// FP8 (E4M3) and NVFP4 quantizer launchers for the quality=high path: per-tensor FP8 activations
// (dynamic amax, or a checkpoint's static input_scale), per-row / per-tensor FP8 weights, NVFP4
// with the 128x4 swizzled UE4M3 scales, and the fused "token concat + quantize" of the single
// block's to_out input. Bit for bit equal to the CPU references in kernels/base/fp8_nvfp4.h; tested
// by tests/cuda/quantize_test.cc (GPU) and tests/host/quantize_reference_test.cc (references).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// Which conversion instructions the kernels use.
enum class QuantizeConversion : uint8_t {
  kAuto,      // cvt.rn.satfinite.e4m3x2.f32 where compiled for sm_89+ (the H200 too),
              // cvt.rn.satfinite.e2m1x2.f32 on sm_100a/103a family targets; software elsewhere
  kSoftware,  // the software conversions of kernels/base/fp8_nvfp4.h on every target
};

// The matrix to quantize: the column concatenation [first | second] of two bf16 matrices with the
// same rows (the single block's [attn_out (D) | mlp_out (F)] -> to_out input, never materialized).
// `second` with cols == 0 means "first alone". Rows may be strided; each must start 2-byte aligned
// (16-byte aligned rows and D % 8 == 0 take the vectorized loads).
struct QuantizeInput {
  Mat first;   // bf16 [M, D]
  Mat second;  // bf16 [M, F], or cols == 0
};

// Scratch for the amax pass of the dynamic launchers (block partials, reduced in a fixed order).
inline constexpr int64_t kQuantizeWorkspaceBytes = 4096;

// ---- FP8 E4M3 ----

struct Fp8QuantizeArgs {
  QuantizeInput in;       // [M, K], K = D + F a multiple of 16
  void* out = nullptr;    // E4M3 [M, K] contiguous (row stride K bytes), 16-byte aligned
  int64_t out_bytes = 0;  // capacity of `out`, >= M * K
  // Dequantization scale(s), device fp32 (stored x scale = value; cuBLASLt A/B_SCALE_POINTER):
  // one value (per tensor) or M values (fp8_quantize_rows). Written by the dynamic launchers,
  // read by fp8_quantize_static.
  float* scale = nullptr;
  // Optional (fp8_quantize_static only): receives *scale in each of its M entries, the activation
  // scales of a rowwise GEMM (cuBLASLt OUTER_VEC_32F) under one static scale. 4-byte aligned.
  float* row_scales = nullptr;
  float* amax = nullptr;      // optional (dynamic only): receives max |x| as fp32
  void* workspace = nullptr;  // dynamic only: kQuantizeWorkspaceBytes, 4-byte aligned
  int64_t workspace_bytes = 0;
  QuantizeConversion conversion = QuantizeConversion::kAuto;
};

// Dynamic per-tensor scaling: amax = max |x| over [first | second] (exact and deterministic: block
// partials of magnitude-bit maxima, then one fixed-order reduction; no float atomics), *scale =
// fp8_dequant_scale(amax) = amax / 448 (1 for an all-zero input), out = fp8_quantize_value(x,
// *scale) = e4m3(x · (1 / *scale)) (RNE, saturating at ±448). Three kernels on `stream`; no
// synchronization. Also the per-tensor weight quantizer (run once at load). Non-finite inputs give
// a non-finite scale.
absl::Status fp8_quantize_dynamic(const Fp8QuantizeArgs& args, cudaStream_t stream);
// Static scaling (a checkpoint's input_scale, --fp8-input-scale static): out =
// fp8_quantize_static_value(x, *scale) = e4m3(x / *scale) (one IEEE division per element, RNE,
// saturating at ±448) with a given device scale, and *scale into each of row_scales' M entries
// when set; one kernel, no synchronization.
absl::Status fp8_quantize_static(const Fp8QuantizeArgs& args, cudaStream_t stream);
// Per-row (per output channel) weight quantization: scale[r] = amax(row r) / 448 (1 for a zero
// row), out[r, :] = fp8_quantize_value(x[r, :], scale[r]); `scale` holds M floats;
// `amax`/`workspace` unused.
// For cuBLASLt's OUTER_VEC_32F scale mode on the weight operand. One kernel.
absl::Status fp8_quantize_rows(const Fp8QuantizeArgs& args, cudaStream_t stream);

// ---- NVFP4 (E2M1 values, UE4M3 scales per 16 elements, per-tensor fp32 global scale) ----

struct Nvfp4QuantizeArgs {
  QuantizeInput in;          // [M, K], K = D + F a multiple of 16
  void* out = nullptr;       // packed E2M1 [M, K / 2] bytes, contiguous, element 2i in the low
  int64_t out_bytes = 0;     //   nibble of byte i; 16-byte aligned; capacity >= M * K / 2
  void* scales = nullptr;    // UE4M3 block scales in the 128x4 swizzled layout, padded rows and
  int64_t scales_bytes = 0;  //   K-blocks written as 0; 16-byte aligned; >= nvfp4_scale_bytes(M, K)
  // Global (encode) scale gs = 448 * 6 / amax, device fp32 (dequantization x = e2m1 * sf / gs; a
  // GEMM folds 1 / (gs_A * gs_B) into alpha). Written by the dynamic launcher, read by the static.
  float* global_scale = nullptr;
  float* amax = nullptr;      // optional (dynamic only)
  void* workspace = nullptr;  // dynamic only: kQuantizeWorkspaceBytes, 4-byte aligned
  int64_t workspace_bytes = 0;
  QuantizeConversion conversion = QuantizeConversion::kAuto;
};

// Dynamic: amax pass as for FP8, *global_scale = nvfp4_global_scale(amax), then the block recipe
// of fp8_nvfp4.h ("exact/TE", IEEE ops only). Three kernels on `stream`; no synchronization.
absl::Status nvfp4_quantize_dynamic(const Nvfp4QuantizeArgs& args, cudaStream_t stream);
// Static: the given device global scale; one kernel.
absl::Status nvfp4_quantize_static(const Nvfp4QuantizeArgs& args, cudaStream_t stream);

// ---- conversion checks (tests, start-up logging) ----

// Which cvt instructions the kAuto kernels use on the current device (probes the loaded binary
// with a one-thread kernel; synchronizes).
struct QuantizeHardware {
  bool e4m3_cvt = false;  // cvt.rn.satfinite.e4m3x2.f32 (sm_89+)
  bool e2m1_cvt = false;  // cvt.rn.satfinite.e2m1x2.f32 (sm_100a family)
};
absl::StatusOr<QuantizeHardware> quantize_hardware_conversions();

// Counts, over the f32 bit patterns [first, first + count), the inputs where the hardware
// conversion differs from the software one. counts (device, 6 x uint64, overwritten):
// [0] E4M3 mismatches, [1] E2M1 mismatches, [2] the smallest mismatching E4M3 pattern,
// [3] the smallest mismatching E2M1 pattern (2^32 when none), [4] / [5] the number of inputs
// checked for E4M3 / E2M1 (0 where that instruction is not compiled for the device).
absl::Status quantize_conversion_mismatches(uint64_t first, uint64_t count,
                                            unsigned long long* counts, cudaStream_t stream);

}  // namespace flux2::cuda
