// Host-side helpers for the CPU backend's loops: row pointers into strided f32 matrices and the
// common "f32 on the CPU" precondition. Included only by kernels/cpu/*.cc.
#pragma once

#include <algorithm>
#include "absl/strings/string_view.h"

#include "kernels/base/op_checks.h"
#include "kernels/base/status.h"
#include "kernels/base/tensor.h"

namespace flux2::cpu {

inline float* row(const Tensor& t, int64_t r) {
  return t.data_as<float>() + r * t.row_stride();
}

inline absl::Status check_f32(absl::string_view op, absl::string_view name, const Tensor& t) {
  return check_tensor(op, name, t, Device::kCpu, DType::kF32);
}

// Rows of `t` are processed in chunks of at least this many elements per thread.
inline int64_t rows_per_chunk(const Tensor& t, int64_t min_elements = 16384) {
  return std::max<int64_t>(1, min_elements / std::max<int64_t>(1, t.cols()));
}

}  // namespace flux2::cpu
