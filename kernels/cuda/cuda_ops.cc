// CudaBackend compute ops: precondition checks, fast-path dispatch (fused kernel or its eager
// chain, with fallbacks counted by reason) and the library calls. Tested by tests/cuda/.
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/op_checks.h"
#include "kernels/cuda/attention_fallback.h"
#include "kernels/cuda/attention_fp8_operands.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/image_ops.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/softmax.h"
#include "kernels/cuda/swiglu_fp8.h"

namespace flux2 {
namespace {

// The fused fast paths of the lossless path (each proven bit-identical to its eager chain by
// tests/cuda/fused_ops_test.cc) and the library fast path for attention.
FastPath& gate_residual_path() {
  static FastPath path("gate_residual");
  return path;
}
FastPath& swiglu_path() {
  static FastPath path("swiglu");
  return path;
}
FastPath& layer_norm_modulate_path() {
  static FastPath path("layer_norm_modulate");
  return path;
}
FastPath& qk_norm_rope_path() {
  static FastPath path("qk_norm_rope");
  return path;
}
// Writing attention / SwiGLU outputs straight into a column range of a wider buffer (the single
// block's concatenation) instead of a separate buffer plus a copy.
FastPath& token_concat_path() {
  static FastPath path("token_concat");
  return path;
}
FastPath& cudnn_attention_path() {
  static FastPath path("cudnn_attention");
  return path;
}
// quality=high: our FP8 flash attention (flash_attention_fp8.cu); falls back to bf16 cuDNN.
FastPath& flash_fp8_attention_path() {
  static FastPath path("flash_attention_fp8");
  return path;
}
// quality=high, rowwise FP8: SwiGLU writing the E4M3 rows of the GEMM after it (swiglu_linear).
FastPath& swiglu_fp8_path() {
  static FastPath path("swiglu_fp8");
  return path;
}
// quality=high, rowwise FP8: LayerNorm+modulate writing only the E4M3 rows of the GEMM after it
// (layer_norm_modulate_linear).
FastPath& layer_norm_fp8_path() {
  static FastPath path("layer_norm_fp8");
  return path;
}
// quality=high: the low-precision GEMM (FP8 per tensor or rowwise; NVFP4 on Blackwell) with its
// activation quantized just before it.
FastPath& fp8_linear_path() {
  static FastPath path("fp8_linear");
  return path;
}

// quality=high: the convolution's bias added in cuDNN's epilogue (one rounding instead of
// PyTorch's two, and no second pass over the output).
FastPath& conv_fused_bias_path() {
  static FastPath path("conv_fused_bias");
  return path;
}

std::mutex injected_mutex;
std::set<std::string>& injected_failures() {
  static std::set<std::string> paths;
  return paths;
}

bool take_injected_failure(const std::string& path) {
  std::lock_guard<std::mutex> lock(injected_mutex);
  return injected_failures().erase(path) > 0;
}

absl::Status check_bf16(absl::string_view op, absl::string_view name, const Tensor& t) {
  return check_tensor(op, name, t, Device::kCuda, DType::kBF16);
}

absl::Status check_same_bf16(absl::string_view op, const Tensor& a, absl::string_view name,
                             const Tensor& b) {
  FLUX_RETURN_IF_ERROR(check_bf16(op, name, b));
  return check_matrix(op, name, b, a.rows(), a.cols());
}

// LayerNorm+modulate's input and its shift and scale vectors (bf16 [D] each).
absl::Status check_layer_norm_operands(absl::string_view op, const Tensor& x, const Tensor& shift,
                                       const Tensor& scale) {
  FLUX_RETURN_IF_ERROR(check_bf16(op, "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16(op, "shift", shift));
  FLUX_RETURN_IF_ERROR(check_vector(op, "shift", shift, x.cols()));
  FLUX_RETURN_IF_ERROR(check_bf16(op, "scale", scale));
  return check_vector(op, "scale", scale, x.cols());
}

// The weight and output of a projection of x: w bf16 [N, x.cols], y bf16 [x.rows, N].
absl::Status check_projection(absl::string_view op, const Tensor& x, const Tensor& w,
                              const Tensor& y) {
  FLUX_RETURN_IF_ERROR(check_bf16(op, "w", w));
  FLUX_RETURN_IF_ERROR(check_matrix(op, "w", w, w.rows(), x.cols()));
  FLUX_RETURN_IF_ERROR(check_bf16(op, "y", y));
  return check_matrix(op, "y", y, x.rows(), w.rows());
}

}  // namespace

void inject_fast_path_failure(absl::string_view path) {
  std::lock_guard<std::mutex> lock(injected_mutex);
  injected_failures().insert(std::string(path));
}

template <typename Fused, typename Eager>
absl::Status CudaBackend::run_fast_path(FastPath& path, absl::string_view unsupported, Fused fused,
                                        Eager eager) {
  if (!fast_paths_ || !fast_paths_enabled()) {
    path.count_fallback("switched_off");
    return eager();
  }
  return run_path(path, unsupported, fused, eager);
}

template <typename Fast, typename Fallback>
absl::Status CudaBackend::run_path(FastPath& path, absl::string_view unsupported, Fast fast,
                                   Fallback fallback) {
  if (!path.enabled()) {
    path.count_fallback("disabled_after_error");
    return fallback();
  }
  if (!unsupported.empty()) {
    path.count_fallback(unsupported);
    return fallback();
  }
  absl::Status status =
      take_injected_failure(path.name())
          ? absl::InternalError(absl::StrCat(path.name(), ": injected kernel failure"))
          : fast();
  if (status.ok()) {
    path.count_invocation();
    return status;
  }
  if (capturing()) return status;  // a fallback captured into a graph would hide the error
  path.disable(status.message());
  return fallback();
}

template <typename Into>
absl::Status CudaBackend::write_output(const Tensor& out, Into into) {
  if (out.contiguous()) return into(mat(out));
  return run_fast_path(
      token_concat_path(), "", [&] { return into(mat(out)); },
      [&]() -> absl::Status {
        FLUX_ASSIGN_OR_RETURN(Tensor separate, scratch({out.rows(), out.cols()}));
        FLUX_RETURN_IF_ERROR(into(mat(separate)));
        return copy(separate, out);
      });
}

absl::Status CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Tensor& y) {
  OpProfileScope op(*this, "");  // timed below, by part
  FLUX_RETURN_IF_ERROR(check_bf16("linear", "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16("linear", "w", w));
  FLUX_RETURN_IF_ERROR(check_bf16("linear", "y", y));
  FLUX_RETURN_IF_ERROR(check_matrix("linear", "w", w, y.cols(), x.cols()));
  FLUX_RETURN_IF_ERROR(check_matrix("linear", "y", y, x.rows(), w.rows()));
  if (bias.data() != nullptr) {
    FLUX_RETURN_IF_ERROR(check_bf16("linear", "bias", bias));
    FLUX_RETURN_IF_ERROR(check_vector("linear", "bias", bias, w.rows()));
  }
  auto bf16 = [&] {
    OpProfileScope profile(*this, profile_category("gemm", x, w));
    return gemm_->linear(mat(x), mat(w), bias.data(), mat(y));
  };
  if (quality_ == Quality::kHigh) {
    auto found = fp8_weights_.find(w.data());
    if (found != fp8_weights_.end()) {
      // FP8 needs K % 16 == 0, the NVFP4 GEMM K % 32 == 0 (16-byte rows of packed values).
      const bool fits = bias.data() == nullptr && x.cols() % (nvfp4_ ? 32 : 16) == 0;
      const Fp8Weight& low = found->second;
      return run_path(
          fp8_linear_path(), fits ? "" : "unsupported_shape",
          [&] { return linear_low_precision(x, low, y); }, bf16);
    }
  }
  return bf16();
}

bool CudaBackend::profile_split() const {
  // FLUX2_PROFILE_GEMM_SHAPES (set to any value) splits the profile's categories: "gemm" and
  // "quantize" by shape (M x N x K), "norm", "elementwise" and "conv" by op.
  static const bool split = std::getenv("FLUX2_PROFILE_GEMM_SHAPES") != nullptr;
  return split && profiling_;
}

std::string CudaBackend::op_category(absl::string_view category, absl::string_view op) const {
  return profile_split() ? absl::StrCat(category, " ", op) : std::string(category);
}

std::string CudaBackend::profile_category(absl::string_view category, const Tensor& x,
                                          const Tensor& w) const {
  if (!profile_split()) return std::string(category);
  return absl::StrCat(category, " ", x.rows(), "x", w.rows(), "x", x.cols());
}

absl::Status CudaBackend::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  OpProfileScope profile(*this, "other");
  FLUX_RETURN_IF_ERROR(check_tensor("embedding", "ids", ids, Device::kCuda, DType::kI32));
  FLUX_RETURN_IF_ERROR(check_bf16("embedding", "table", table));
  FLUX_RETURN_IF_ERROR(check_bf16("embedding", "out", out));
  FLUX_RETURN_IF_ERROR(check_matrix("embedding", "out", out, ids.numel(), table.cols()));
  // Ids are few (<= 512): check their range on the host before the gather reads the table.
  std::vector<float> host(static_cast<size_t>(ids.numel()));
  FLUX_RETURN_IF_ERROR(download(ids, host.data()));
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] < 0 || host[i] >= static_cast<float>(table.rows())) {
      return op_error("embedding",
                      absl::StrCat("id ", host[i], " at position ", i, " is outside the table of ",
                                   table.rows(), " rows"));
    }
  }
  return cuda::embedding_bf16(ids.data_as<int32_t>(), ids.numel(), mat(table), mat(out), stream());
}

