// CudaBackend's element-wise, norm, image and sampling ops: operand checks, then the fused kernel
// or its eager chain (fast paths of cuda_fast_paths.h, fallbacks counted by reason). Projections,
// attention and convolutions have their own files (cuda_backend_impl.h lists them).
// Tested by tests/cuda/op_cases.cc (gpu_op_test: fused == eager bit for bit, CUDA vs CPU).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_checks.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/image_ops.h"
#include "kernels/cuda/mean_abs_diff.h"
#include "kernels/cuda/norms.h"

namespace flux2 {

using cuda::check_bf16;
using cuda::check_same_bf16;
using cuda::CudaPath;

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

absl::Status CudaBackend::sub(const Tensor& a, const Tensor& b, const Tensor& out) {
  OpProfileScope profile(*this, op_category("elementwise", "sub"));
  FLUX_RETURN_IF_ERROR(check_bf16("sub", "a", a));
  FLUX_RETURN_IF_ERROR(check_same_bf16("sub", a, "b", b));
  FLUX_RETURN_IF_ERROR(check_same_bf16("sub", a, "out", out));
  return cuda::sub_bf16(mat(a), mat(b), mat(out), stream());
}

absl::StatusOr<float> CudaBackend::mean_abs_diff_ratio(const Tensor& a, const Tensor& b) {
  OpProfileScope profile(*this, op_category("other", "mean_abs_diff_ratio"));
  FLUX_RETURN_IF_ERROR(check_bf16("mean_abs_diff_ratio", "a", a));
  FLUX_RETURN_IF_ERROR(check_same_bf16("mean_abs_diff_ratio", a, "b", b));
  // The partials, then the two sums, as 8-byte elements (float64 on the device).
  FLUX_ASSIGN_OR_RETURN(Tensor doubles,
                        scratch({1, 2 * cuda::kMeanAbsDiffBlocks + 2}, DType::kI64));
  double* workspace = static_cast<double*>(doubles.data());
  double* sums = workspace + 2 * cuda::kMeanAbsDiffBlocks;
  FLUX_RETURN_IF_ERROR(cuda::mean_abs_diff_sums(mat(a), mat(b), workspace, sums, stream()));
  FLUX_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(staging_[0], sums, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream()),
      "mean_abs_diff_ratio"));
  FLUX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream()), "mean_abs_diff_ratio sync"));
  const double* host = static_cast<const double*>(staging_[0]);
  return static_cast<float>(host[0] / host[1]);
}

absl::Status CudaBackend::gate_residual(const Tensor& x, const Tensor& gate, const Tensor& update) {
  OpProfileScope profile(*this, op_category("elementwise", "gate_residual"));
  FLUX_RETURN_IF_ERROR(check_bf16("gate_residual", "x", x));
  FLUX_RETURN_IF_ERROR(check_same_bf16("gate_residual", x, "update", update));
  FLUX_RETURN_IF_ERROR(check_bf16("gate_residual", "gate", gate));
  FLUX_RETURN_IF_ERROR(check_vector("gate_residual", "gate", gate, x.cols()));
  const cuda::Mat g{gate.data(), 1, gate.cols(), gate.cols()};
  return run_path(
      CudaPath::kGateResidual, "",
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
    return run_path(
        CudaPath::kSwiglu, "",
        [&] { return cuda::swiglu_fused(mat(gate), mat(up), target, silu_math(), stream()); },
        [&]() -> absl::Status {
          FLUX_ASSIGN_OR_RETURN(Tensor activated, scratch({gate.rows(), gate.cols()}));
          FLUX_RETURN_IF_ERROR(cuda::silu_bf16(mat(gate), mat(activated), stream()));
          return cuda::mul_bf16(mat(activated), mat(up), target, stream());
        });
  };
  return write_output(out, into);
}

