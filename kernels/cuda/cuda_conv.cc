// CudaBackend's convolutions through cuDNN (NHWC): PyTorch's convolution then bias add at
// lossless (the resnet's bias and shortcut adds in one pass), the bias (and the shortcut add) in
// cuDNN's epilogue at quality=high; the VAE encoder's stride-2 downsampling (zero padding, cuDNN).
// Tested by tests/cuda/op_cases.cc, backend_ops_test.cc (the fused bias bound) and the VAE goldens.
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_checks.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/image_ops.h"

namespace flux2 {
namespace {

using cuda::check_bf16;

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

template <typename Separate>
absl::Status CudaBackend::conv2d_fused(const Tensor& x, const Tensor& w, const Tensor& bias,
                                       const Tensor* residual, const Tensor& out,
                                       Separate separate) {
  FLUX_ASSIGN_OR_RETURN(const bool fuses,
                        conv_->fuses_bias(x.dim(0), x.dim(1), x.dim(2), w.dim(0), w.dim(1)));
  return run_path(
      cuda::CudaPath::kConvFusedBias, cuda::conv_fused_bias_unsupported(fuses),
      [&] {
        return conv_->run_fused_bias(x.data(), x.dim(0), x.dim(1), x.dim(2), w.data(), w.dim(0),
                                     w.dim(1), bias.data(), out.data(),
                                     residual != nullptr ? residual->data() : nullptr);
      },
      separate);
}

absl::Status CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Tensor& out) {
  OpProfileScope profile(*this, op_category("conv", by_shape() ? conv_shape(x, w) : ""));
  FLUX_RETURN_IF_ERROR(check_conv2d(x, w, bias, out));
  auto separate = [&] { return conv_unfused(x, w, bias, out); };
  if (request().quality != Quality::kHigh) return separate();
  return conv2d_fused(x, w, bias, nullptr, out, separate);
}

absl::Status CudaBackend::conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                                     const Tensor& residual, const Tensor& out) {
  OpProfileScope profile(*this,
                         op_category("conv", by_shape() ? conv_shape(x, w, " +residual") : ""));
  FLUX_RETURN_IF_ERROR(check_conv2d(x, w, bias, out));
  FLUX_RETURN_IF_ERROR(cuda::check_same_bf16("conv2d_add", out, "residual", residual));
  if (!residual.contiguous()) return op_error("conv2d_add", "residual must be contiguous");
  auto separate = [&]() -> absl::Status {  // PyTorch's three roundings in three passes
    FLUX_RETURN_IF_ERROR(conv_unfused(x, w, bias, out));
    return add(residual, out, out);
  };
  if (request().quality == Quality::kHigh)
    return conv2d_fused(x, w, bias, &residual, out, separate);
  // Lossless: the same three roundings, the bias and the shortcut added in one pass.
  return run_path(
      cuda::CudaPath::kConvBiasResidual, "",
      [&]() -> absl::Status {
        FLUX_RETURN_IF_ERROR(conv_->convolve(x.data(), x.dim(0), x.dim(1), x.dim(2), w.data(),
                                             w.dim(0), w.dim(1), out.data()));
        // [H, W, C] tensors as [H·W, C] matrices, the bias [C] as one row.
        return cuda::bias_residual_fused(mat(out), mat(bias), mat(residual), mat(out), stream());
      },
      separate);
}

absl::Status CudaBackend::conv2d_downsample(const Tensor& x, const Tensor& w, const Tensor& bias,
                                            const Tensor& out) {
  OpProfileScope profile(*this, op_category("conv", by_shape() ? conv_shape(x, w, " s2") : ""));
  constexpr absl::string_view kOp = "conv2d_downsample";
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "w", w));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "bias", bias));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "out", out));
  if (x.rank() != 3 || w.rank() != 4 || out.rank() != 3 || !x.contiguous() || !out.contiguous() ||
      w.dim(1) != 3 || w.dim(2) != 3 || w.dim(3) != x.dim(2) || x.dim(0) % 2 || x.dim(1) % 2 ||
      out.dim(0) != x.dim(0) / 2 || out.dim(1) != x.dim(1) / 2 || out.dim(2) != w.dim(0) ||
      bias.numel() != w.dim(0)) {
    return op_error(kOp, absl::StrCat("shapes do not match: x ", x.describe(), ", w ", w.describe(),
                                      ", out ", out.describe()));
  }
  // F.pad(x, (0, 1, 0, 1)) as PyTorch does it, then the unpadded stride-2 convolution.
  const int64_t height = x.dim(0), width = x.dim(1), c = x.dim(2);
  FLUX_ASSIGN_OR_RETURN(Tensor padded, scratch({height + 1, width + 1, c}));
  FLUX_RETURN_IF_ERROR(
      cuda::pad_bottom_right_bf16(x.data(), height, width, c, padded.data(), stream()));
  return conv_->run(padded.data(), height + 1, width + 1, c, w.data(), w.dim(0), 3, bias.data(),
                    out.data(), /*stride=*/2);
}

}  // namespace flux2