absl::Status CudaBackend::silu(const Tensor& x, const Tensor& out) {
  OpProfileScope profile(*this, op_category("elementwise", "silu"));
  FLUX_RETURN_IF_ERROR(check_bf16("silu", "x", x));
  FLUX_RETURN_IF_ERROR(check_same_bf16("silu", x, "out", out));
  return cuda::silu_bf16(mat(x), mat(out), stream());
}

absl::Status CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  OpProfileScope profile(*this, op_category("elementwise", "add"));
  FLUX_RETURN_IF_ERROR(check_bf16("add", "a", a));
  FLUX_RETURN_IF_ERROR(check_same_bf16("add", a, "b", b));
  FLUX_RETURN_IF_ERROR(check_same_bf16("add", a, "out", out));
  return cuda::add_bf16(mat(a), mat(b), mat(out), stream());
}

absl::Status CudaBackend::gate_residual(const Tensor& x, const Tensor& gate, const Tensor& update) {
  OpProfileScope profile(*this, op_category("elementwise", "gate_residual"));
  FLUX_RETURN_IF_ERROR(check_bf16("gate_residual", "x", x));
  FLUX_RETURN_IF_ERROR(check_same_bf16("gate_residual", x, "update", update));
  FLUX_RETURN_IF_ERROR(check_bf16("gate_residual", "gate", gate));
  FLUX_RETURN_IF_ERROR(check_vector("gate_residual", "gate", gate, x.cols()));
  const cuda::Mat g{gate.data(), 1, gate.cols(), gate.cols()};
  return run_fast_path(
      gate_residual_path(), "",
      [&] { return cuda::gate_residual_fused(mat(x), g, x.rows(), mat(update), stream()); },
      [&]() -> absl::Status {
        FLUX_ASSIGN_OR_RETURN(Tensor product, scratch({x.rows(), x.cols()}));
        FLUX_RETURN_IF_ERROR(cuda::gate_mul_bf16(g, x.rows(), mat(update), mat(product), stream()));
        return cuda::add_bf16(mat(x), mat(product), mat(x), stream());
      });
}

