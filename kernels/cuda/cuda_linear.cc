// CudaBackend's projections: linear through cuBLASLt (bf16), LoRA's B products with their adds,
// alone or fused with the SwiGLU, the gated residual or q/k's QK-norm + RoPE after them (our own
// kernel, lora_up.h), and at quality=high the low-precision GEMMs of registered weights
// (add_fp8_weight: FP8, NVFP4 on Blackwell), with the activation quantized just before the GEMM or
// written in E4M3 by the op that produces it: LayerNorm+modulate and SwiGLU
// (layer_norm_modulate_linear, swiglu_linear), per token or, for a stored FP8 weight with a static
// activation scale (--fp8-input-scale static), per tensor under that scale in every one of them.
// Tested by tests/cuda/op_cases.cc (gpu_op_test), fp8_rows_test.cc and quality_high_test.cc.
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_checks.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequantize_e4m3.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/lora_down.h"
#include "kernels/cuda/lora_up.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/swiglu_fp8.h"

namespace flux2 {

using cuda::check_bf16;
using cuda::CudaPath;

const CudaLowPrecision* CudaBackend::low_precision_of(const Weight& w) const {
  if (request().quality != Quality::kHigh || w.low_precision == nullptr) return nullptr;
  // add_fp8_weight made it, so it is ours.
  return static_cast<const CudaLowPrecision*>(w.low_precision.get());
}

absl::Status CudaBackend::linear(const Tensor& x, const Weight& weight, const Tensor& bias,
                                 const Tensor& y) {
  const Tensor& w = weight.tensor;
  FLUX_RETURN_IF_ERROR(check_bf16("linear", "x", x));
  FLUX_RETURN_IF_ERROR(cuda::check_projection("linear", x, w, y));
  if (bias.data() != nullptr) {
    FLUX_RETURN_IF_ERROR(check_bf16("linear", "bias", bias));
    FLUX_RETURN_IF_ERROR(check_vector("linear", "bias", bias, w.rows()));
  }
  auto bf16 = [&]() -> absl::Status {
    // A stored FP8 weight: dequantized into a scratch buffer for this GEMM (weight_values).
    FLUX_ASSIGN_OR_RETURN(const Tensor values, weight_values(weight));
    OpProfileScope profile(*this, profile_category("gemm", x, w.rows()));
    return gemm_->linear(mat(x), mat(values), bias.data(), mat(y));
  };
  const CudaLowPrecision* low = low_precision_of(weight);
  if (low == nullptr) return bf16();
  return run_path(
      CudaPath::kFp8Linear, cuda::fp8_linear_unsupported(x.cols(), bias.data() != nullptr, nvfp4_),
      [&] { return linear_low_precision(x, *low, y); }, bf16);
}

namespace {

std::vector<cuda::LoraUp> lora_ups(const std::vector<LoraUpTerm>& terms) {
  std::vector<cuda::LoraUp> ups;
  ups.reserve(terms.size());
  for (const LoraUpTerm& term : terms) {
    ups.push_back({mat(term.t), mat(term.b), term.scale, term.out_offset});
  }
  return ups;
}

// check_bf16 of y and each term's operands, and that each term fits y.
absl::Status check_lora_up(absl::string_view op, const Tensor& y,
                           const std::vector<LoraUpTerm>& terms) {
  FLUX_RETURN_IF_ERROR(check_bf16(op, "y", y));
  for (const LoraUpTerm& term : terms) {
    FLUX_RETURN_IF_ERROR(check_bf16(op, "t", term.t));
    FLUX_RETURN_IF_ERROR(check_bf16(op, "b", term.b));
  }
  return check_lora_terms(op, y, terms);
}

}  // namespace

// Not a fast path: the CUDA backend's A products in every mode (as a GEMM algorithm is), so
// fast == eager bit for bit; operands the kernel does not take run one cuBLASLt GEMM per stack.
absl::Status CudaBackend::lora_down(const Tensor& x, const std::vector<Tensor>& stacks,
                                    const Tensor& t) {
  std::vector<cuda::Mat> a;
  for (const Tensor& stack : stacks) {
    if (stack.dtype() != DType::kBF16 || stack.rank() != 2) return Backend::lora_down(x, stacks, t);
    a.push_back(mat(stack));
  }
  if (x.dtype() != DType::kBF16 || t.dtype() != DType::kBF16 || x.rank() != 2 || t.rank() != 2 ||
      !cuda::lora_down_unsupported(mat(x), a, mat(t)).empty()) {
    return Backend::lora_down(x, stacks, t);
  }
  if (x.rows() == 0) return absl::OkStatus();  // an empty shard (sequence parallelism)
  OpProfileScope profile(*this, op_category("lora", "lora_down"));
  const int splits = cuda::lora_down_splits(x.rows(), x.cols(), multiprocessors_);
  Tensor partials;  // stream-ordered: freed after the kernels that use it
  if (splits > 1) {
    FLUX_ASSIGN_OR_RETURN(
        partials,
        scratch({splits * x.rows(), cuda::lora_down_partial_cols(t.cols())}, DType::kF32));
  }
  return cuda::lora_down_bf16(mat(x), a, mat(t), splits,
                              splits > 1 ? static_cast<float*>(partials.data()) : nullptr,
                              stream());
}

absl::Status CudaBackend::lora_up_add(const Tensor& y, const std::vector<LoraUpTerm>& terms) {
  FLUX_RETURN_IF_ERROR(check_lora_up("lora_up_add", y, terms));
  OpProfileScope profile(*this, op_category("lora", "lora_up_add"));
  return cuda::lora_up_add_bf16(mat(y), lora_ups(terms), stream());
}

absl::Status CudaBackend::lora_up_swiglu(const Tensor& y, const std::vector<LoraUpTerm>& terms,
                                         const Tensor& out) {
  constexpr absl::string_view kOp = "lora_up_swiglu";
  FLUX_RETURN_IF_ERROR(check_lora_up(kOp, y, terms));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "out", out));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "out", out, y.rows(), y.cols() / 2));
  return run_path(
      CudaPath::kLoraUpSwiglu, "",
      [&] {
        OpProfileScope profile(*this, op_category("lora", "lora_up_swiglu"));
        return cuda::lora_up_swiglu_bf16(mat(y), lora_ups(terms), mat(out), silu_math(), stream());
      },
      [&] { return Backend::lora_up_swiglu(y, terms, out); });
}

