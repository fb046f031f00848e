// CudaBackend's low-precision GEMMs at quality=high: weights quantized once (add_fp8_weight),
// activations quantized just before the GEMM or taken from the producer's hand-off (E4M3 rows or
// row maxima), and LayerNorm+modulate or SwiGLU writing the E4M3 rows of their GEMM's input
// themselves (layer_norm_modulate_linear, swiglu_linear).
// Tested by tests/cuda/fp8_handoff_test.cc, fp8_rows_test.cc and quality_high_test.cc.
#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/op_checks.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/swiglu_fp8.h"

namespace flux2 {
namespace {

// quality=high: an FP8 GEMM whose input's producer left its E4M3 copy or its row maxima.
FastPath& fp8_handoff_path() {
  static FastPath path("fp8_amax_handoff");
  return path;
}

}  // namespace

absl::StatusOr<CudaBackend::Fp8Weight> CudaBackend::quantize_low_precision(const Tensor& x) {
  const int64_t m = x.rows(), k = x.cols();
  Fp8Weight low;
  FLUX_ASSIGN_OR_RETURN(Tensor workspace, scratch({cuda::kQuantizeWorkspaceBytes}, DType::kU8));
  if (nvfp4_) {  // Blackwell: packed E2M1 values, swizzled UE4M3 block scales, a global scale
    FLUX_ASSIGN_OR_RETURN(low.values, empty(DType::kU8, {m, k / 2}));
    FLUX_ASSIGN_OR_RETURN(low.scale, empty(DType::kU8, {nvfp4_scale_bytes(m, k)}));
    FLUX_ASSIGN_OR_RETURN(low.global, empty(DType::kF32, {1}));
    cuda::Nvfp4QuantizeArgs args;
    args.in.first = mat(x);
    args.out = low.values.data();
    args.out_bytes = low.values.bytes();
    args.scales = low.scale.data();
    args.scales_bytes = low.scale.bytes();
    args.global_scale = low.global.data_as<float>();
    args.workspace = workspace.data();
    args.workspace_bytes = workspace.bytes();
    FLUX_RETURN_IF_ERROR(cuda::nvfp4_quantize_dynamic(args, stream()));
    return low;
  }
  FLUX_ASSIGN_OR_RETURN(low.values, empty(DType::kF8E4M3, {m, k}));
  FLUX_ASSIGN_OR_RETURN(low.scale, empty(DType::kF32, {fp8_rowwise_ ? m : 1}));
  cuda::Fp8QuantizeArgs args;
  args.in.first = mat(x);
  args.out = low.values.data();
  args.out_bytes = low.values.bytes();
  args.scale = low.scale.data_as<float>();
  if (fp8_rowwise_) {
    FLUX_RETURN_IF_ERROR(cuda::fp8_quantize_rows(args, stream()));  // one kernel, one scale per row
  } else {
    args.workspace = workspace.data();
    args.workspace_bytes = workspace.bytes();
    FLUX_RETURN_IF_ERROR(cuda::fp8_quantize_dynamic(args, stream()));
  }
  return low;
}

absl::Status CudaBackend::linear_low_precision(const Tensor& x, const Fp8Weight& w,
                                               const Tensor& y) {
  const int64_t m = x.rows(), k = x.cols();
  Fp8Weight xq;
  {
    OpProfileScope profile(*this, profile_category("quantize", x, w.source));
    const std::optional<int64_t> first_row = incoming_rows(x);
    if (first_row && incoming_->fp8.data() != nullptr) {
      // The producer wrote x in E4M3 itself: no quantization at all.
      xq.values = incoming_->fp8.row_slice(*first_row, m);
      xq.scale = incoming_->fp8_scale;
      fp8_handoff_path().count_invocation();
      handoff_ = incoming_;  // another row range of the same region may follow
    } else if (first_row && incoming_->row_amax.data() != nullptr) {
      // The producer left x's row maxima: scale from them, then one quantize pass.
      const auto* row_amax = static_cast<const uint32_t*>(incoming_->row_amax.data()) + *first_row;
      FLUX_ASSIGN_OR_RETURN(xq.values, scratch({m, k}, DType::kF8E4M3));
      FLUX_ASSIGN_OR_RETURN(xq.scale, scratch({1}, DType::kF32));
      FLUX_RETURN_IF_ERROR(
          cuda::fp8_scale_from_row_amax(row_amax, m, xq.scale.data_as<float>(), stream()));
      cuda::Fp8QuantizeArgs args;
      args.in.first = mat(x);
      args.out = xq.values.data();
      args.out_bytes = xq.values.bytes();
      args.scale = xq.scale.data_as<float>();
      FLUX_RETURN_IF_ERROR(cuda::fp8_quantize_static(args, stream()));
      fp8_handoff_path().count_invocation();
      handoff_ = incoming_;  // another row range of the same region may follow
    } else {
      FLUX_ASSIGN_OR_RETURN(xq, quantize_low_precision(x));
    }
  }
  return gemm_low_precision(x, xq, w, y);
}

absl::Status CudaBackend::gemm_low_precision(const Tensor& x, const Fp8Weight& xq,
                                             const Fp8Weight& w, const Tensor& y) {
  OpProfileScope profile(*this, profile_category("gemm", x, w.source));
  const int64_t m = x.rows(), k = x.cols();
  const cuda::Mat x_mat{xq.values.data(), m, k, k}, w_mat{w.values.data(), w.values.rows(), k, k};
  if (nvfp4_) {
    FLUX_ASSIGN_OR_RETURN(Tensor alpha, scratch({1}, DType::kF32));  // 1 / (gs_x · gs_w)
    FLUX_RETURN_IF_ERROR(cuda::inverse_product(
        xq.global.data_as<float>(), w.global.data_as<float>(), alpha.data_as<float>(), stream()));
    return gemm_->linear_nvfp4(x_mat, xq.scale.data(), w_mat, w.scale.data(),
                               alpha.data_as<float>(), mat(y));
  }
  return gemm_->linear_fp8(x_mat, xq.scale.data_as<float>(), w_mat, w.scale.data_as<float>(),
                           mat(y), fp8_rowwise_);
}

absl::StatusOr<int64_t> CudaBackend::add_fp8_weight(const Tensor& w) {
  FLUX_RETURN_IF_ERROR(check_tensor("add_fp8_weight", "w", w, Device::kCuda, DType::kBF16));
  if (fp8_weights_.count(w.data())) return int64_t{0};
  if (w.rank() != 2 || !w.contiguous() || w.cols() % 16 != 0) {
    return op_error("add_fp8_weight", absl::StrCat("w ", w.describe(),
                                                   " is not a contiguous [N, K] with K % 16 == 0"));
  }
  FLUX_ASSIGN_OR_RETURN(Fp8Weight low,
                        quantize_low_precision(w));  // per output channel when rowwise
  low.source = w;
  const int64_t bytes = low.values.bytes() + low.scale.bytes();
  fp8_weights_.emplace(w.data(), std::move(low));
  return bytes;
}

absl::Status CudaBackend::swiglu_linear_fp8(const Tensor& gate, const Tensor& up, const Tensor& x,
                                            const Fp8Weight& w, const Tensor& y,
                                            const GatedResidual* residual) {
  const int64_t m = x.rows(), k = x.cols(), prefix = k - gate.cols();
  Fp8Weight xq;
  {
    OpProfileScope profile(*this, op_category("elementwise", "swiglu_fp8"));
    FLUX_ASSIGN_OR_RETURN(xq.values, scratch({m, k}, DType::kF8E4M3));
    FLUX_ASSIGN_OR_RETURN(xq.scale, scratch({m, 1}, DType::kF32));
    cuda::SwigluFp8Rows args;
    args.prefix = prefix > 0 ? mat(x.col_slice(0, prefix)) : cuda::Mat{nullptr, m, 0, 0};
    args.gate = mat(gate);
    args.up = mat(up);
    args.math = silu_math();
    args.out = xq.values.data();
    args.out_bytes = xq.values.bytes();
    args.row_scales = xq.scale.data_as<float>();
    FLUX_RETURN_IF_ERROR(cuda::swiglu_fp8_rows(args, stream()));
  }
  if (residual == nullptr) return gemm_low_precision(x, xq, w, y);
  // stream += gate ⊙ (x · wᵀ) in the GEMM: the gate times each output channel's scale, then the
  // epilogue adds the stream (beta = 1, in place). One rounding instead of gate_residual's three.
  OpProfileScope profile(*this, profile_category("gemm", x, w.source));
  const int64_t n = w.values.rows();
  FLUX_ASSIGN_OR_RETURN(Tensor gated, scratch({n}, DType::kF32));
  FLUX_RETURN_IF_ERROR(cuda::gated_channel_scales(w.scale.data_as<float>(), residual->gate.data(),
                                                  n, gated.data_as<float>(), stream()));
  const cuda::Mat x_mat{xq.values.data(), m, k, k}, w_mat{w.values.data(), n, k, k};
  return gemm_->linear_fp8(x_mat, xq.scale.data_as<float>(), w_mat, gated.data_as<float>(),
                           mat(residual->stream), /*rowwise=*/true, /*accumulate=*/true);
}

absl::Status CudaBackend::layer_norm_linear_fp8(const Tensor& x, const Tensor& shift,
                                                const Tensor& scale, float eps, const Fp8Weight& w,
                                                const Tensor& y) {
  const int64_t m = x.rows(), k = x.cols();
  Fp8Weight xq;
  {
    OpProfileScope profile(*this, op_category("norm", "layer_norm_fp8"));
    FLUX_ASSIGN_OR_RETURN(xq.values, scratch({m, k}, DType::kF8E4M3));
    FLUX_ASSIGN_OR_RETURN(xq.scale, scratch({m, 1}, DType::kF32));
    const cuda::Mat sh{shift.data(), 1, k, k}, sc{scale.data(), 1, k, k};
    FLUX_RETURN_IF_ERROR(cuda::layer_norm_modulate_fused(
        mat(x), sh, sc, m, eps, cuda::Mat{nullptr, m, k, k}, stream(), nullptr,
        cuda::Fp8Rows{static_cast<uint8_t*>(xq.values.data()), nullptr,
                      xq.scale.data_as<float>()}));
  }
  return gemm_low_precision(x, xq, w, y);
}

}  // namespace flux2