absl::Status CudaBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  OpProfileScope profile(*this, op_category("elementwise", "swiglu"));
  FLUX_RETURN_IF_ERROR(check_bf16("swiglu", "gate", gate));
  FLUX_RETURN_IF_ERROR(check_same_bf16("swiglu", gate, "up", up));
  FLUX_RETURN_IF_ERROR(check_same_bf16("swiglu", gate, "out", out));
  // The concatenation fast path: write straight into a column range of a wider buffer.
  auto into = [&](const cuda::Mat& target) {
    return run_fast_path(
        swiglu_path(), "",
        [&]() -> absl::Status {
          const cuda::Mat gate_mat = mat(gate), up_mat = mat(up);
          const cuda::SiluMath math = silu_math();
          if (!handoff_wanted() || target.data != out.data() ||
              !cuda::row_amax_supported({&gate_mat, &up_mat, &target})) {
            return cuda::swiglu_fused(mat(gate), mat(up), target, math, stream());
          }
          // quality=high: also the row maxima, extending the hand-off of a producer that wrote
          // the columns just left of these (attention, in the single block's [attn | mlp]).
          Tensor row_amax;
          const bool extends =
              incoming_ && incoming_->rows == out.rows() && incoming_->stride == out.row_stride() &&
              incoming_->data + incoming_->cols * 2 == static_cast<const char*>(out.data());
          if (extends) {
            row_amax = incoming_->row_amax;
          } else {
            FLUX_ASSIGN_OR_RETURN(row_amax, scratch({out.rows()}, DType::kI32));
          }
          FLUX_RETURN_IF_ERROR(cuda::swiglu_fused_row_amax(
              mat(gate), mat(up), target, row_amax.data_as<uint32_t>(), extends, math, stream()));
          if (extends) {
            AmaxHandoff wider = *incoming_;
            wider.cols += out.cols();
            handoff_ = std::move(wider);
          } else {
            hand_off(out, std::move(row_amax));
          }
          return absl::OkStatus();
        },
        [&]() -> absl::Status {
          FLUX_ASSIGN_OR_RETURN(Tensor activated, scratch({gate.rows(), gate.cols()}));
          FLUX_RETURN_IF_ERROR(cuda::silu_bf16(mat(gate), mat(activated), stream()));
          return cuda::mul_bf16(mat(activated), mat(up), target, stream());
        });
  };
  return write_output(out, into);
}

absl::Status CudaBackend::swiglu_linear(const Tensor& gate, const Tensor& up, const Tensor& x,
                                        const Tensor& w, const Tensor& y,
                                        const GatedResidual* residual) {
  // quality=high with rowwise FP8: SwiGLU writes the GEMM's E4M3 input rows itself.
  auto found = fp8_rows_wanted() ? fp8_weights_.find(w.data()) : fp8_weights_.end();
  if (found == fp8_weights_.end()) return Backend::swiglu_linear(gate, up, x, w, y, residual);
  OpProfileScope op(*this, "");
  constexpr absl::string_view kOp = "swiglu_linear";
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "gate", gate));
  FLUX_RETURN_IF_ERROR(check_same_bf16(kOp, gate, "up", up));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "x", x));
  if (x.rows() != gate.rows() || x.cols() < gate.cols()) {
    return op_error(kOp,
                    absl::StrCat("x ", x.describe(), " must have gate's rows and end with its ",
                                 gate.cols(), " columns"));
  }
  FLUX_RETURN_IF_ERROR(check_projection(kOp, x, w, y));
  if (residual != nullptr) {
    FLUX_RETURN_IF_ERROR(check_same_bf16(kOp, y, "residual stream", residual->stream));
    FLUX_RETURN_IF_ERROR(check_bf16(kOp, "residual gate", residual->gate));
    FLUX_RETURN_IF_ERROR(check_vector(kOp, "residual gate", residual->gate, w.rows()));
  }
  const int64_t prefix = x.cols() - gate.cols();
  const cuda::Mat prefix_mat =
      prefix > 0 ? mat(x.col_slice(0, prefix)) : cuda::Mat{nullptr, x.rows(), 0, 0};
  const bool fits =
      x.cols() % 16 == 0 && cuda::swiglu_fp8_rows_supported(prefix_mat, mat(gate), mat(up));
  return run_fast_path(
      swiglu_fp8_path(), fits ? "" : "unsupported_shape",
      [&] { return swiglu_linear_fp8(gate, up, x, found->second, y, residual); },
      [&] { return Backend::swiglu_linear(gate, up, x, w, y, residual); });
}

