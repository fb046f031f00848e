// Element types and conversions; see dtype.h. Tested by tests/host/tensor_test.cc (DTypeTest).
#include "kernels/base/dtype.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2 {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  int size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4},        {DType::kBF16, "BF16", 2},      {DType::kF16, "F16", 2},
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1}, {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},        {DType::kU8, "U8", 1},          {DType::kBool, "BOOL", 1},
};

const DTypeInfo& info(DType dtype) {
  for (const DTypeInfo& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  FLUX_CHECK(false && "unknown DType");
  return kDTypes[0];
}

}  // namespace

int dtype_size(DType dtype) {
  return info(dtype).size;
}

absl::string_view dtype_name(DType dtype) {
  return info(dtype).name;
}

absl::StatusOr<DType> dtype_from_name(absl::string_view name) {
  for (const DTypeInfo& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

float f16_bits_to_f32(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u;
  const int exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

namespace {

// Element i of `src` as T: a memcpy load, so the data may sit at any address (a safetensors data
// section starts at an arbitrary offset; UBSan flagged the typed loads at odd offsets).
template <typename T>
T load_unaligned(const void* src, int64_t i) {
  T value;
  std::memcpy(&value, static_cast<const char*>(src) + i * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return value;
}

}  // namespace

void widen_to_f32(DType dtype, const void* src, int64_t count, float* dst) {
  if (count <= 0) return;  // an empty tensor's data may be null: memcpy must not see it
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i)
        dst[i] = bf16_bits_to_f32(load_unaligned<uint16_t>(src, i));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i)
        dst[i] = f16_bits_to_f32(load_unaligned<uint16_t>(src, i));
      return;
    case DType::kI64:
      for (int64_t i = 0; i < count; ++i)
        dst[i] = static_cast<float>(load_unaligned<int64_t>(src, i));
      return;
    case DType::kI32:
      for (int64_t i = 0; i < count; ++i)
        dst[i] = static_cast<float>(load_unaligned<int32_t>(src, i));
      return;
    case DType::kU8: {
      const auto* in = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = in[i];
      return;
    }
    default:
      FLUX_CHECK(false && "widen_to_f32: unsupported dtype");
  }
}

}  // namespace flux2
