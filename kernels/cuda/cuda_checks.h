// Operand checks shared by the CUDA backend's ops (validate, then launch): each
// returns InvalidArgument naming the op and the tensor. Internal to kernels/cuda; the error
// messages are asserted by tests/cuda/fast_path_fallback_test.cc and fp8_rows_test.cc.
#pragma once

#include "absl/strings/string_view.h"
#include "kernels/base/op_checks.h"
#include "kernels/base/status.h"

namespace flux2::cuda {

inline absl::Status check_bf16(absl::string_view op, absl::string_view name, const Tensor& t) {
  return check_tensor(op, name, t, Device::kCuda, DType::kBF16);
}

// b is bf16 with a's shape.
inline absl::Status check_same_bf16(absl::string_view op, const Tensor& a, absl::string_view name,
                                    const Tensor& b) {
  FLUX_RETURN_IF_ERROR(check_bf16(op, name, b));
  return check_matrix(op, name, b, a.rows(), a.cols());
}

// LayerNorm+modulate's input and its shift and scale vectors (bf16 [D] each).
inline absl::Status check_layer_norm_operands(absl::string_view op, const Tensor& x,
                                              const Tensor& shift, const Tensor& scale) {
  FLUX_RETURN_IF_ERROR(check_bf16(op, "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16(op, "shift", shift));
  FLUX_RETURN_IF_ERROR(check_vector(op, "shift", shift, x.cols()));
  FLUX_RETURN_IF_ERROR(check_bf16(op, "scale", scale));
  return check_vector(op, "scale", scale, x.cols());
}

// The weight and output of a projection of x: w bf16 [N, x.cols], y bf16 [x.rows, N].
inline absl::Status check_projection(absl::string_view op, const Tensor& x, const Tensor& w,
                                     const Tensor& y) {
  FLUX_RETURN_IF_ERROR(check_bf16(op, "w", w));
  FLUX_RETURN_IF_ERROR(check_matrix(op, "w", w, w.rows(), x.cols()));
  FLUX_RETURN_IF_ERROR(check_bf16(op, "y", y));
  return check_matrix(op, "y", y, x.rows(), w.rows());
}

// QK-norm + RoPE's head weights (bf16 [head_dim]) and its f32 tables cos, sin [x.rows, head_dim].
inline absl::Status check_qk_norm_rope_operands(absl::string_view op, const Tensor& x,
                                                int64_t head_dim, const Tensor& norm_weight,
                                                const Tensor& cos, const Tensor& sin) {
  FLUX_RETURN_IF_ERROR(check_bf16(op, "norm_weight", norm_weight));
  FLUX_RETURN_IF_ERROR(check_vector(op, "norm_weight", norm_weight, head_dim));
  FLUX_RETURN_IF_ERROR(check_tensor(op, "cos", cos, Device::kCuda, DType::kF32));
  FLUX_RETURN_IF_ERROR(check_tensor(op, "sin", sin, Device::kCuda, DType::kF32));
  FLUX_RETURN_IF_ERROR(check_matrix(op, "cos", cos, x.rows(), head_dim));
  return check_matrix(op, "sin", sin, x.rows(), head_dim);
}

}  // namespace flux2::cuda