absl::Status CudaBackend::layer_norm_modulate_linear(const Tensor& x, const Tensor& shift,
                                                     const Tensor& scale, float eps,
                                                     const Tensor& normed, const Tensor& w,
                                                     const Tensor& y) {
  // quality=high with rowwise FP8: the norm writes only the GEMM's E4M3 rows.
  auto found = fp8_rows_wanted() ? fp8_weights_.find(w.data()) : fp8_weights_.end();
  if (found == fp8_weights_.end()) {
    return Backend::layer_norm_modulate_linear(x, shift, scale, eps, normed, w, y);
  }
  OpProfileScope op(*this, "");
  constexpr absl::string_view kOp = "layer_norm_modulate_linear";
  FLUX_RETURN_IF_ERROR(check_layer_norm_operands(kOp, x, shift, scale));
  FLUX_RETURN_IF_ERROR(check_same_bf16(kOp, x, "normed", normed));
  FLUX_RETURN_IF_ERROR(check_projection(kOp, x, w, y));
  const bool fits = x.cols() % 16 == 0 && cuda::layer_norm_writes_fp8(mat(x));
  return run_fast_path(
      layer_norm_fp8_path(), fits ? "" : "unsupported_shape",
      [&] { return layer_norm_linear_fp8(x, shift, scale, eps, found->second, y); },
      [&] { return Backend::layer_norm_modulate_linear(x, shift, scale, eps, normed, w, y); });
}

absl::Status CudaBackend::layer_norm_modulate(const Tensor& x, const Tensor& shift,
                                              const Tensor& scale, float eps, const Tensor& out) {
  OpProfileScope profile(*this, op_category("norm", "layer_norm_modulate"));
  constexpr absl::string_view kOp = "layer_norm_modulate";
  FLUX_RETURN_IF_ERROR(check_layer_norm_operands(kOp, x, shift, scale));
  FLUX_RETURN_IF_ERROR(check_same_bf16(kOp, x, "out", out));
  const cuda::Mat sh{shift.data(), 1, shift.cols(), shift.cols()},
      sc{scale.data(), 1, scale.cols(), scale.cols()};
  return run_fast_path(
      layer_norm_modulate_path(), "",
      [&]() -> absl::Status {
        if (!handoff_wanted()) {
          return cuda::layer_norm_modulate_fused(mat(x), sh, sc, x.rows(), eps, mat(out), stream());
        }
        if (cuda::layer_norm_writes_fp8(mat(x))) {
          // quality=high: the E4M3 copy for the next GEMM too, scaled by a bound that holds for
          // every input (norms.h), so it needs no amax of the output.
          FLUX_ASSIGN_OR_RETURN(Tensor fp8, scratch({x.rows(), x.cols()}, DType::kF8E4M3));
          FLUX_ASSIGN_OR_RETURN(Tensor fp8_scale, scratch({1}, DType::kF32));
          FLUX_RETURN_IF_ERROR(cuda::fp8_layer_norm_modulate_scale(
              sh, sc, x.cols(), fp8_scale.data_as<float>(), stream()));
          FLUX_RETURN_IF_ERROR(cuda::layer_norm_modulate_fused(
              mat(x), sh, sc, x.rows(), eps, mat(out), stream(), nullptr,
              cuda::Fp8Rows{static_cast<uint8_t*>(fp8.data()), fp8_scale.data_as<float>()}));
          hand_off(out, Tensor(), std::move(fp8), std::move(fp8_scale));
          return absl::OkStatus();
        }
        // Else each row's max |out| (every row is written: no zeroing needed).
        FLUX_ASSIGN_OR_RETURN(Tensor row_amax, scratch({x.rows()}, DType::kI32));
        FLUX_RETURN_IF_ERROR(cuda::layer_norm_modulate_fused(
            mat(x), sh, sc, x.rows(), eps, mat(out), stream(), row_amax.data_as<uint32_t>()));
        hand_off(out, std::move(row_amax));
        return absl::OkStatus();
      },
      [&]() -> absl::Status {
        // diffusers: norm = LN(x); (1 + scale) * norm + shift — four bf16 ops.
        FLUX_ASSIGN_OR_RETURN(Tensor normed, scratch({x.rows(), x.cols()}));
        FLUX_ASSIGN_OR_RETURN(Tensor one_plus, scratch({1, x.cols()}));
        FLUX_RETURN_IF_ERROR(cuda::layer_norm_bf16(mat(x), eps, mat(normed), stream()));
        FLUX_RETURN_IF_ERROR(cuda::one_plus_bf16(sc, mat(one_plus), stream()));
        FLUX_RETURN_IF_ERROR(
            cuda::gate_mul_bf16(mat(one_plus), x.rows(), mat(normed), mat(normed), stream()));
        return cuda::add_row_bf16(mat(normed), sh, x.rows(), mat(out), stream());
      });
}

