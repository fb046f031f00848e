// Bit-exact FP8 (OCP E4M3) and NVFP4 (E2M1 values, UE4M3 block scales, 128x4 swizzled scale layout)
// conversions and quantizer recipes for host and device, plus the plain-loop CPU references of the
// quantizers in kernels/cuda/quantize.h. Tested exhaustively by
// tests/host/quantize_reference_test.cc; the GPU kernels are held to these by
// tests/cuda/quantize_test.cc. C++17-clean: .cu files include it.
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>

#if !defined(FLUX_HOST_DEVICE)
#if defined(__CUDACC__)
#define FLUX_HOST_DEVICE __host__ __device__
#else
#define FLUX_HOST_DEVICE
#endif
#endif

#if defined(__CUDA_ARCH__)
#define FLUX_UNROLL _Pragma("unroll")
#else
#define FLUX_UNROLL
#endif

namespace flux2 {

constexpr float kE4M3Max = 448.0f;        // largest finite E4M3 (and UE4M3) value, 0x7E
constexpr float kE2M1Max = 6.0f;          // largest E2M1 value, code 0x7
constexpr int kNvfp4BlockSize = 16;       // elements along K sharing one UE4M3 scale
constexpr int kNvfp4ScaleTileRows = 128;  // the 128x4 swizzle: 128 rows ...
constexpr int kNvfp4ScaleTileBlocks = 4;  // ... by 4 K-blocks = one 512-byte tile

// ---- IEEE helpers: the same rounding on the host (SSE, -ffp-contract=off) and the device ----

FLUX_HOST_DEVICE inline uint32_t f32_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
#endif
}

FLUX_HOST_DEVICE inline float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof(v));
  return v;
#endif
}

// Correctly rounded (round-to-nearest-even) multiply and divide; never contracted or approximated.
FLUX_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

FLUX_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// max(|a|, |b|) by comparing magnitude bit patterns: exact, order-independent, and NaN-propagating
// (a NaN's magnitude bits exceed +inf's), so an amax reduction is deterministic in any order.
FLUX_HOST_DEVICE inline uint32_t abs_bits(float v) {
  return f32_bits(v) & 0x7fffffffu;
}
FLUX_HOST_DEVICE inline float abs_max(float a, float b) {
  const uint32_t x = abs_bits(a), y = abs_bits(b);
  return f32_from_bits(x > y ? x : y);
}

// ---- E4M3 (OCP FP8): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf; 0x7F/0xFF are NaN ----

// f32 -> E4M3 with round-to-nearest-even and saturation to ±448, as
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and cvt.rn.satfinite.e4m3x2.f32:
// |x| >= 448 and ±inf give ±448 (0x7E/0xFE); values below half the smallest subnormal (2^-10, a
// tie that rounds to the even 0) give signed zero; NaN of either sign gives 0x7F (the canonical
// NaN, as cuda_fp8.hpp's software path; whether cvt matches there is checked by
// tests/cuda/quantize_test.cc).
FLUX_HOST_DEVICE inline uint8_t f32_to_e4m3(float x) {
  const uint32_t bits = f32_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;                                 // NaN
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448, inf: satfinite
  uint32_t q, rem, half;
  if (abs >= 0x3c800000u) {  // >= 2^-6: an E4M3 normal; keep 3 of the 23 mantissa bits
    q = (((abs >> 23) - 120u) << 3) | ((abs >> 20) & 7u);  // exponent rebiased 127 -> 7
    rem = abs & 0xfffffu;
    half = 0x80000u;
  } else {  // E4M3 subnormal k * 2^-9, k = 0..7 (k = 8 after rounding is the smallest normal)
    const uint32_t e = abs >> 23;                     // biased f32 exponent
    if (e < 110u) return static_cast<uint8_t>(sign);  // < 2^-17, far below the 2^-10 tie
    const uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 141u - e;  // k = sig * 2^(e - 127 - 23 + 9); shift in [21, 31]
    q = sig >> shift;
    rem = sig & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  }
  if (rem > half || (rem == half && (q & 1u))) ++q;  // ties to even; a carry moves the exponent up
  return static_cast<uint8_t>(sign | q);
}

// E4M3 -> f32 (exact); 0x7F/0xFF give NaN.
FLUX_HOST_DEVICE inline float e4m3_to_f32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t e = (code >> 3) & 0xfu, m = code & 7u;
  if (e == 15u && m == 7u) return f32_from_bits(sign | 0x7fc00000u);
  if (e == 0u)
    return f32_from_bits(sign | f32_bits(static_cast<float>(m) * 0.001953125f));  // m * 2^-9
  return f32_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