absl::Status CudaBackend::layer_norm_modulate(const Tensor& x, const Tensor& shift,
                                              const Tensor& scale, float eps, const Tensor& out) {
  OpProfileScope profile(*this, op_category("norm", "layer_norm_modulate"));
  constexpr absl::string_view kOp = "layer_norm_modulate";
  FLUX_RETURN_IF_ERROR(cuda::check_layer_norm_operands(kOp, x, shift, scale));
  FLUX_RETURN_IF_ERROR(check_same_bf16(kOp, x, "out", out));
  const cuda::Mat sh{shift.data(), 1, shift.cols(), shift.cols()},
      sc{scale.data(), 1, scale.cols(), scale.cols()};
  return run_path(
      CudaPath::kLayerNormModulate, "",
      [&] {
        return cuda::layer_norm_modulate_fused(mat(x), sh, sc, x.rows(), eps, mat(out), stream());
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

absl::Status CudaBackend::rope(const Tensor& x, int64_t head_dim, const Tensor& cos,
                               const Tensor& sin, RopeStyle style) {
  OpProfileScope profile(*this, op_category("norm", "rope"));
  constexpr absl::string_view kOp = "rope";
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "cos", cos, Device::kCuda, DType::kF32));
  FLUX_RETURN_IF_ERROR(check_tensor(kOp, "sin", sin, Device::kCuda, DType::kF32));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "cos", cos, x.rows(), head_dim));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "sin", sin, x.rows(), head_dim));
  return cuda::rope_bf16(mat(x), head_dim, mat(cos), mat(sin), style, stream());
}

absl::Status CudaBackend::qk_norm_rope(const Tensor& x, int64_t head_dim, const Tensor& norm_weight,
                                       float eps, const Tensor& cos, const Tensor& sin,
                                       RopeStyle style) {
  OpProfileScope profile(*this, op_category("norm", "qk_norm_rope"));
  constexpr absl::string_view kOp = "qk_norm_rope";
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(cuda::check_qk_norm_rope_operands(kOp, x, head_dim, norm_weight, cos, sin));
  return run_path(
      CudaPath::kQkNormRope, "",
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
  auto run = [&](bool one_pass) {
    return cuda::group_norm_bf16(mat(x), groups, gamma.data(), beta.data(), eps, silu, silu_math(),
                                 one_pass, mat(out), stream());
  };
  if (request().quality != Quality::kHigh) return run(false);
  return run_path(
      cuda::CudaPath::kGroupNormOnePass, cuda::group_norm_one_pass_unsupported(mat(x)),
      [&] { return run(true); }, [&] { return run(false); });
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

absl::Status CudaBackend::latent_pack(const Tensor& x, const Tensor& bn_mean, const Tensor& bn_var,
                                      float eps, const Tensor& tokens) {
  OpProfileScope profile(*this, "other");
  FLUX_RETURN_IF_ERROR(check_bf16("latent_pack", "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16("latent_pack", "tokens", tokens));
  FLUX_RETURN_IF_ERROR(check_bf16("latent_pack", "bn_mean", bn_mean));
  FLUX_RETURN_IF_ERROR(check_bf16("latent_pack", "bn_var", bn_var));
  const int64_t c = tokens.cols() / 4;
  if (x.rank() != 3 || !x.contiguous() || x.dim(0) % 2 || x.dim(1) % 2 || x.dim(2) < c ||
      tokens.cols() % 4 != 0) {
    return op_error("latent_pack", "x must be a contiguous [2h, 2w, >= tokens.cols / 4]");
  }
  const int64_t h = x.dim(0) / 2, w = x.dim(1) / 2;
  FLUX_RETURN_IF_ERROR(check_matrix("latent_pack", "tokens", tokens, h * w, 4 * c));
  FLUX_RETURN_IF_ERROR(check_vector("latent_pack", "bn_mean", bn_mean, 4 * c));
  FLUX_RETURN_IF_ERROR(check_vector("latent_pack", "bn_var", bn_var, 4 * c));
  return cuda::latent_pack_bf16(x.data(), x.dim(2), bn_mean.data(), bn_var.data(), eps, h, w, c,
                                mat(tokens), stream());
}

absl::Status CudaBackend::from_rgb8(const uint8_t* host, const Tensor& image) {
  OpProfileScope profile(*this, "other");
  FLUX_RETURN_IF_ERROR(check_bf16("from_rgb8", "image", image));
  if (!image.contiguous()) return op_error("from_rgb8", "image must be contiguous");
  // [H·W, 3]: the staging buffers take whole rows, so any image size goes through them.
  FLUX_ASSIGN_OR_RETURN(Tensor bytes, scratch({image.rows(), image.cols()}, DType::kU8));
  FLUX_RETURN_IF_ERROR(upload(host, DType::kU8, bytes));
  return cuda::rgb8_to_image_bf16(bytes.data_as<uint8_t>(), image.numel(), image.data(), stream());
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