absl::Status CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps,
                                   const Tensor& out) {
  OpProfileScope profile(*this, op_category("norm", "rms_norm"));
  FLUX_RETURN_IF_ERROR(check_bf16("rms_norm", "x", x));
  FLUX_RETURN_IF_ERROR(check_same_bf16("rms_norm", x, "out", out));
  FLUX_RETURN_IF_ERROR(check_bf16("rms_norm", "weight", weight));
  FLUX_RETURN_IF_ERROR(check_vector("rms_norm", "weight", weight, x.cols()));
  return cuda::rms_norm_qwen_bf16(mat(x), weight.data(), eps, mat(out), stream());
}

absl::Status CudaBackend::qk_norm_rope(const Tensor& x, int64_t head_dim, const Tensor& norm_weight,
                                       float eps, const Tensor& cos, const Tensor& sin,
                                       RopeStyle style) {
  OpProfileScope profile(*this, op_category("norm", "qk_norm_rope"));
  constexpr absl::string_view kOp = "qk_norm_rope";
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "norm_weight", norm_weight));
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "norm_weight", norm_weight, head_dim));
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "cos", cos, Device::kCuda, DType::kF32));
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "sin", sin, Device::kCuda, DType::kF32));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "cos", cos, x.rows(), head_dim));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "sin", sin, x.rows(), head_dim));
  return run_fast_path(
      qk_norm_rope_path(), "",
      [&] {
        return cuda::qk_norm_rope_fused(mat(x), head_dim, norm_weight.data(), eps, mat(cos),
                                        mat(sin), style, stream());
      },
      [&]() -> absl::Status {
        FLUX_RETURN_IF_ERROR(
            cuda::qk_rms_norm_bf16(mat(x), head_dim, norm_weight.data(), eps, style, stream()));
        return cuda::rope_bf16(mat(x), head_dim, mat(cos), mat(sin), style, stream());
      });
}

absl::Status CudaBackend::group_norm(const Tensor& x, int64_t groups, const Tensor& gamma,
                                     const Tensor& beta, float eps, bool silu, const Tensor& out) {
  OpProfileScope profile(*this, op_category("norm", "group_norm"));
  FLUX_RETURN_IF_ERROR(check_bf16("group_norm", "x", x));
  FLUX_RETURN_IF_ERROR(check_same_bf16("group_norm", x, "out", out));
  FLUX_RETURN_IF_ERROR(check_bf16("group_norm", "gamma", gamma));
  FLUX_RETURN_IF_ERROR(check_vector("group_norm", "gamma", gamma, x.cols()));
  FLUX_RETURN_IF_ERROR(check_bf16("group_norm", "beta", beta));
  FLUX_RETURN_IF_ERROR(check_vector("group_norm", "beta", beta, x.cols()));
  return cuda::group_norm_bf16(mat(x), groups, gamma.data(), beta.data(), eps, silu, silu_math(),
                               mat(out), stream());
}

absl::Status CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionParams& params, const Tensor& out) {
  OpProfileScope op(*this, "");  // timed below, by part
  FLUX_RETURN_IF_ERROR(check_bf16("attention", "q", q));
  FLUX_RETURN_IF_ERROR(check_bf16("attention", "k", k));
  FLUX_RETURN_IF_ERROR(check_bf16("attention", "v", v));
  FLUX_RETURN_IF_ERROR(check_bf16("attention", "out", out));
  // cuDNN is the attention implementation (a library, like cuBLASLt): it is used whether or not
  // fused fast paths are switched off, and its fallback is the plain kernel.
  Tensor flash_row_amax;  // the output's row maxima, when our FP8 kernel wrote them
  auto into = [&](const cuda::Mat& target) -> absl::Status {
    FastPath& path = cudnn_attention_path();
    const bool supported = cuda::CudnnSdpa::supports(mat(q), mat(k), mat(v), params, target);
    if (!supported && params.num_heads == 1 && params.num_kv_heads == 1 && !params.causal &&
        params.num_valid_keys < 0 && params.head_dim > 256) {
      // The VAE's single wide head: two GEMMs around a row softmax, in query chunks.
      OpProfileScope profile(*this, "attention");
      return attention_by_gemms(q, k, v, params.scale, target);
    }
    auto bf16_attention = [&] {
      OpProfileScope profile(*this, "attention");
      return run_path(
          path, supported ? "" : "unsupported_shape",
          [&] { return sdpa_->run(mat(q), mat(k), mat(v), params, target); },
          [&] {
            return cuda::attention_fallback(mat(q), mat(k), mat(v), params, target, stream());
          });
    };
    // FP8 attention serves the transformer's (non-causal) attention; the text encoder's causal
    // attention stays bf16 without counting a fallback, as does all of it with FLUX2_FLASH_FP8=0.
    if (quality_ != Quality::kHigh || params.causal || !flash_fp8_attention_)
      return bf16_attention();
    const absl::string_view unsupported =
        !cuda::flash_attention_fp8_available()                                ? "unsupported_device"
        : !cuda::flash_attention_fp8_supports(params, mat(q), mat(k), mat(v)) ? "unsupported_shape"
                                                                              : "";
    return run_path(
        flash_fp8_attention_path(), unsupported,
        [&] { return attention_flash_fp8(q, k, v, params, nullptr, target, &flash_row_amax); },
        bf16_attention);
  };
  FLUX_RETURN_IF_ERROR(write_output(out, into));
  return hand_off_attention_output(out, params, std::move(flash_row_amax));
}

