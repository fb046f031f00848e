// CpuBackend dense ops: linear through OpenBLAS sgemm (at quality=high on FP8-emulated operands
// for registered weights, x per token or under a stored weight's static scale), LoRA's B products
// with their adds (lora_up_add), and embedding lookup. Tested by tests/host/cpu_ops_test.cc against
// naive loops.
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <optional>

#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/parallel.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_fp8.h"

namespace flux2 {

absl::Status CpuBackend::lora_up_add(const Tensor& y, const std::vector<LoraUpTerm>& terms) {
  constexpr absl::string_view kOp = "lora_up_add";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "y", y));
  FLUX_RETURN_IF_ERROR(check_lora_terms(kOp, y, terms));
  for (const LoraUpTerm& term : terms) {
    FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "t", term.t));
    FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "b", term.b));
    const int64_t m = y.rows(), n = term.b.rows(), r = term.t.cols();
    const Tensor out = y.col_slice(term.out_offset, n);
    parallel_for(m, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        float* o = cpu::row(out, row);
        const float* tr = cpu::row(term.t, row);
        for (int64_t c = 0; c < n; ++c) {
          const float* br = cpu::row(term.b, c);
          float sum = 0.0f;
          for (int64_t k = 0; k < r; ++k) sum += tr[k] * br[k];
          o[c] += sum * term.scale;  // the product rounded before the add (-ffp-contract=off)
        }
      }
    });
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::linear(const Tensor& x, const Weight& weight, const Tensor& bias,
                                const Tensor& y) {
  constexpr absl::string_view kOp = "linear";
  // quality=high with a registered weight and no bias (as the CUDA backend's FP8 GEMMs): the
  // weight's E4M3 copy and x quantized per token, or per tensor under the weight's static scale.
  const bool fp8 = request().quality == Quality::kHigh && weight.low_precision != nullptr &&
                   bias.data() == nullptr;
  Tensor w;  // a stored FP8 weight's values are dequantized for this product (weight_values)
  std::optional<float> input_scale;
  if (fp8) {
    const auto& low = static_cast<const cpu::CpuLowPrecision&>(*weight.low_precision);
    w = low.values;
    input_scale = low.input_scale;
  } else {
    FLUX_ASSIGN_OR_RETURN(w, weight_values(weight));
  }
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
  Tensor xq = x;
  if (fp8) {
    FLUX_ASSIGN_OR_RETURN(xq, empty(DType::kF32, {m, k}));
    if (input_scale) {
      cpu::quantize_static_e4m3(x, *input_scale, xq);
    } else {
      cpu::quantize_rows_e4m3(x, xq);
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, xq.data_as<float>(), static_cast<int>(xq.row_stride()),
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

absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> CpuBackend::add_fp8_weight(
    const Tensor& w) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("add_fp8_weight", "w", w));
  if (w.rank() != 2 || w.cols() % 16 != 0) {  // the CUDA backend's FP8 requirement, kept alike
    return op_error("add_fp8_weight",
                    absl::StrCat("w ", w.describe(), " is not an [N, K] with K % 16 == 0"));
  }
  auto low = std::make_shared<cpu::CpuLowPrecision>();
  FLUX_ASSIGN_OR_RETURN(low->values, empty(DType::kF32, {w.rows(), w.cols()}));
  cpu::quantize_rows_e4m3(w, low->values);
  return std::shared_ptr<const LowPrecisionWeight>(std::move(low));
}

absl::Status CpuBackend::dequantize_e4m3_rows(const Tensor& values, const Tensor& row_scales,
                                              const Tensor& out) {
  constexpr absl::string_view kOp = "dequantize_e4m3_rows";
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "values", values, Device::kCpu, DType::kF8E4M3));
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "row_scales", row_scales, Device::kCpu, DType::kF32));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  const int64_t n = values.rows(), k = values.cols();
  if (!values.contiguous() || !out.contiguous() || row_scales.numel() != n) {
    return op_error(kOp, absl::StrCat("values ", values.describe(), ", row_scales ",
                                      row_scales.describe(), " and out ", out.describe(),
                                      " must be contiguous [N, K], [N] and [N, K]"));
  }
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "out", out, n, k));
  const auto* codes = static_cast<const uint8_t*>(values.data());
  const float* scales = row_scales.data_as<float>();
  parallel_for(n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* o = cpu::row(out, r);
      // The product rounded once, as dequantize_fp8 (model/fp8_checkpoint.h) computes it.
      for (int64_t c = 0; c < k; ++c) o[c] = e4m3_to_f32(codes[r * k + c]) * scales[r];
    }
  });
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> CpuBackend::add_stored_fp8_weight(
    const Tensor& values, const Tensor& row_scales, std::optional<float> input_scale) {
  constexpr absl::string_view kOp = "add_stored_fp8_weight";
  if (values.rank() != 2 || values.cols() % 16 != 0) {  // as add_fp8_weight
    return op_error(
        kOp, absl::StrCat("values ", values.describe(), " is not an [N, K] with K % 16 == 0"));
  }
  if (input_scale && !(std::isfinite(*input_scale) && *input_scale > 0.0f)) {
    return op_error(kOp, absl::StrCat("input_scale ", *input_scale, " is not finite and > 0"));
  }
  auto low = std::make_shared<cpu::CpuLowPrecision>();
  low->input_scale = input_scale;
  FLUX_ASSIGN_OR_RETURN(low->values, empty(DType::kF32, {values.rows(), values.cols()}));
  FLUX_RETURN_IF_ERROR(dequantize_e4m3_rows(values, row_scales, low->values));
  return std::shared_ptr<const LowPrecisionWeight>(std::move(low));
}

}  // namespace flux2
