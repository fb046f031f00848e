// Precondition helpers shared by backend launchers (validate, then launch): each returns
// InvalidArgument naming the op and the offending tensor instead of launching.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/lora_up_term.h"
#include "kernels/base/tensor.h"

namespace flux2 {

inline absl::Status op_error(absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

// `t` lives on `device` and has `dtype`.
inline absl::Status check_tensor(absl::string_view op, absl::string_view name, const Tensor& t,
                                 Device device, DType dtype) {
  if (t.data() == nullptr && t.numel() != 0)
    return op_error(op, absl::StrCat(name, " is undefined"));
  if (t.device() != device || t.dtype() != dtype) {
    return op_error(op, absl::StrCat(name, " is ", t.describe(), ", expected ", dtype_name(dtype),
                                     " on ", device_name(device)));
  }
  return absl::OkStatus();
}

// `t` is a [rows, cols] matrix.
inline absl::Status check_matrix(absl::string_view op, absl::string_view name, const Tensor& t,
                                 int64_t rows, int64_t cols) {
  if (t.rows() != rows || t.cols() != cols) {
    return op_error(
        op, absl::StrCat(name, " is ", t.describe(), ", expected [", rows, ", ", cols, "]"));
  }
  return absl::OkStatus();
}

// `t` is one contiguous row of `cols` values (a [cols] or [1, cols] vector).
inline absl::Status check_vector(absl::string_view op, absl::string_view name, const Tensor& t,
                                 int64_t cols) {
  if (t.numel() != cols || t.cols() != cols) {
    return op_error(op, absl::StrCat(name, " is ", t.describe(), ", expected [", cols, "]"));
  }
  return absl::OkStatus();
}

// Each LoRA term fits y [M, N] (Backend::lora_up_add): t [M, r], b [out, r], its columns
// [out_offset, out_offset + out) inside y's.
inline absl::Status check_lora_terms(absl::string_view op, const Tensor& y,
                                     const std::vector<LoraUpTerm>& terms) {
  for (size_t i = 0; i < terms.size(); ++i) {
    const LoraUpTerm& term = terms[i];
    const std::string name = absl::StrCat("terms[", i, "]");
    if (term.t.rows() != y.rows() || term.b.cols() != term.t.cols()) {
      return op_error(op,
                      absl::StrCat(name, ": t ", term.t.describe(), " and b ", term.b.describe(),
                                   " do not make y ", y.describe(), " += t · bᵀ"));
    }
    if (term.out_offset < 0 || term.out_offset + term.b.rows() > y.cols()) {
      return op_error(op,
                      absl::StrCat(name, ": columns [", term.out_offset, ", ",
                                   term.out_offset + term.b.rows(), ") outside y ", y.describe()));
    }
  }
  return absl::OkStatus();
}

}  // namespace flux2