absl::Status CudaBackend::hand_off_attention_output(const Tensor& out,
                                                    const AttentionParams& params,
                                                    Tensor row_amax_from_kernel) {
  if (handoff_wanted() && row_amax_from_kernel.data() != nullptr) {
    hand_off(out, std::move(row_amax_from_kernel));
    return absl::OkStatus();
  }
  const cuda::Mat out_mat = mat(out);
  if (handoff_wanted() && !params.causal && cuda::row_amax_supported({&out_mat})) {
    // quality=high: the output's row maxima, for the FP8 GEMM (or the SwiGLU extending them into
    // the single block's [attn | mlp]) that reads it next.
    OpProfileScope profile(*this, "quantize");
    FLUX_ASSIGN_OR_RETURN(Tensor row_amax, scratch({out.rows()}, DType::kI32));
    FLUX_RETURN_IF_ERROR(cuda::row_amax_bf16(out_mat, row_amax.data_as<uint32_t>(), stream()));
    hand_off(out, std::move(row_amax));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::normed_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const QkNormRope& norm, const AttentionParams& params,
                                           const Tensor& out) {
  // quality=high with our FP8 attention: QK-norm and RoPE run inside its operand quantizer (q and
  // k are read once and never written back); everywhere else the ops in turn.
  auto norm_weight = [](const Tensor& w) {
    return w.dtype() == DType::kBF16 && w.device() == Device::kCuda &&
           w.numel() == cuda::kFlashFp8HeadDim && w.contiguous();
  };
  auto table = [&](const Tensor& t) {
    return t.dtype() == DType::kF32 && t.device() == Device::kCuda && t.rank() == 2 &&
           t.rows() == q.rows() && t.cols() == cuda::kFlashFp8HeadDim &&
           cuda::rows_aligned16(mat(t), 4);
  };
  const bool fusable =
      quality_ == Quality::kHigh && flash_fp8_attention_ && flash_fp8_attention_path().enabled() &&
      cuda::flash_attention_fp8_available() && check_bf16("normed_attention", "q", q).ok() &&
      check_bf16("normed_attention", "k", k).ok() && check_bf16("normed_attention", "v", v).ok() &&
      check_bf16("normed_attention", "out", out).ok() &&
      cuda::flash_attention_fp8_supports(params, mat(q), mat(k), mat(v)) &&
      norm.style == RopeStyle::kInterleaved && norm.split >= 0 && norm.split <= q.rows() &&
      norm_weight(norm.q_weight[0]) && norm_weight(norm.k_weight[0]) &&
      (norm.split == q.rows() ||
       (norm_weight(norm.q_weight[1]) && norm_weight(norm.k_weight[1]))) &&
      table(norm.cos) && table(norm.sin);
  if (!fusable) return Backend::normed_attention(q, k, v, norm, params, out);
  OpProfileScope op(*this, "");
  Tensor row_amax;
  bool fused = false;
  FLUX_RETURN_IF_ERROR(run_path(
      flash_fp8_attention_path(), "",
      [&] {
        return write_output(out, [&](const cuda::Mat& target) {
          FLUX_RETURN_IF_ERROR(attention_flash_fp8(q, k, v, params, &norm, target, &row_amax));
          fused = true;
          return absl::OkStatus();
        });
      },
      [&] { return Backend::normed_attention(q, k, v, norm, params, out); }));
  // The fallback's attention() left its own hand-off.
  return fused ? hand_off_attention_output(out, params, std::move(row_amax)) : absl::OkStatus();
}

absl::Status CudaBackend::attention_flash_fp8(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const AttentionParams& params, const QkNormRope* norm,
                                              const cuda::Mat& out, Tensor* row_amax) {
  const int64_t s = q.rows(), width = q.cols(), heads = params.num_heads;
  const std::string quantize = op_category("quantize", "attention");
  std::optional<OpProfileScope> profile(std::in_place, *this, quantize);
  FLUX_ASSIGN_OR_RETURN(Tensor q8, scratch({s, width}, DType::kF8E4M3));
  FLUX_ASSIGN_OR_RETURN(Tensor k8, scratch({s, width}, DType::kF8E4M3));
  FLUX_ASSIGN_OR_RETURN(Tensor vt8,
                        scratch({width, cuda::flash_fp8_padded_keys(s)}, DType::kF8E4M3));
  FLUX_ASSIGN_OR_RETURN(Tensor scales,
                        scratch({cuda::flash_fp8_scale_count(heads, s)}, DType::kF32));
  cuda::FlashFp8Operands operands{q8.data(), k8.data(), vt8.data(), scales.data_as<float>()};
  std::optional<cuda::FlashFp8QkNorm> fused_norm;
  if (norm != nullptr) {
    const int second = norm->split < s ? 1 : 0;  // the second weights exist when rows use them
    fused_norm = cuda::FlashFp8QkNorm{{norm->q_weight[0].data(), norm->q_weight[second].data()},
                                      {norm->k_weight[0].data(), norm->k_weight[second].data()},
                                      norm->split,
                                      norm->eps,
                                      mat(norm->cos),
                                      mat(norm->sin)};
  }
  FLUX_RETURN_IF_ERROR(cuda::quantize_attention_operands_fp8(
      mat(q), mat(k), mat(v), heads, operands, stream(), fused_norm ? &*fused_norm : nullptr));
  cuda::FlashFp8Args a = cuda::flash_fp8_args(operands, s, heads);
  a.out = out;
  a.softmax_scale = params.scale;
  Tensor maxima;
  if (handoff_wanted()) {  // the row maxima for the hand-off, written by the kernel's epilogue
    FLUX_ASSIGN_OR_RETURN(maxima, scratch({s}, DType::kI32));
    FLUX_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(maxima.data(), 0, maxima.bytes(), stream()),
                                     "attention row maxima"));
    a.row_amax = maxima.data_as<uint32_t>();
  }
  profile.emplace(*this, "attention");
  FLUX_RETURN_IF_ERROR(cuda::flash_attention_fp8(a, stream()));
  *row_amax = std::move(maxima);
  return absl::OkStatus();
}