// UE4M3 (the NVFP4 block scale): E4M3 without a sign. Values <= 0 (including -0) give 0, NaN gives
// 0x7F; positive values convert as f32_to_e4m3 (so for the non-negative scales the recipe produces,
// this equals the e4m3 cvt instruction).
FLUX_HOST_DEVICE inline uint8_t f32_to_ue4m3(float x) {
  if (x != x) return 0x7f;
  if (!(x > 0.0f)) return 0;
  return f32_to_e4m3(x);
}
FLUX_HOST_DEVICE inline float ue4m3_to_f32(uint8_t code) {
  return e4m3_to_f32(code & 0x7fu);
}

// ---- E2M1 (NVFP4 values): 1 sign, 2 exponent (bias 1), 1 mantissa bit; a 4-bit code ----

// f32 -> E2M1 with round-to-nearest-even and saturation to ±6: a threshold table on |x| (ties to
// the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4), the sign OR-ed in
// (small negatives give 0x8 = -0), ±inf -> ±6, NaN -> 0x7, as cuda_fp4.hpp's software path
// (__nv_cvt_float_to_fp4; tests/host/quantize_reference_test.cc compares the two).
FLUX_HOST_DEVICE inline uint8_t f32_to_e2m1(float x) {
  const uint32_t bits = f32_bits(x);
  const float a = f32_from_bits(bits & 0x7fffffffu);
  if (a != a) return 0x7;
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                   (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(((bits >> 28) & 0x8u) | static_cast<uint32_t>(code));
}

// E2M1 code (low nibble) -> f32 (exact): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
FLUX_HOST_DEVICE inline float e2m1_to_f32(uint8_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  const float magnitude =
      e == 0u ? 0.5f * static_cast<float>(m)
              : (1.0f + 0.5f * static_cast<float>(m)) * static_cast<float>(1u << (e - 1u));
  return (code & 8u) ? -magnitude : magnitude;
}

// Software conversions as a policy for the block recipe below; the CUDA kernels pass a policy
// that issues the cvt instructions where they are compiled (kernels/cuda/quantize.cu).
struct SoftwareCvt {
  FLUX_HOST_DEVICE static uint8_t e4m3(float x) { return f32_to_e4m3(x); }
  // Two E2M1 codes in one byte: `lo` (the lower-index element) in the low nibble.
  FLUX_HOST_DEVICE static uint8_t e2m1x2(float lo, float hi) {
    return static_cast<uint8_t>(f32_to_e2m1(lo) | (f32_to_e2m1(hi) << 4));
  }
};

// ---- per-tensor scales ----

// FP8 dequantization scale (stored x scale = value, cuBLASLt's A/B_SCALE_POINTER): amax / 448,
// 1 for an all-zero tensor; a NaN amax gives NaN and an infinite one inf (non-finite inputs are
// not supported: they make the whole output visibly non-finite).
FLUX_HOST_DEVICE inline float fp8_dequant_scale(float amax) {
  return amax == 0.0f ? 1.0f : div_rn(amax, kE4M3Max);
}

// The encode factor of a dequantization scale: 1 / scale (IEEE division, once per tensor or row).
FLUX_HOST_DEVICE inline float fp8_encode_factor(float scale) {
  return div_rn(1.0f, scale);
}

// FP8 value for `x` under dequantization scale `scale`: e4m3(x · fp8_encode_factor(scale)). A
// multiplication per element, not a division (which made the quantizers partly compute-bound);
// the factor is within half an ulp of 1 / scale, and satfinite clamps the amax's 448 · (1 ± 2^-24).
template <typename Cvt = SoftwareCvt>
FLUX_HOST_DEVICE inline uint8_t fp8_quantize_value(float x, float scale) {
  return Cvt::e4m3(mul_rn(x, fp8_encode_factor(scale)));
}

// FP8 value for `x` under a static activation scale (a checkpoint's input_scale, a dequantization
// scale: value = code x scale): e4m3(x / scale) with one IEEE division, round-to-nearest-even and
// saturation to ±448, as ONNX/TensorRT QuantizeLinear defines static FP8 quantization. A division
// per element (not fp8_quantize_value's product with the reciprocal, which can differ by an ulp
// before the conversion): the checkpoint's scale is applied exactly as its calibration meant.
template <typename Cvt = SoftwareCvt>
FLUX_HOST_DEVICE inline uint8_t fp8_quantize_static_value(float x, float scale) {
  return Cvt::e4m3(div_rn(x, scale));
}

// NVFP4 global (encode) scale gs = 448 * 6 / amax (FlashInfer's make_nvfp4_global_scale), so the
// block holding the tensor's amax gets the scale byte 448; FLT_MAX for an all-zero tensor or when
// the quotient overflows; NaN stays NaN. Dequantization: x = e2m1 * sf / gs.
FLUX_HOST_DEVICE inline float nvfp4_global_scale(float amax) {
  if (amax == 0.0f) return FLT_MAX;
  const float gs = div_rn(kE4M3Max * kE2M1Max, amax);
  return gs > FLT_MAX ? FLT_MAX : gs;
}

// ---- the NVFP4 block recipe: "exact / TransformerEngine", IEEE ops only ----
// (FlashInfer's and TensorRT-LLM's quantizer with FP4 fast math disabled, and TransformerEngine's
// reference; their default recipe uses rcp.approx.ftz, which a CPU cannot reproduce bit for bit)
//   SF       = vmax * (gs * (1/6))                       (vmax = max |x| over the 16 values)
//   sf8      = e4m3(SF)  (RNE, satfinite; SF >= 0 so it is the UE4M3 scale byte)
//   outScale = fminf(1 / (float(sf8) * (1 / gs)), FLT_MAX)
//   code_i   = e2m1(x_i * outScale)
// Our one deviation, for the degenerate case the recipe leaves to the conversion's inf/NaN
// handling (vmax > 0 with SF below about 2^-10 rounds sf8 to 0, and outScale to inf): when
// sf8 == 0 every code is 0 (the block dequantizes to 0 either way).
constexpr float kOneSixth = 0x1.555556p-3f;  // 1/6 correctly rounded to f32 (0x3E2AAAAB)
static_assert(kOneSixth == 1.0f / 6.0f, "1/6 must be the correctly rounded f32");

FLUX_HOST_DEVICE inline float nvfp4_block_scale_value(float vmax, float global_scale) {
  return mul_rn(vmax, mul_rn(global_scale, kOneSixth));
}

FLUX_HOST_DEVICE inline float nvfp4_out_scale(uint8_t sf8, float global_scale) {
  const float out = div_rn(1.0f, mul_rn(e4m3_to_f32(sf8), div_rn(1.0f, global_scale)));
  return out < FLT_MAX ? out : FLT_MAX;  // = fminf(out, FLT_MAX), NaN included
}

// Quantizes 16 values: writes 8 packed bytes (element 2i in the low nibble of byte i) and returns
// the UE4M3 scale byte.
template <typename Cvt = SoftwareCvt>
FLUX_HOST_DEVICE inline uint8_t nvfp4_quantize_block16(const float x[16], float global_scale,
                                                       uint8_t packed[8]) {
  float vmax = 0.0f;
  FLUX_UNROLL
  for (int i = 0; i < 16; ++i) vmax = abs_max(vmax, x[i]);
  const uint8_t sf8 = Cvt::e4m3(nvfp4_block_scale_value(vmax, global_scale));
  if (sf8 == 0) {
    for (int i = 0; i < 8; ++i) packed[i] = 0;
    return 0;
  }
  const float out_scale = nvfp4_out_scale(sf8, global_scale);
  FLUX_UNROLL
  for (int i = 0; i < 8; ++i) {
    packed[i] = Cvt::e2m1x2(mul_rn(x[2 * i], out_scale), mul_rn(x[2 * i + 1], out_scale));
  }
  return sf8;
}

// ---- the 128x4 swizzled scale-factor layout (cuBLASLt VEC16_UE4M3; TensorRT-LLM's
// get_sf_out_offset_128x4): 512-byte tiles of 128 rows x 4 K-blocks, row tiles outer, indexed
// [row % 32][(row % 128) / 32][K-block % 4] inside a tile; the padding is written as 0 ----

// Rows padded to a multiple of 128, K-blocks (cols / 16) padded to a multiple of 4.
FLUX_HOST_DEVICE inline int64_t nvfp4_scale_padded_rows(int64_t rows) {
  return (rows + kNvfp4ScaleTileRows - 1) / kNvfp4ScaleTileRows * kNvfp4ScaleTileRows;
}
FLUX_HOST_DEVICE inline int64_t nvfp4_scale_padded_blocks(int64_t cols) {
  const int64_t blocks = (cols + kNvfp4BlockSize - 1) / kNvfp4BlockSize;
  return (blocks + kNvfp4ScaleTileBlocks - 1) / kNvfp4ScaleTileBlocks * kNvfp4ScaleTileBlocks;
}
// Bytes of the scale tensor of a [rows, cols] NVFP4 matrix (padding included, written as 0).
FLUX_HOST_DEVICE inline int64_t nvfp4_scale_bytes(int64_t rows, int64_t cols) {
  return nvfp4_scale_padded_rows(rows) * nvfp4_scale_padded_blocks(cols);
}

// Byte offset of the scale of row m, K-block kb; k_tiles = padded blocks / 4:
// (m/128)*(k_tiles*512) + (kb/4)*512 + (m%32)*16 + ((m%128)/32)*4 + kb%4.
FLUX_HOST_DEVICE inline int64_t nvfp4_scale_offset(int64_t m, int64_t kb, int64_t k_tiles) {
  return (m / 128) * (k_tiles * 512) + (kb / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 +
         kb % 4;
}

// ---- CPU references of the kernels/cuda/quantize.h launchers (plain loops, software conversions)
// ----

// A bf16 matrix on the host as raw bits: [rows, cols], `stride` elements between row starts.
struct Bf16HostView {
  const uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
};

inline float bf16_bits_value(uint16_t bits) {
  return f32_from_bits(static_cast<uint32_t>(bits) << 16);
}

// Element (r, c) of the column concatenation [first | second] (second may have 0 columns).
inline float concat_value(const Bf16HostView& first, const Bf16HostView& second, int64_t r,
                          int64_t c) {
  return c < first.cols ? bf16_bits_value(first.data[r * first.stride + c])
                        : bf16_bits_value(second.data[r * second.stride + (c - first.cols)]);
}

// max |x| over [first | second] (NaN-propagating, see abs_max).
inline float reference_amax(const Bf16HostView& first, const Bf16HostView& second) {
  float amax = 0.0f;
  const int64_t cols = first.cols + second.cols;
  for (int64_t r = 0; r < first.rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) amax = abs_max(amax, concat_value(first, second, r, c));
  }
  return amax;
}

// FP8 per-tensor quantization of [first | second] under dequantization scale `scale`:
// out [rows, cols] E4M3, contiguous.
inline void reference_fp8_quantize(const Bf16HostView& first, const Bf16HostView& second,
                                   float scale, uint8_t* out) {
  const int64_t cols = first.cols + second.cols;
  for (int64_t r = 0; r < first.rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = fp8_quantize_value(concat_value(first, second, r, c), scale);
  }
}

// FP8 static quantization of [first | second] under a given activation scale:
// out[r, c] = fp8_quantize_static_value(x[r, c], scale), E4M3 [rows, cols] contiguous.
inline void reference_fp8_quantize_static(const Bf16HostView& first, const Bf16HostView& second,
                                          float scale, uint8_t* out) {
  const int64_t cols = first.cols + second.cols;
  for (int64_t r = 0; r < first.rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = fp8_quantize_static_value(concat_value(first, second, r, c), scale);
  }
}

// FP8 per-row (per output channel) quantization: scales[r] = fp8_dequant_scale(max |x[r, :]|).
inline void reference_fp8_quantize_rows(const Bf16HostView& x, float* scales, uint8_t* out) {
  const Bf16HostView none;
  for (int64_t r = 0; r < x.rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < x.cols; ++c) amax = abs_max(amax, concat_value(x, none, r, c));
    scales[r] = fp8_dequant_scale(amax);
    for (int64_t c = 0; c < x.cols; ++c)
      out[r * x.cols + c] = fp8_quantize_value(concat_value(x, none, r, c), scales[r]);
  }
}

// NVFP4 quantization of [first | second] (cols a multiple of 16) under global scale gs:
// packed [rows, cols / 2] bytes, scales nvfp4_scale_bytes(rows, cols) bytes (padding zeroed).
inline void reference_nvfp4_quantize(const Bf16HostView& first, const Bf16HostView& second,
                                     float global_scale, uint8_t* packed, uint8_t* scales) {
  const int64_t rows = first.rows, cols = first.cols + second.cols;
  const int64_t k_tiles = nvfp4_scale_padded_blocks(cols) / kNvfp4ScaleTileBlocks;
  std::memset(scales, 0, static_cast<size_t>(nvfp4_scale_bytes(rows, cols)));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kb = 0; kb < cols / kNvfp4BlockSize; ++kb) {
      float x[16];
      for (int i = 0; i < 16; ++i) x[i] = concat_value(first, second, r, kb * 16 + i);
      scales[nvfp4_scale_offset(r, kb, k_tiles)] =
          nvfp4_quantize_block16(x, global_scale, packed + r * (cols / 2) + kb * 8);
    }
  }
}

}  // namespace flux2