absl::Status CudaBackend::lora_up_gate_residual(const Tensor& y,
                                                const std::vector<LoraUpTerm>& terms,
                                                const Tensor& x, const Tensor& gate) {
  constexpr absl::string_view kOp = "lora_up_gate_residual";
  FLUX_RETURN_IF_ERROR(check_lora_up(kOp, y, terms));
  FLUX_RETURN_IF_ERROR(cuda::check_same_bf16(kOp, y, "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "gate", gate));
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "gate", gate, x.cols()));
  return run_path(
      CudaPath::kLoraUpGateResidual, "",
      [&] {
        OpProfileScope profile(*this, op_category("lora", "lora_up_gate_residual"));
        const cuda::Mat g{gate.data(), 1, gate.cols(), gate.cols()};
        return cuda::lora_up_gate_residual_bf16(mat(y), lora_ups(terms), mat(x), g, stream());
      },
      [&] { return Backend::lora_up_gate_residual(y, terms, x, gate); });
}

absl::Status CudaBackend::lora_up_qk_norm_rope(const Tensor& x,
                                               const std::vector<LoraUpTerm>& terms,
                                               int64_t head_dim, const Tensor& norm_weight,
                                               float eps, const Tensor& cos, const Tensor& sin,
                                               RopeStyle style) {
  constexpr absl::string_view kOp = "lora_up_qk_norm_rope";
  FLUX_RETURN_IF_ERROR(check_lora_up(kOp, x, terms));
  FLUX_RETURN_IF_ERROR(cuda::check_qk_norm_rope_operands(kOp, x, head_dim, norm_weight, cos, sin));
  return run_path(
      CudaPath::kLoraUpQkNormRope,
      cuda::lora_up_qk_norm_rope_unsupported(mat(x), head_dim, mat(cos), mat(sin)),
      [&] {
        OpProfileScope profile(*this, op_category("lora", "lora_up_qk_norm_rope"));
        return cuda::lora_up_qk_norm_rope_bf16(mat(x), lora_ups(terms), norm_weight.data(), eps,
                                               mat(cos), mat(sin), style, stream());
      },
      [&] {
        return Backend::lora_up_qk_norm_rope(x, terms, head_dim, norm_weight, eps, cos, sin, style);
      });
}