absl::Status CudaBackend::attention_by_gemms(const Tensor& q, const Tensor& k, const Tensor& v,
                                             float scale, const cuda::Mat& out) {
  // 4096 query rows x 16384 keys of f32 scores is 256 MiB: bounded whatever the image size.
  constexpr int64_t kMaxScoreElements = int64_t{1} << 26;
  const int64_t keys = k.rows();
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(q.rows(), kMaxScoreElements / keys));
  FLUX_ASSIGN_OR_RETURN(Tensor scores, scratch({chunk, keys}, DType::kF32));
  FLUX_ASSIGN_OR_RETURN(Tensor probs, scratch({chunk, keys}));
  for (int64_t r0 = 0; r0 < q.rows(); r0 += chunk) {
    const int64_t n = std::min(chunk, q.rows() - r0);
    const cuda::Mat s{scores.data(), n, keys, keys}, p{probs.data(), n, keys, keys};
    FLUX_RETURN_IF_ERROR(
        gemm_->matmul(mat(q.row_slice(r0, n)), mat(k), /*b_transposed=*/true, scale, s, true));
    FLUX_RETURN_IF_ERROR(cuda::softmax_rows_f32_to_bf16(s, p, stream()));
    const cuda::Mat o{static_cast<char*>(out.data) + r0 * out.stride * 2, n, out.cols, out.stride};
    FLUX_RETURN_IF_ERROR(gemm_->matmul(p, mat(v), /*b_transposed=*/false, 1.0f, o, false));
  }
  return absl::OkStatus();
}

namespace {

std::string conv_shape(const Tensor& x, const Tensor& w, absl::string_view suffix = "") {
  if (x.rank() != 3 || w.rank() != 4) return "?";
  return absl::StrCat(x.dim(0), "x", x.dim(1), "x", x.dim(2), "->", w.dim(0), " k", w.dim(1),
                      suffix);
}

}  // namespace

