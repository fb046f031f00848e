// Element types shared by checkpoints, tensors and backends, and exact bf16 <-> f32 conversion.
// Tested by tests/host/tensor_test.cc (DTypeTest).
#pragma once

#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace flux2 {

enum class DType : uint8_t {
  kF32,     // IEEE binary32
  kBF16,    // bfloat16: the top half of a binary32
  kF16,     // IEEE binary16
  kF8E4M3,  // OCP FP8 E4M3 (finite, max 448)
  kF8E5M2,  // OCP FP8 E5M2
  kI64,     // int64 (token ids in goldens)
  kI32,     // int32 (token ids on a backend)
  kU8,      // uint8 (images)
  kBool,    // one byte per value
};

// Bytes per element.
int dtype_size(DType dtype);
// Safetensors spelling: "F32", "BF16", ...
absl::string_view dtype_name(DType dtype);
// Parses a safetensors dtype string; an unknown one is an InvalidArgument naming it.
absl::StatusOr<DType> dtype_from_name(absl::string_view name);

// bf16 <-> f32 with round-to-nearest-even, as c10::BFloat16 does (NaN stays NaN).
inline uint16_t f32_to_bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float bf16_bits_to_f32(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Rounds an f32 to the nearest bf16 value, returned as f32.
inline float round_to_bf16(float value) {
  return bf16_bits_to_f32(f32_to_bf16_bits(value));
}

// IEEE binary16 -> f32 (exact).
float f16_bits_to_f32(uint16_t bits);

// Widens `count` elements of `dtype` at `src` into f32 (F32, BF16, F16, I64, I32, U8 only); `src`
// may be unaligned (safetensors data at any offset).
void widen_to_f32(DType dtype, const void* src, int64_t count, float* dst);

}  // namespace flux2