absl::Status CudaBackend::swiglu_linear(const Tensor& gate, const Tensor& up, const Tensor& x,
                                        const Weight& w, const Tensor& y,
                                        const GatedResidual* residual) {
  // quality=high with rowwise FP8: SwiGLU writes the GEMM's E4M3 input rows itself.
  const CudaLowPrecision* low = fp8_rows_wanted() ? low_precision_of(w) : nullptr;
  if (low == nullptr) return Backend::swiglu_linear(gate, up, x, w, y, residual);
  constexpr absl::string_view kOp = "swiglu_linear";
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "gate", gate));
  FLUX_RETURN_IF_ERROR(cuda::check_same_bf16(kOp, gate, "up", up));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "x", x));
  if (x.rows() != gate.rows() || x.cols() < gate.cols()) {
    return op_error(kOp,
                    absl::StrCat("x ", x.describe(), " must have gate's rows and end with its ",
                                 gate.cols(), " columns"));
  }
  FLUX_RETURN_IF_ERROR(cuda::check_projection(kOp, x, w.tensor, y));
  if (residual != nullptr) {
    FLUX_RETURN_IF_ERROR(cuda::check_same_bf16(kOp, y, "residual stream", residual->stream));
    FLUX_RETURN_IF_ERROR(check_bf16(kOp, "residual gate", residual->gate));
    FLUX_RETURN_IF_ERROR(check_vector(kOp, "residual gate", residual->gate, w.tensor.rows()));
  }
  const int64_t prefix = x.cols() - gate.cols();
  const cuda::Mat prefix_mat =
      prefix > 0 ? mat(x.col_slice(0, prefix)) : cuda::Mat{nullptr, x.rows(), 0, 0};
  return run_path(
      CudaPath::kSwigluFp8, cuda::swiglu_fp8_unsupported(x.cols(), prefix_mat, mat(gate), mat(up)),
      [&] { return swiglu_linear_fp8(gate, up, x, *low, y, residual); },
      [&] { return Backend::swiglu_linear(gate, up, x, w, y, residual); });
}

absl::Status CudaBackend::layer_norm_modulate_linear(const Tensor& x, const Tensor& shift,
                                                     const Tensor& scale, float eps,
                                                     const Tensor& normed, const Weight& w,
                                                     const Tensor& y) {
  return norm_linear(x, shift, scale, eps, normed, w, y, /*keep=*/false);
}

absl::Status CudaBackend::layer_norm_modulate_linear_keeping_normed(
    const Tensor& x, const Tensor& shift, const Tensor& scale, float eps, const Tensor& normed,
    const Weight& w, const Tensor& y) {
  return norm_linear(x, shift, scale, eps, normed, w, y, /*keep=*/true);
}

absl::Status CudaBackend::norm_linear(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                      float eps, const Tensor& normed, const Weight& w,
                                      const Tensor& y, bool keep) {
  auto eager = [&] {
    return keep ? Backend::layer_norm_modulate_linear_keeping_normed(x, shift, scale, eps, normed,
                                                                     w, y)
                : Backend::layer_norm_modulate_linear(x, shift, scale, eps, normed, w, y);
  };
  // quality=high with rowwise FP8: the norm writes the GEMM's E4M3 rows (and normed if kept).
  const CudaLowPrecision* low = fp8_rows_wanted() ? low_precision_of(w) : nullptr;
  if (low == nullptr) return eager();
  constexpr absl::string_view kOp = "layer_norm_modulate_linear";
  FLUX_RETURN_IF_ERROR(cuda::check_layer_norm_operands(kOp, x, shift, scale));
  FLUX_RETURN_IF_ERROR(cuda::check_same_bf16(kOp, x, "normed", normed));
  FLUX_RETURN_IF_ERROR(cuda::check_projection(kOp, x, w.tensor, y));
  return run_path(
      CudaPath::kLayerNormFp8, cuda::layer_norm_fp8_unsupported(mat(x)),
      [&] {
        return layer_norm_linear_fp8(x, shift, scale, eps, *low, y, keep ? &normed : nullptr);
      },
      eager);
}

absl::StatusOr<CudaLowPrecision> CudaBackend::quantize_low_precision(const Tensor& x) {
  const int64_t m = x.rows(), k = x.cols();
  CudaLowPrecision low;
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
    FLUX_RETURN_IF_ERROR(cuda::fp8_quantize_rows(args, stream()));  // one kernel, a scale per row
  } else {
    args.workspace = workspace.data();
    args.workspace_bytes = workspace.bytes();
    FLUX_RETURN_IF_ERROR(cuda::fp8_quantize_dynamic(args, stream()));
  }
  return low;
}