absl::Status CudaBackend::check_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                       const Tensor& out) const {
  FLUX_RETURN_IF_ERROR(check_bf16("conv2d", "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16("conv2d", "w", w));
  FLUX_RETURN_IF_ERROR(check_bf16("conv2d", "bias", bias));
  FLUX_RETURN_IF_ERROR(check_bf16("conv2d", "out", out));
  if (x.rank() != 3 || w.rank() != 4 || out.rank() != 3 || !x.contiguous() || !out.contiguous() ||
      w.dim(3) != x.dim(2) || w.dim(1) != w.dim(2) || w.dim(1) % 2 == 0 || out.dim(0) != x.dim(0) ||
      out.dim(1) != x.dim(1) || out.dim(2) != w.dim(0) || bias.numel() != w.dim(0)) {
    return op_error("conv2d", absl::StrCat("shapes do not match: x ", x.describe(), ", w ",
                                           w.describe(), ", out ", out.describe()));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::conv_unfused(const Tensor& x, const Tensor& w, const Tensor& bias,
                                       const Tensor& out) {
  return conv_->run(x.data(), x.dim(0), x.dim(1), x.dim(2), w.data(), w.dim(0), w.dim(1),
                    bias.data(), out.data());
}

// quality=high: bias (and residual, when not null) in cuDNN's epilogue; else `separate`.
template <typename Separate>
absl::Status CudaBackend::conv2d_fused(const Tensor& x, const Tensor& w, const Tensor& bias,
                                       const Tensor* residual, const Tensor& out,
                                       Separate separate) {
  FLUX_ASSIGN_OR_RETURN(const bool fusable,
                        conv_->fuses_bias(x.dim(0), x.dim(1), x.dim(2), w.dim(0), w.dim(1)));
  return run_path(
      conv_fused_bias_path(), fusable ? "" : "algorithm_cannot_fuse",
      [&] {
        return conv_->run_fused_bias(x.data(), x.dim(0), x.dim(1), x.dim(2), w.data(), w.dim(0),
                                     w.dim(1), bias.data(), out.data(),
                                     residual != nullptr ? residual->data() : nullptr);
      },
      separate);
}

absl::Status CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Tensor& out) {
  OpProfileScope profile(*this, profile_split() ? op_category("conv", conv_shape(x, w)) : "conv");
  FLUX_RETURN_IF_ERROR(check_conv2d(x, w, bias, out));
  auto separate = [&] { return conv_unfused(x, w, bias, out); };
  if (quality_ != Quality::kHigh) return separate();
  return conv2d_fused(x, w, bias, nullptr, out, separate);
}

absl::Status CudaBackend::conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                                     const Tensor& residual, const Tensor& out) {
  if (quality_ != Quality::kHigh) {
    return Backend::conv2d_add(x, w, bias, residual, out);  // two profiled ops
  }
  OpProfileScope profile(
      *this, profile_split() ? op_category("conv", conv_shape(x, w, " +residual")) : "conv");
  FLUX_RETURN_IF_ERROR(check_conv2d(x, w, bias, out));
  FLUX_RETURN_IF_ERROR(check_same_bf16("conv2d_add", out, "residual", residual));
  if (!residual.contiguous()) return op_error("conv2d_add", "residual must be contiguous");
  auto separate = [&]() -> absl::Status {  // the fallback: PyTorch's three roundings, counted once
    FLUX_RETURN_IF_ERROR(conv_unfused(x, w, bias, out));
    return add(residual, out, out);
  };
  return conv2d_fused(x, w, bias, &residual, out, separate);
}

absl::Status CudaBackend::upsample_nearest_2x(const Tensor& x, const Tensor& out) {
  OpProfileScope profile(*this, "other");
  FLUX_RETURN_IF_ERROR(check_bf16("upsample_nearest_2x", "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16("upsample_nearest_2x", "out", out));
  if (x.rank() != 3 || out.rank() != 3 || !x.contiguous() || !out.contiguous() ||
      out.dim(0) != 2 * x.dim(0) || out.dim(1) != 2 * x.dim(1) || out.dim(2) != x.dim(2)) {
    return op_error("upsample_nearest_2x", "expected contiguous [H, W, C] -> [2H, 2W, C]");
  }
  return cuda::upsample_nearest_2x_bf16(x.data(), x.dim(0), x.dim(1), x.dim(2), out.data(),
                                        stream());
}

absl::Status CudaBackend::latent_unpack(const Tensor& tokens, const Tensor& bn_mean,
                                        const Tensor& bn_var, float eps, const Tensor& out) {
  OpProfileScope profile(*this, "other");
  FLUX_RETURN_IF_ERROR(check_bf16("latent_unpack", "tokens", tokens));
  FLUX_RETURN_IF_ERROR(check_bf16("latent_unpack", "out", out));
  FLUX_RETURN_IF_ERROR(check_bf16("latent_unpack", "bn_mean", bn_mean));
  FLUX_RETURN_IF_ERROR(check_bf16("latent_unpack", "bn_var", bn_var));
  if (out.rank() != 3 || !out.contiguous() || out.dim(0) % 2 || out.dim(1) % 2) {
    return op_error("latent_unpack", "out must be a contiguous [2h, 2w, C]");
  }
  const int64_t h = out.dim(0) / 2, w = out.dim(1) / 2, c = out.dim(2);
  FLUX_RETURN_IF_ERROR(check_matrix("latent_unpack", "tokens", tokens, h * w, 4 * c));
  FLUX_RETURN_IF_ERROR(check_vector("latent_unpack", "bn_mean", bn_mean, 4 * c));
  FLUX_RETURN_IF_ERROR(check_vector("latent_unpack", "bn_var", bn_var, 4 * c));
  return cuda::latent_unpack_bf16(mat(tokens), bn_mean.data(), bn_var.data(), eps, h, w, c,
                                  out.data(), stream());
}

absl::Status CudaBackend::to_rgb8(const Tensor& image, uint8_t* host) {
  OpProfileScope profile(*this, "other");
  FLUX_RETURN_IF_ERROR(check_bf16("to_rgb8", "image", image));
  if (!image.contiguous()) return op_error("to_rgb8", "image must be contiguous");
  FLUX_ASSIGN_OR_RETURN(Tensor bytes, scratch({image.numel()}, DType::kU8));
  FLUX_RETURN_IF_ERROR(
      cuda::image_to_rgb8_bf16(image.data(), image.numel(), bytes.data_as<uint8_t>(), stream()));
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaMemcpyAsync(host, bytes.data(), static_cast<size_t>(image.numel()),
                                  cudaMemcpyDeviceToHost, stream()),
                  "to_rgb8 copy"));
  return synchronize();
}

absl::Status CudaBackend::euler_step(const Tensor& x, const Tensor& v, float dt) {
  OpProfileScope profile(*this, op_category("elementwise", "euler_step"));
  FLUX_RETURN_IF_ERROR(check_bf16("euler_step", "x", x));
  FLUX_RETURN_IF_ERROR(check_same_bf16("euler_step", x, "v", v));
  return cuda::euler_step_bf16(mat(x), mat(v), dt, stream());
}

absl::Status CudaBackend::cfg_combine(const Tensor& uncond, const Tensor& cond, float scale,
                                      const Tensor& out) {
  OpProfileScope profile(*this, op_category("elementwise", "cfg_combine"));
  FLUX_RETURN_IF_ERROR(check_bf16("cfg_combine", "uncond", uncond));
  FLUX_RETURN_IF_ERROR(check_same_bf16("cfg_combine", uncond, "cond", cond));
  FLUX_RETURN_IF_ERROR(check_same_bf16("cfg_combine", uncond, "out", out));
  return cuda::cfg_combine_bf16(mat(uncond), mat(cond), scale, mat(out), stream());
}

}  // namespace flux2
