// CpuBackend dense ops: linear through OpenBLAS sgemm, and embedding lookup.
// Tested by tests/host/cpu_ops_test.cc against naive loops.
#include <cblas.h>

#include <cstring>

#include "kernels/base/parallel.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"

namespace flux2 {

absl::Status CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Tensor& y) {
  constexpr absl::string_view kOp = "linear";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "w", w));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "y", y));
  const int64_t m = x.rows(), k = x.cols(), n = w.rows();
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "w", w, n, k));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "y", y, m, n));
  if (bias.data() != nullptr) {
    FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "bias", bias));
    FLUX_RETURN_IF_ERROR(check_vector(kOp, "bias", bias, n));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x.data_as<float>(), static_cast<int>(x.row_stride()),
              w.data_as<float>(), static_cast<int>(w.row_stride()), 0.0f, y.data_as<float>(),
              static_cast<int>(y.row_stride()));
  if (bias.data() != nullptr) {
    const float* b = bias.data_as<float>();
    for (int64_t r = 0; r < m; ++r) {
      float* out = cpu::row(y, r);
      for (int64_t c = 0; c < n; ++c) out[c] += b[c];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  constexpr absl::string_view kOp = "embedding";
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "ids", ids, Device::kCpu, DType::kI32));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "table", table));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "out", out, ids.numel(), table.cols()));
  const int32_t* index = ids.data_as<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (index[i] < 0 || index[i] >= table.rows()) {
      return op_error(kOp, absl::StrCat("id ", index[i], " at position ", i,
                                        " is outside the table of ", table.rows(), " rows"));
    }
    std::memcpy(cpu::row(out, i), cpu::row(table, index[i]),
                static_cast<size_t>(table.cols()) * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace flux2