absl::StatusOr<CudaLowPrecision> CudaBackend::quantize_activation(const Tensor& x,
                                                                  const CudaLowPrecision& w) {
  if (w.static_scale() == nullptr) return quantize_low_precision(x);
  // add_stored_fp8_weight refuses a static scale on the NVFP4 path: this is FP8.
  const int64_t m = x.rows(), k = x.cols();
  CudaLowPrecision xq;
  FLUX_ASSIGN_OR_RETURN(xq.values, empty(DType::kF8E4M3, {m, k}));
  cuda::Fp8QuantizeArgs args;
  args.in.first = mat(x);
  args.out = xq.values.data();
  args.out_bytes = xq.values.bytes();
  args.scale = const_cast<float*>(w.static_scale());  // read only by fp8_quantize_static
  if (fp8_rowwise_) {  // the rowwise GEMM takes one activation scale per row: the static one
    FLUX_ASSIGN_OR_RETURN(xq.scale, empty(DType::kF32, {m}));
    args.row_scales = xq.scale.data_as<float>();
  } else {
    xq.scale = w.input_scale;
  }
  FLUX_RETURN_IF_ERROR(cuda::fp8_quantize_static(args, stream()));
  return xq;
}

absl::Status CudaBackend::linear_low_precision(const Tensor& x, const CudaLowPrecision& w,
                                               const Tensor& y) {
  CudaLowPrecision xq;
  {
    OpProfileScope profile(*this, profile_category("quantize", x, w.values.rows()));
    FLUX_ASSIGN_OR_RETURN(xq, quantize_activation(x, w));
  }
  return gemm_low_precision(x, xq, w, y);
}

absl::Status CudaBackend::gemm_low_precision(const Tensor& x, const CudaLowPrecision& xq,
                                             const CudaLowPrecision& w, const Tensor& y) {
  OpProfileScope profile(*this, profile_category("gemm", x, w.values.rows()));
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

absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> CudaBackend::add_fp8_weight(
    const Tensor& w) {
  FLUX_RETURN_IF_ERROR(check_tensor("add_fp8_weight", "w", w, Device::kCuda, DType::kBF16));
  if (w.rank() != 2 || !w.contiguous() || w.cols() % 16 != 0) {
    return op_error("add_fp8_weight", absl::StrCat("w ", w.describe(),
                                                   " is not a contiguous [N, K] with K % 16 == 0"));
  }
  // Per output channel when rowwise (the weight's rows are the GEMM's output channels).
  FLUX_ASSIGN_OR_RETURN(CudaLowPrecision low, quantize_low_precision(w));
  return std::shared_ptr<const LowPrecisionWeight>(
      std::make_shared<CudaLowPrecision>(std::move(low)));
}

absl::Status CudaBackend::dequantize_e4m3_rows(const Tensor& values, const Tensor& row_scales,
                                               const Tensor& out) {
  constexpr absl::string_view kOp = "dequantize_e4m3_rows";
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "values", values, Device::kCuda, DType::kF8E4M3));
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "row_scales", row_scales, Device::kCuda, DType::kF32));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "out", out));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "out", out, values.rows(), values.cols()));
  if (!values.contiguous() || row_scales.numel() != values.rows()) {
    return op_error(kOp,
                    absl::StrCat("values ", values.describe(), " must be contiguous with ",
                                 "one row scale per row (row_scales ", row_scales.describe(), ")"));
  }
  OpProfileScope profile(*this, op_category("quantize", "dequantize_e4m3_rows"));
  cuda::DequantizeE4m3Args args;
  args.values = values.data();
  args.row_scales = row_scales.data_as<float>();
  args.out = out.data();
  args.rows = values.rows();
  args.cols = values.cols();
  args.out_stride = out.row_stride();
  return cuda::dequantize_e4m3_rows_bf16(args, stream());
}

absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> CudaBackend::add_stored_fp8_weight(
    const Tensor& values, const Tensor& row_scales, std::optional<float> input_scale) {
  constexpr absl::string_view kOp = "add_stored_fp8_weight";
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "values", values, Device::kCuda, DType::kF8E4M3));
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "row_scales", row_scales, Device::kCuda, DType::kF32));
  if (values.rank() != 2 || !values.contiguous() || values.cols() % 16 != 0 ||
      row_scales.numel() != values.rows()) {
    return op_error(kOp, absl::StrCat("values ", values.describe(), " is not a contiguous [N, K] ",
                                      "with K % 16 == 0 and one row scale per row"));
  }
  if (input_scale && !(std::isfinite(*input_scale) && *input_scale > 0.0f)) {
    return op_error(kOp, absl::StrCat("input_scale ", *input_scale, " is not finite and > 0"));
  }
  if (input_scale && nvfp4_) {
    return op_error(kOp,
                    "a static FP8 activation scale (input_scale) needs the FP8 GEMM, and this "
                    "device runs quality=high in NVFP4");
  }
  auto low = std::make_shared<CudaLowPrecision>();
  if (fp8_rowwise_ && !nvfp4_) {
    // The GEMM scales each output channel: the file's codes and scales are the weight as they are.
    low->values = values;
    low->scale = row_scales;
    low->shares_stored = true;
  } else {
    // Per-tensor FP8 (one scale for the whole weight, which a fused q | k | v of separately
    // scaled parts does not have) or NVFP4: the dequantized values, quantized the backend's way.
    FLUX_ASSIGN_OR_RETURN(Tensor bf16, empty(DType::kBF16, {values.rows(), values.cols()}));
    FLUX_RETURN_IF_ERROR(dequantize_e4m3_rows(values, row_scales, bf16));
    FLUX_ASSIGN_OR_RETURN(*low, quantize_low_precision(bf16));
  }
  if (input_scale) {
    FLUX_ASSIGN_OR_RETURN(low->input_scale, empty(DType::kF32, {1}));
    FLUX_RETURN_IF_ERROR(upload(&*input_scale, DType::kF32, low->input_scale));
  }
  return std::shared_ptr<const LowPrecisionWeight>(std::move(low));
}

absl::Status CudaBackend::swiglu_linear_fp8(const Tensor& gate, const Tensor& up, const Tensor& x,
                                            const CudaLowPrecision& w, const Tensor& y,
                                            const GatedResidual* residual) {
  const int64_t m = x.rows(), k = x.cols(), prefix = k - gate.cols();
  CudaLowPrecision xq;
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
    args.static_scale = w.static_scale();  // null: each row's own scale
    FLUX_RETURN_IF_ERROR(cuda::swiglu_fp8_rows(args, stream()));
  }
  if (residual == nullptr) return gemm_low_precision(x, xq, w, y);
  // stream += gate ⊙ (x · wᵀ) in the GEMM: the gate times each output channel's scale, then the
  // epilogue adds the stream (beta = 1, in place). One rounding instead of gate_residual's three.
  const int64_t n = w.values.rows();
  OpProfileScope profile(*this, profile_category("gemm", x, n));
  FLUX_ASSIGN_OR_RETURN(Tensor gated, scratch({n}, DType::kF32));
  FLUX_RETURN_IF_ERROR(cuda::gated_channel_scales(w.scale.data_as<float>(), residual->gate.data(),
                                                  n, gated.data_as<float>(), stream()));
  const cuda::Mat x_mat{xq.values.data(), m, k, k}, w_mat{w.values.data(), n, k, k};
  return gemm_->linear_fp8(x_mat, xq.scale.data_as<float>(), w_mat, gated.data_as<float>(),
                           mat(residual->stream), /*rowwise=*/true, /*accumulate=*/true);
}

absl::Status CudaBackend::layer_norm_linear_fp8(const Tensor& x, const Tensor& shift,
                                                const Tensor& scale, float eps,
                                                const CudaLowPrecision& w, const Tensor& y,
                                                const Tensor* normed) {
  const int64_t m = x.rows(), k = x.cols();
  CudaLowPrecision xq;
  {
    OpProfileScope profile(*this, op_category("norm", "layer_norm_fp8"));
    FLUX_ASSIGN_OR_RETURN(xq.values, scratch({m, k}, DType::kF8E4M3));
    FLUX_ASSIGN_OR_RETURN(xq.scale, scratch({m, 1}, DType::kF32));
    const cuda::Mat sh{shift.data(), 1, k, k}, sc{scale.data(), 1, k, k};
    FLUX_RETURN_IF_ERROR(cuda::layer_norm_modulate_fused(
        mat(x), sh, sc, m, eps, normed != nullptr ? mat(*normed) : cuda::Mat{nullptr, m, k, k},
        stream(),
        cuda::Fp8Rows{static_cast<uint8_t*>(xq.values.data()), xq.scale.data_as<float>(),
                      w.static_scale()}));
  }
  return gemm_low_precision(x, xq, w, y);
}

std::map<std::string, int64_t> CudaBackend::gemm_plan_stats() const {
  const cuda::GemmPlanStats stats = gemm_->plan_stats();
  return {{"plans", stats.plans}, {"from_table", stats.from_table}, {"timed", stats.timed}};
}

absl::StatusOr<std::string> CudaBackend::export_gemm_algorithms(std::string_view existing) {
  return cuda::merge_gemm_algorithms(existing, gemm_->algorithms(device_name_));
}

}  // namespace flux2
